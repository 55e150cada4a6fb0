"""A worker that loses Redis while it holds an unacknowledged message keeps running.

Found by the fault suite's Redis outage: a worker holding a message (an ETA tick waiting in it)
with a BRPOP in flight on a second channel died with "Unrecoverable error: AttributeError
('NoneType' object has no attribute 'hostname')" from Celery's clean-up of the lost connection.
Here the same state is built on a real redis-server, which is then killed, and the clean-up
Celery runs on a lost connection is called on it.
"""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Connection, Queue

from haru.celery import app
from haru.celery_consumer import Consumer
from tests.fault.cluster import OwnRedis

pytestmark = [
    pytest.mark.fault,
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]


@pytest.fixture
def lost_connection(tmp_path):
    """A connection holding one unacknowledged message, BRPOPs in flight, its Redis killed."""
    redis = OwnRedis(tmp_path).start()
    try:
        with Connection(redis.url) as producer:
            producer.SimpleQueue("held").put({"tick": 1})
        conn = Connection(redis.url)
        held: list = []
        conn.Consumer(queues=[Queue("held")], callbacks=[lambda _b, m: held.append(m)]).consume()
        # A second channel consuming too (Celery's worker has several): closing it on the dead
        # socket fails first, which is what leaves the held message to the second close.
        conn.Consumer(channel=conn.channel(), queues=[Queue("other")], callbacks=[]).consume()
        conn.drain_events(timeout=5)
        assert len(held) == 1  # received, never acknowledged
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=0.3)  # idle: a BRPOP now waits on every channel
    finally:
        redis.stop()
    return conn


def _consumer(cls: type[CeleryConsumer], connection: Connection) -> CeleryConsumer:
    # Only what the connection-loss clean-up reads (a worker's Consumer needs a whole worker).
    consumer = cls.__new__(cls)
    consumer.connection = connection
    consumer.app = app
    consumer.qos_global = False
    consumer.pool = SimpleNamespace(num_processes=1)
    consumer.prefetch_multiplier = 4
    return consumer


def test_celerys_own_clean_up_of_the_lost_connection_raises(lost_connection):
    # The failure the override exists for: if Celery or kombu fixes it, this says so.
    with pytest.raises(AttributeError, match="hostname"):
        _consumer(CeleryConsumer, lost_connection).on_connection_error_after_connected(
            ConnectionError("lost")
        )


def test_a_worker_that_loses_redis_holding_a_message_goes_on_to_reconnect(lost_connection, caplog):
    consumer = _consumer(Consumer, lost_connection)
    consumer.on_connection_error_after_connected(ConnectionError("lost"))
    assert consumer.connection is None  # dropped, for the consumer's restart to reconnect
    assert "the lost broker connection's clean-up failed" in caplog.text
