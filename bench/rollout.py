"""Rollouts under load: detection and rollback of a bad candidate, and a rollout that succeeds.

    .venv/bin/python bench/rollout.py [--rate 20] [--slowdown 2] [--ttft-ms 40]
                                      [--dwell-s 5] [--window-s 30] [--min-samples 20]
                                      [--runs slow,wrong,succeed,empty_arm,failing_arm] [--json]

The stack of bench/failover_load.py: two simulated hosts (supervisor, two sim engines and a
trainer each) and `manage.py serve` (the chat proxy with its per-arm stats and the in-process
reconcile loop). Clients send non-streamed chat requests to `qwen-small` through the proxy at
`--rate` requests per second (open loop), each with an `x-session-id` of one of 1,000 users
(the rollouts' sticky header), no retries. Every engine answers after `--ttft-ms`. Runs, each a
rollout asked of the API as an operator does (in-place swaps):

a. slow: the candidate profile answers `--slowdown` times later (the sim's `--ttft-ms`), steps
   10 % then 50 %, gates with `--min-samples` and `--window-s` (TTFT p95 ratio 1.5).
   Detection: from the candidate's first step (its first weight) to the gate's breach
   (`progress.breachAt`); rollback: the breach to weight 0 (`breachToWeightChangeMs`).
b. wrong: the candidate answers like the stable arm (a same-weights rollout), passes its checks,
   then during its first step (10 %) starts answering wrongly (the sim's `answerWrong` fault):
   the checks the next step runs before its weight is set fail. Counted: users' answers that
   were wrong (the candidate's) for requests sent after the check failed (the target is 0), and
   for information those sent between the fault and the check (the step's share, until its
   dwell ends: the checks run once per step).
c. succeed: steps 1, 5, 25, 50 % (`--dwell-s` each), then 100 (the planned promotion); both
   domains end on the new profile. The fleet's readiness verdict is polled all along
   (`not_ready` must never be read).
d. empty arm: a split to the standby while it sleeps (its arm has no server that can serve),
   at 50 %, for `--empty-s` seconds;
e. failing arm: a rollout at 50 % whose candidate server crashes mid-step.
   In d and e, requests answered 503 are the split's (`split_503s`, the target is 0).

Every request of every run is counted (`requests`, `failed_requests`: anything but a 200).
`--runs` makes some of the runs only (the figures of the others are null). With `--json` the
last line is one JSON object with the figures. A whole run takes about 3 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.failover_load import POLICY, Stack  # noqa: E402 - after the path above
from haru.local.layouts import fleet_layout  # noqa: E402
from haru.local.processes import wait_for  # noqa: E402
from haru.local.supervisors import TOKEN, put_in_standby_posture  # noqa: E402

MODEL = "qwen-small"
USERS = 1000
STICKY = "x-session-id"
# The sim's answers once its `answerWrong` fault is on (supervisor/sim/engine.py).
WRONG_MARK = "Drifted after wake"
FINAL = ("succeeded", "rolled_back", "aborted", "failed")
RUNS = ("slow", "wrong", "succeed", "empty_arm", "failing_arm")


@dataclass
class Req:
    started: float
    ended: float
    status: int  # 0: no answer (a transport error)
    wrong: bool = False


class Load:
    """Requests at a fixed rate (open loop) through the proxy, each recorded."""

    def __init__(self, stack: Stack, rate: float) -> None:
        self.url = f"{stack.server.url}/v1/chat/completions"
        self.token = stack.server.api_token
        self.rate = rate
        self.records: list[Req] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=32)
        self._client = httpx.Client(
            timeout=httpx.Timeout(60, connect=10),
            trust_env=False,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        )
        self._thread = threading.Thread(target=self._pace, daemon=True)
        self._users = itertools.cycle(range(USERS))

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._pool.shutdown(wait=True)
        self._client.close()

    def between(self, t0: float, t1: float) -> list[Req]:
        with self._lock:
            return [r for r in self.records if t0 <= r.started < t1]

    def _pace(self) -> None:
        period = 1 / self.rate
        due = time.monotonic()
        while not self._stop.is_set():
            self._pool.submit(self._one, next(self._users))
            due += period
            time.sleep(max(0.0, due - time.monotonic()))

    def _one(self, user: int) -> None:
        started = time.time()
        status, wrong = 0, False
        try:
            answer = self._client.post(
                self.url,
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"user {user} asks"}],
                    "max_tokens": 16,
                },
                headers={
                    "Authorization": f"Bearer {self.token}",
                    "X-Haru-Fleet": "e2e",
                    STICKY: f"user-{user}",
                },
            )
            status = answer.status_code
            if status == 200:
                wrong = WRONG_MARK in answer.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            status = 0
        with self._lock:
            self.records.append(Req(started, time.time(), status, wrong))


def start_stack(stack: Stack) -> None:
    """Stack.start, with each binding's profile the one its host runs: a rollout swaps back to
    the layout's profile when it rolls back."""
    for host in stack.hosts.values():
        host.start()
    put_in_standby_posture(stack.hosts["west"])
    layout = fleet_layout(stack.hosts["east"], stack.hosts["west"], POLICY_RUN)
    for domain in layout["domains"]:
        host = stack.hosts[domain["slug"]]
        # Without the sim's `--start-asleep`: a real engine's profile does not say it, and a
        # restored server must come up answering its probe (the rollback sleeps it after).
        models: list[dict[str, Any]] = host.config["slots"][0]["models"]  # type: ignore[index]
        profiles = {
            m["name"]: {
                **m["profile"],
                "extraArgs": [a for a in m["profile"]["extraArgs"] if a != "--start-asleep"],
            }
            for m in models
        }
        for binding in domain["slots"][0]["models"]:
            binding["profile"] = profiles[binding["name"]]
    path = stack.workdir / "layout.json"
    path.write_text(json.dumps(layout))
    stack.server.manage("migrate", "--noinput", "-v0")
    stack.server.manage("seed_layout", "--config", str(path))
    # Loopback only: the port was found free on 127.0.0.1, and another process may listen on it
    # on another local address, which a bind to 0.0.0.0 would collide with.
    stack.server.start("--host", "127.0.0.1")
    os.environ["HARU_VAR_DIR"] = stack.server.env["HARU_VAR_DIR"]
    os.environ["HARU_SUPERVISOR_TOKEN"] = TOKEN
    os.environ["DJANGO_SETTINGS_MODULE"] = "haru.settings"
    import django  # noqa: PLC0415 - after the environment names the server's store

    django.setup()


