"""A worker that loses Redis while it holds an unacknowledged message keeps running.

Found by the fault suite's Redis outage: a worker holding a message (an ETA tick waiting in it)
with a BRPOP in flight on a second channel died with "Unrecoverable error: AttributeError
('NoneType' object has no attribute 'hostname')" from Celery's clean-up of the lost connection.
Here the same state is built on a real redis-server, which is then killed, and the clean-up
Celery runs on a lost connection is called on it.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from types import SimpleNamespace

import pytest
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Connection, Message, Queue

from haru.celery import app
from haru.celery_consumer import Consumer
from tests.fault.cluster import OwnRedis

pytestmark = [
    pytest.mark.fault,
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]


@pytest.fixture
def lost(tmp_path):
    """A connection holding one unacknowledged message (a task running with acks_late, or an
    ETA tick waiting), BRPOPs in flight, its Redis killed: `.connection` and `.message`."""
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
    return SimpleNamespace(connection=conn, message=held[0])


@pytest.fixture
def lost_connection(lost):
    return lost.connection


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


def _late_ack(consumer: CeleryConsumer, message: Message, errors: tuple) -> None:
    """Acknowledge `message` as a worker does when its task ends: through `call_soon_ack`, then
    run by the event loop, which lets any exception out (a hub's callbacks are not guarded)."""
    ready: list = []
    consumer.hub = SimpleNamespace(call_soon=ready.append)
    consumer.call_soon_ack(message.ack_log_error, logging.getLogger("test"), errors)
    for callback in ready:
        callback()


def test_celerys_late_ack_of_a_task_running_through_the_loss_raises(lost):
    # Issue 29: the task that ran while Redis was away ends after Celery dropped the connection.
    consumer = _consumer(CeleryConsumer, lost.connection)
    with contextlib.suppress(AttributeError):  # the clean-up's own failure (above)
        consumer.on_connection_error_after_connected(ConnectionError("lost"))
    with pytest.raises(AttributeError, match="hostname"):
        _late_ack(consumer, lost.message, lost.connection.connection_errors)


def test_the_late_ack_of_a_task_running_through_the_loss_leaves_the_worker_running(lost, caplog):
    consumer = _consumer(Consumer, lost.connection)
    consumer.on_connection_error_after_connected(ConnectionError("lost"))
    _late_ack(consumer, lost.message, lost.connection.connection_errors)
    assert "the ack of a task received before the broker connection was lost" in caplog.text
    assert not lost.message.acknowledged  # never sent: the broker redelivers it if it holds it


class _FailingAck(Message):
    def ack_log_error(self, *_args: object, **_kwargs: object) -> None:
        raise AttributeError("a defect of its own")


def test_an_ack_that_fails_on_a_live_connection_still_stops_the_worker(lost):
    # Only the dropped connection's failure is absorbed; any other is not hidden.
    consumer = _consumer(Consumer, lost.connection)
    message = _FailingAck(channel=lost.connection.default_channel, body=b"{}")
    with pytest.raises(AttributeError, match="a defect of its own"):
        _late_ack(consumer, message, ())
