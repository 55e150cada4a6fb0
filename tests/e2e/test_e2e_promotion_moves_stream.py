"""A planned promotion through the API with a long stream in flight through the proxy.

With the policy's default `streamMigrationAfterMs` (0) the promotion does not wait for the answer:
the old active's sleep aborts the stream at once after the switch, the proxy continues it on
the new active from the token ids it kept, and the client reads one whole answer equal to an
uninterrupted one. With the migration off (null) the same promotion drains: it waits for the
whole answer, so the first test fails if the bound is not what ends the wait.

Real processes: two simulated hosts whose engines generate the answer from the prompt's token
ids (`--generate`), and `manage.py serve` with its reconcile loop. The answer is 600 tokens
50 ms apart (30 s): several times a whole promotion, the shape of the issue's 60 s stream.
"""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime

import httpx
import pytest

from haru.local.streams import faults, parse_sse, read_events
from tests.e2e.harness import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

MODEL = "llama-small"
TOKENS = 600
DELAY_MS = 50
ENGINE_ARGS = ("--generate", "--reemit-split-prompt", "--token-delay-ms", str(DELAY_MS))
# The sleep step's budget must not be what bounds the drain (a 30 s answer must fit in it):
# only streamMigrationAfterMs may end the drain early. The hosts' own drain budget (30 s by
# default) is longer than the answer too.
POLICY = {"autoFailover": False, "sleepTimeoutMs": 60_000}
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "tell me a long story about harbours"}],
    "max_tokens": TOKENS,
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True},
}


class Reader(threading.Thread):
    """Read one streamed answer through the proxy as raw SSE (so `[DONE]` is counted)."""

    def __init__(self, server) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.raw = b""
        self.chunks = 0
        self.error = ""
        self.ended_at: float | None = None

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.server.api_token}", "X-Haru-Fleet": "e2e"}
        try:
            with httpx.stream(
                "POST",
                f"{self.server.url}/v1/chat/completions",
                json=BODY,
                headers=headers,
                timeout=120,
                trust_env=False,
            ) as answer:
                for piece in answer.iter_bytes():
                    self.raw += piece
                    self.chunks += piece.count(b"\n\n")
        except httpx.HTTPError as exc:  # a cut: faults() reports it
            self.error = f"{type(exc).__name__}: {exc}"
        self.ended_at = time.time()

    def seen(self):
        events, done = parse_sse(self.raw)
        seen = read_events(events, done=done)
        seen.error = self.error
        return seen


def promote_to_west(server) -> str:
    fleet = server.api("GET", "/fleets/e2e").json()
    target = next(d["id"] for d in fleet["domains"] if d["slug"] == "west")
    accepted = server.api("POST", "/fleets/e2e/promote", {"targetDomainId": target})
    assert accepted.status_code == 202, accepted.text
    return accepted.json()["operation"]["id"]


def operation(server, op_id: str) -> dict:
    return server.api("GET", f"/operations/{op_id}").json()


def ended(server, op_id: str) -> dict | None:
    op = operation(server, op_id)
    return op if op["state"] not in ("pending", "running") else None


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def continued_total(server) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10, trust_env=False).text
    found = re.findall(r"^haru_proxy_streams_continued_total\{[^}]*\} (\S+)$", text, re.M)
    return sum(float(v) for v in found)


def start_long_stream(server) -> Reader:
    reader = Reader(server)
    reader.start()
    wait_for(lambda: reader.chunks >= 10, 20, "the long stream running on east")
    return reader


def test_a_planned_promotion_ends_while_a_long_stream_runs_and_the_stream_continues_whole(
    served,
):
    east, west, server = served(
        policy=POLICY,
        engine="sim",
        east={"engine_args": ENGINE_ARGS},
        west={"engine_args": ENGINE_ARGS},
    )
    # The counter's files outlive a test's server (one metrics directory for the session):
    # what this test continued is the growth from here.
    before = continued_total(server)
    reader = start_long_stream(server)
    op_id = promote_to_west(server)

    op = wait_for(lambda: ended(server, op_id), 40, "the promotion")
    assert op["state"] == "succeeded", op["error"]
    # The promotion ended while the answer still streamed: it did not wait for it (its length
    # is a promotion's; loose here, a shared machine can be slow).
    assert reader.is_alive() and reader.chunks < TOKENS, reader.chunks
    assert "the caller bounds the drain at 0 ms" in east.log()  # the policy's default

    # An uninterrupted run of the same request, now on west, for the byte-for-byte comparison.
    baseline = Reader(server)
    baseline.start()
    reader.join(90)
    baseline.join(90)
    assert not reader.is_alive() and not baseline.is_alive()
    base = baseline.seen()
    assert faults(base, chat=True, asked_ids=False) == [], baseline.raw[-400:]
    assert base.finish_reasons == ["length"] and base.usages[0]["completion_tokens"] == TOKENS
    # One id, one created, one role chunk, one finish_reason, one [DONE], usage once, and the
    # text byte-identical to the uninterrupted answer.
    assert faults(reader.seen(), base, chat=True, asked_ids=False) == []
    assert reader.ended_at is not None and reader.ended_at > epoch(op["finishedAt"])

    wait_for(lambda: continued_total(server) - before == 1, 10, "the continued stream counted")
    wait_for(lambda: operation(server, op_id)["streamsContinued"] == 1, 10, "streamsContinued of 1")


def test_with_stream_migration_off_a_planned_promotion_waits_for_the_long_stream(served):
    east, west, server = served(
        policy={**POLICY, "streamMigrationAfterMs": None},
        engine="sim",
        east={"engine_args": ENGINE_ARGS},
        west={"engine_args": ENGINE_ARGS},
    )
    before = continued_total(server)
    reader = start_long_stream(server)
    op_id = promote_to_west(server)

    op = wait_for(lambda: ended(server, op_id), 60, "the promotion")
    reader.join(30)
    assert op["state"] == "succeeded", op["error"]
    seen = reader.seen()
    # The drain let the answer finish where it ran: whole, never aborted nor continued.
    assert faults(seen, chat=True, asked_ids=False) == []
    assert seen.finish_reasons == ["length"]
    assert reader.ended_at is not None and reader.ended_at <= epoch(op["finishedAt"])
    assert "bounds the drain" not in east.log()
    assert continued_total(server) == before
    assert operation(server, op_id)["streamsContinued"] == 0