# Operator-driven apart from the rollouts: no failover of its own during the runs.
POLICY_RUN = {**POLICY, "autoFailover": False}


class Bench:
    def __init__(self, args, workdir: Path) -> None:
        self.args = args
        self.stack = Stack(workdir, engine_args=("--ttft-ms", str(args.ttft_ms)))
        self.load: Load | None = None
        self.verdicts: list[str] = []
        self._poll_stop = threading.Event()

    # -- helpers ------------------------------------------------------------------------------

    def profile(self, *, ttft_ms: int, slug: str) -> dict[str, Any]:
        """The candidate profile: the host's own, awake, answering after `ttft_ms`."""
        models: list[dict[str, Any]] = self.stack.hosts[slug].config["slots"][0]["models"]  # type: ignore[index]
        args = next(m["profile"]["extraArgs"] for m in models if m["name"] == MODEL)
        kept: list[str] = []
        skip = False
        for a in args:
            if skip:
                skip = False
                continue
            if a == "--ttft-ms":
                skip = True
                continue
            if a != "--start-asleep":
                kept.append(a)
        return {"engine": "sim", "extraArgs": [*kept, "--ttft-ms", str(ttft_ms)]}

    def calm(self) -> bool:
        from fleets.models import Rollout  # noqa: PLC0415 - needs django.setup() first

        if Rollout.objects.filter(fleet=self.stack.fleet()).exclude(state__in=FINAL).exists():
            return False
        return self.stack.calm()

    def create(self, body: dict[str, Any]) -> str:
        wait_for(self.calm, 180, "a calm fleet", every=0.2)
        answer = self.stack.api("POST", "/fleets/e2e/rollouts", body)
        if answer.status_code != 202:
            raise SystemExit(f"the rollout was refused: {answer.status_code} {answer.text}")
        return answer.json()["id"]

    def rollout(self, rollout_id: str):
        from fleets.models import Rollout  # noqa: PLC0415 - needs django.setup() first

        return Rollout.objects.get(pk=rollout_id)

    def wait_state(self, rollout_id: str, states: tuple[str, ...], timeout: float):
        return wait_for(
            lambda: (r := self.rollout(rollout_id)).state in states and r,
            timeout,
            f"the rollout {', '.join(states)}",
            every=0.1,
        )

    def wait_end(self, rollout_id: str, timeout: float = 240):
        return self.wait_state(rollout_id, FINAL, timeout)

    def first_weight_at(self, rollout_id: str) -> float:
        from fleets.models import Event  # noqa: PLC0415 - needs django.setup() first

        stepped = Event.objects.filter(kind="rollout.stepped", data__rolloutId=rollout_id)
        event = stepped.filter(data__step=0).order_by("id").first()
        if event is None:
            raise SystemExit(f"no first step recorded for rollout {rollout_id}")
        return event.created_at.timestamp()

    def candidate_url(self, rollout_id: str) -> str:
        from fleets.models import ModelBinding  # noqa: PLC0415 - needs django.setup() first

        domain_id = self.rollout(rollout_id).candidate_domain_id
        return ModelBinding.objects.get(domain_id=domain_id, name=MODEL).serving_url

    def gates(self) -> dict[str, Any]:
        a = self.args
        return {
            "maxErrorRateDelta": 0.01,
            "ttftP95Ratio": 1.5,
            "itlP95Ratio": 1.5,
            "minSamples": a.min_samples,
            "windowS": a.window_s,
        }

    def _poll_readiness(self) -> None:
        while not self._poll_stop.is_set():
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                answer = self.stack.api("GET", "/fleets/e2e")
                self.verdicts.append(answer.json()["failoverReadiness"]["verdict"])
            self._poll_stop.wait(0.5)

    # -- the runs -----------------------------------------------------------------------------

    def slow(self) -> dict[str, Any]:
        _, standby = self.stack.roles()
        slow_ms = round(self.args.ttft_ms * self.args.slowdown)
        rid = self.create(
            {
                "model": MODEL,
                "candidate": {
                    "kind": "same-weights",
                    "profile": self.profile(ttft_ms=slow_ms, slug=standby),
                },
                "swapMode": "in-place",
                "steps": [
                    {"weight": 10, "dwellS": 60},
                    {"weight": 50, "dwellS": 60},
                    {"weight": 100},
                ],
                "gates": self.gates(),
                "stickyHeader": STICKY,
                "reason": "bench: a candidate slower to first token",
            }
        )
        done = self.wait_end(rid)
        progress = done.progress or {}
        out: dict[str, Any] = {"state": done.state, "why": done.why}
        breach = progress.get("breachAt")
        if breach:
            first = self.first_weight_at(rid)
            out["detection_s"] = round(datetime.fromisoformat(breach).timestamp() - first, 2)
        ms = progress.get("breachToWeightChangeMs")
        out["rollback_s"] = None if ms is None else ms / 1000
        return out

    def wrong(self) -> dict[str, Any]:
        _, standby = self.stack.roles()
        rid = self.create(
            {
                "model": MODEL,
                "candidate": {
                    "kind": "same-weights",
                    "profile": self.profile(ttft_ms=self.args.ttft_ms, slug=standby),
                },
                "swapMode": "in-place",
                "steps": [
                    {"weight": 10, "dwellS": self.args.dwell_s},
                    {"weight": 50, "dwellS": 60},
                    {"weight": 100},
                ],
                "gates": self.gates(),
                "stickyHeader": STICKY,
                "reason": "bench: a candidate that goes wrong after a step",
            }
        )
        # The first step's checks passed: the candidate goes bad while it serves users.
        wait_for(
            lambda: (
                (r := self.rollout(rid)).state in FINAL
                or (r.step_index == 0 and (r.progress or {}).get("checkedStep") == 0)
            ),
            240,
            "the first step's checks",
            every=0.1,
        )
        httpx.post(
            f"{self.candidate_url(rid)}/_sim/faults",
            json={"answerWrong": True},
            timeout=5,
            trust_env=False,
        ).raise_for_status()
        faulted = time.time()
        done = self.wait_end(rid)
        progress = done.progress or {}
        out: dict[str, Any] = {"state": done.state, "why": done.why}
        breach = progress.get("breachAt")
        assert self.load is not None
        if breach:
            failed_at = datetime.fromisoformat(breach).timestamp()
            after = self.load.between(failed_at, time.time())
            out["user_requests_after_check"] = sum(r.wrong for r in after)
            out["wrong_before_check"] = sum(r.wrong for r in self.load.between(faulted, failed_at))
        else:
            out["user_requests_after_check"] = None
        return out

    def succeed(self) -> dict[str, Any]:
        from fleets.models import ModelBinding  # noqa: PLC0415 - needs django.setup() first

        _, standby = self.stack.roles()
        new = self.profile(ttft_ms=self.args.ttft_ms, slug=standby)
        dwell = self.args.dwell_s
        poller = threading.Thread(target=self._poll_readiness, daemon=True)
        poller.start()
        rid = self.create(
            {
                "model": MODEL,
                "candidate": {"kind": "same-weights", "profile": new},
                "swapMode": "in-place",
                "steps": [
                    *({"weight": w, "dwellS": dwell} for w in (1, 5, 25, 50)),
                    {"weight": 100},
                ],
                # Few samples at 1 %: the window must hold the step's.
                "gates": {**self.gates(), "minSamples": 5, "windowS": 60},
                "stickyHeader": STICKY,
                "reason": "bench: a rollout that succeeds",
            }
        )
        started = time.time()
        done = self.wait_end(rid, timeout=400)
        self._poll_stop.set()
        poller.join(5)
        bindings = ModelBinding.objects.filter(domain__fleet=self.stack.fleet(), name=MODEL)
        # Both domains on the new version: the sim's flags (its extra args) the candidate's.
        on_new = [b.profile.get("extraArgs") == new["extraArgs"] for b in bindings]
        return {
            "state": done.state,
            "why": done.why,
            "s": round(time.time() - started, 1),
            "both_on_new_version": len(on_new) == 2 and all(on_new),
            "readiness_polls": len(self.verdicts),
            "readiness_not_ready": self.verdicts.count("not_ready"),
            "readiness_seen": sorted(set(self.verdicts)),
        }

    def empty_arm(self) -> dict[str, Any]:
        from fleets.core.route_split import Split  # noqa: PLC0415 - needs django.setup() first
        from fleets.models import Domain, Fleet  # noqa: PLC0415
        from fleets.services.route_splits import route_split_set  # noqa: PLC0415

        wait_for(self.calm, 180, "a calm fleet", every=0.2)
        _, standby = self.stack.roles()
        fleet = self.stack.fleet()
        target = Domain.objects.get(fleet=fleet, slug=standby)
        split = Split(
            rollout_id=str(uuid.uuid4()),
            candidate_domain_id=str(target.id),
            weight_permille=500,
            sticky_header=STICKY,
        )
        revision = route_split_set(
            fleet_id=fleet.id,
            model=MODEL,
            split=split,
            expected_revision=fleet.route_revision,
            actor="bench",
            reason="bench: a split whose candidate arm is empty (asleep)",
        )
        if revision is None:
            raise SystemExit("the empty-arm split was not set")
        t0 = time.time()
        time.sleep(self.args.empty_s)
        t1 = time.time()
        revision = Fleet.objects.get(pk=fleet.id).route_revision
        route_split_set(
            fleet_id=fleet.id,
            model=MODEL,
            split=None,
            expected_revision=revision,
            actor="bench",
            reason="bench: the empty-arm run ends",
        )
        assert self.load is not None
        reqs = self.load.between(t0, t1)
        return {"requests": len(reqs), "503s": sum(r.status == 503 for r in reqs)}

    def failing_arm(self) -> dict[str, Any]:
        _, standby = self.stack.roles()
        rid = self.create(
            {
                "model": MODEL,
                "candidate": {
                    "kind": "same-weights",
                    "profile": self.profile(ttft_ms=self.args.ttft_ms, slug=standby),
                },
                "swapMode": "in-place",
                "steps": [{"weight": 50, "dwellS": 120}, {"weight": 100}],
                "gates": self.gates(),
                "stickyHeader": STICKY,
                "reason": "bench: a candidate that fails mid-step",
            }
        )
        self.wait_state(rid, ("stepping", *FINAL), 240)
        time.sleep(2)  # the candidate takes its share
        t0 = time.time()
        with contextlib.suppress(httpx.HTTPError):  # the crash cuts the answer
            httpx.post(
                f"{self.candidate_url(rid)}/_sim/faults",
                json={"crash": True},
                timeout=5,
                trust_env=False,
            )
        done = self.wait_end(rid)
        time.sleep(2)
        assert self.load is not None
        reqs = self.load.between(t0, time.time())
        return {
            "state": done.state,
            "why": done.why,
            "requests": len(reqs),
            "503s": sum(r.status == 503 for r in reqs),
        }

    # -- all of it ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        a = self.args
        out: dict[str, Any] = {"rate_rps": a.rate, "slowdown": a.slowdown, "ttft_ms": a.ttft_ms}
        try:
            start_stack(self.stack)
            wait_for(self.calm, 180, "a calm fleet", every=0.2)
            self.load = Load(self.stack, a.rate).start()
            t0 = time.time()
            runs: dict[str, Any] = {}
            every = {
                "slow": self.slow,
                "wrong": self.wrong,
                "succeed": self.succeed,
                "empty_arm": self.empty_arm,
                "failing_arm": self.failing_arm,
            }
            for name, step in every.items():
                if name not in a.runs:
                    continue
                started = time.time()
                runs[name] = step()
                print(f"{name:12s} {time.time() - started:6.1f} s  {runs[name]}", flush=True)
            time.sleep(1)
            self.load.stop()
            reqs = self.load.between(t0, time.time())
        finally:
            if self.load is not None:
                self.load.stop()
            self.stack.server.kill(signal.SIGTERM)
            for host in self.stack.hosts.values():
                host.crash()
        out["runs"] = runs
        slow, wrong = runs.get("slow", {}), runs.get("wrong", {})
        succeed = runs.get("succeed")
        out["slow_detection_s"] = slow.get("detection_s")
        out["slow_rollback_s"] = slow.get("rollback_s")
        out["wrong_answer_user_requests"] = wrong.get("user_requests_after_check")
        out["succeeded"] = (
            None
            if succeed is None
            else bool(succeed["state"] == "succeeded" and succeed["both_on_new_version"])
        )
        out["readiness_not_ready"] = None if succeed is None else succeed["readiness_not_ready"]
        split = [runs[n]["503s"] for n in ("empty_arm", "failing_arm") if n in runs]
        out["split_503s"] = sum(split) if split else None
        out["requests"] = len(reqs)
        out["failed_requests"] = sum(r.status != 200 for r in reqs)
        out["errors"] = sorted({r.status for r in reqs if r.status != 200})
        # Each run's targets (issue 25), over the runs made.
        met = [out["failed_requests"] == 0]
        if "slow" in runs:
            met += [
                out["slow_detection_s"] is not None and out["slow_detection_s"] <= 30,
                out["slow_rollback_s"] is not None and out["slow_rollback_s"] <= 1,
            ]
        if "wrong" in runs:
            met.append(out["wrong_answer_user_requests"] == 0)
        if succeed is not None:
            met += [bool(out["succeeded"]), out["readiness_not_ready"] == 0]
        if split:
            met.append(out["split_503s"] == 0)
        out["targets_met"] = all(met)
        return out


