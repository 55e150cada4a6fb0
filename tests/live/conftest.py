"""The channel layer every live test runs on: in-memory, then channels_redis (with REDIS_URL)."""

from __future__ import annotations

import os
import uuid

import pytest
from channels.layers import get_channel_layer


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def channel_layer(request, settings):
    """Configure the layer for this test and return it."""

    if request.param == "memory":
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    else:
        settings.CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "channels_redis.core.RedisChannelLayer",
                # A prefix per test: parallel runs on the same Redis never see each other.
                "CONFIG": {
                    "hosts": [os.environ["REDIS_URL"]],
                    "prefix": f"haru-test-{uuid.uuid4().hex[:10]}",
                },
            }
        }
    return get_channel_layer()
