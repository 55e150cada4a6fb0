"""A stream on a split's candidate arm, cut by its engine dying, continues where routing
points now: on the stable arm at once (the dead candidate is refused, then skipped).

Real simulated engines, as test_proxy_continuation_sim.py: the candidate (west) is killed
mid-stream; the client gets the same bytes an uninterrupted stream would have given.
"""

from __future__ import annotations

import httpx
import pytest
from asgiref.sync import sync_to_async

from fleets.core.arm_stats import Arm
from fleets.proxy import arm_stats
from fleets.reads.arm_stats import arm_windows
from tests.proxy.conftest import CHAT
from tests.proxy.test_proxy_continuation_sim import sims, stop, unstamped  # noqa: F401 - fixture
from tests.proxy.test_proxy_split import ROLLOUT, _epoch, recorder, split_set  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


async def test_a_cut_candidate_stream_continues_on_the_stable_arm(
    haru,
    sims,  # noqa: F811 - the imported fixture
    hold_settings,
    recorder,  # noqa: F811 - the imported fixture
):
    await sync_to_async(split_set)(sims["fleet"], 1000)
    request = {
        "model": "qwen-small",
        "messages": [{"role": "user", "content": "Tell más"}],
        "stream": True,
        "max_tokens": 300,
    }
    async with httpx.AsyncClient(base_url=sims["urls"]["east"], timeout=30) as direct:
        expected = (await direct.post(CHAT, json=request)).content

    got = b""
    async with haru.stream("POST", CHAT, json=request) as response:
        async for chunk in response.aiter_raw():
            got += chunk
            if got.count(b"data: ") == 40 and sims["west"].poll() is None:
                stop(sims["west"])  # the candidate's engine dies mid-answer

    assert sims["west"].poll() is not None  # the cut happened on the candidate
    assert unstamped(got) == unstamped(expected)
    assert arm_stats.RECORDER is recorder
    await sync_to_async(recorder.flush)()
    windows = await sync_to_async(arm_windows)(
        rollout_id=ROLLOUT, model="qwen-small", since=_epoch()
    )
    # The continuation's attempt on the dead candidate counts as its error; the request ended
    # well on the stable arm.
    assert windows[Arm.CANDIDATE].errors == 1
    assert (windows[Arm.STABLE].requests, windows[Arm.STABLE].errors) == (1, 0)