def report(out: dict[str, Any]) -> None:
    runs = out["runs"]
    lines = [
        f"\n== rollouts at {out['rate_rps']} rps (every engine {out['ttft_ms']} ms to first token)"
    ]
    if "slow" in runs:
        lines.append(
            f"  slow candidate (x{out['slowdown']})  detection {out['slow_detection_s']} s "
            f"(target <= 30), breach to weight 0 {out['slow_rollback_s']} s (target <= 1); "
            f"{runs['slow']['state']}"
        )
    if "wrong" in runs:
        lines.append(
            "  wrong answers         user requests after the failed check "
            f"{out['wrong_answer_user_requests']} (target 0); wrong before it "
            f"{runs['wrong'].get('wrong_before_check')}; {runs['wrong']['state']}"
        )
    if "succeed" in runs:
        run = runs["succeed"]
        lines.append(
            f"  succeeding rollout    {run['state']} in {run['s']} s, both on the new version: "
            f"{run['both_on_new_version']}; readiness {run['readiness_seen']}, not_ready "
            f"{out['readiness_not_ready']} of {run['readiness_polls']} polls"
        )
    for name in ("empty_arm", "failing_arm"):
        if name in runs:
            run = runs[name]
            lines.append(
                f"  {name.replace('_', ' '):20s}  503s {run['503s']} of {run['requests']} "
                f"(target 0){'; ' + run['state'] if 'state' in run else ''}"
            )
    lines += [
        f"  requests              {out['requests']}, failed {out['failed_requests']} "
        f"{out['errors']}",
        f"  targets met           {'yes' if out['targets_met'] else 'no'}",
    ]
    print("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--slowdown", type=float, default=2.0, help="the slow candidate's factor")
    parser.add_argument(
        "--ttft-ms", type=int, default=40, help="every engine's time to first token"
    )
    parser.add_argument("--dwell-s", type=int, default=5, help="each step's dwell (at least 5)")
    parser.add_argument("--window-s", type=int, default=30, help="the gates' window (at least 5)")
    parser.add_argument("--min-samples", type=int, default=20, help="the gates' minimum samples")
    parser.add_argument("--empty-s", type=float, default=8.0, help="the empty-arm run's length")
    parser.add_argument(
        "--runs", default=",".join(RUNS), help=f"which runs, comma-separated ({', '.join(RUNS)})"
    )
    parser.add_argument("--json", action="store_true", help="the last line is the figures")
    args = parser.parse_args()
    args.runs = [r for r in args.runs.split(",") if r]
    if not args.runs or set(args.runs) - set(RUNS):
        parser.error(f"--runs: choose among {', '.join(RUNS)}")
    if args.rate <= 0 or args.slowdown <= 0 or args.dwell_s < 5 or args.window_s < 5:
        parser.error("--rate and --slowdown must be positive, --dwell-s and --window-s 5 or more")
    for key in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(key, None)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    workdir = Path(tempfile.mkdtemp(prefix="haru-bench-rollout-"))
    out = Bench(args, workdir).run()
    report(out)
    print(f"\nstack kept in {workdir}")
    if args.json:
        print(json.dumps(out))
    return 0 if out["targets_met"] else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
