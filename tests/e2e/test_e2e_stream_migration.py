"""A planned promotion with a long stream in flight on real simulated hosts: the old active's
drain is bounded by streamMigrationAfterMs, so the sleep comes while the stream still runs and
the engine ends it with `finish_reason: "abort"` (which the proxy continues on the new active)
instead of the promotion waiting for the whole answer."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from fleets.models import Domain, Event, ModelBinding
from fleets.services.operations import operation_request
from tests.e2e.harness import SimHost, put_in_standby_posture, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

# A 600-token answer at 100 ms a token: a minute, far past the bound and the step's budget.
LONG_REPLY = " ".join(f"word{i}" for i in range(600))
MODEL = "llama-small"


def slow_host(name: str, tmp_path, **kwargs) -> SimHost:
    host = SimHost(name, tmp_path, **kwargs)
    # A whole drain would wait two minutes for the stream: only the bound can end it sooner.
    host.config["drainBudgetMs"] = 120_000
    for slot in host.config["slots"]:
        for model in slot.get("models", []):
            if model["name"] == MODEL:
                extra = model["profile"]["extraArgs"]
                extra += ["--token-delay-ms", "100", "--reply", LONG_REPLY]
    (host.dir / "config.json").write_text(json.dumps(host.config, indent=1))
    return host


def stream(url: str, into: dict) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "tell me everything"}],
        "max_tokens": 600,
        "stream": True,
    }
    tokens = 0
    try:
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", json=body, timeout=120, trust_env=False
        ) as answer:
            for line in answer.iter_lines():
                if not line.startswith("data: {"):
                    continue
                choice = json.loads(line.removeprefix("data: "))["choices"][0]
                if choice["delta"].get("content"):
                    tokens += 1
                    into["tokens"] = tokens
                if choice.get("finish_reason"):
                    into["finish_reason"] = choice["finish_reason"]
    except httpx.HTTPError as exc:  # a cut: the assertions below say what was expected
        into["error"] = repr(exc)


def test_a_planned_promotion_moves_a_long_stream_instead_of_waiting_for_it(
    tmp_path, make_fleet, drive
):
    east = slow_host("east", tmp_path)
    west = slow_host("west", tmp_path, start_asleep=True)  # the same answers: golden probes
    try:
        east.start()
        west.start()
        put_in_standby_posture(west)
        # The sleep step's budget alone would not bound the drain (budgetMs): the bound does.
        fleet = make_fleet(east, west, {"streamMigrationAfterMs": 1000, "sleepTimeoutMs": 60_000})
        # The layout of the launcher's hosts names no engine; these are the sim engine's.
        ModelBinding.objects.filter(domain__fleet=fleet).update(profile={"engine": "sim"})
        drive(fleet, lambda: all(d.last_seen_at for d in Domain.objects.filter(fleet=fleet)))

        seen: dict = {}
        reader = threading.Thread(
            target=stream, args=(f"http://127.0.0.1:{east.model_ports[MODEL]}", seen)
        )
        reader.start()
        wait_for(lambda: seen.get("tokens", 0) >= 3, 10, "the long stream running")

        target = Domain.objects.get(fleet=fleet, slug="west")
        op = operation_request(fleet=fleet, kind="promote", target_domain_id=target.id).operation

        def finished():
            op.refresh_from_db()
            return op if op.state not in ("pending", "running") else None

        drive(fleet, finished, timeout=40)
        reader.join(30)
        assert op.state == "succeeded", op.error
        # The sleep came while the stream ran: the engine aborted it, well before its end.
        assert seen["finish_reason"] == "abort"
        assert seen["tokens"] < 600
        slept = Event.objects.get(operation=op, kind="operation.step.done", step="demote_old_sleep")
        assert slept.data["drainBoundMs"] == 1000
        assert "the caller bounds the drain at 1000 ms" in east.log()
        assert set(east.asleep().values()) == {True}
    finally:
        east.crash()
        west.crash()
