"""Stream continuation: long streams in flight when the active host's processes are killed.

    .venv/bin/python bench/failover_load.py --streams 200 [--tokens 300] [--token-delay-ms 100]
                                            [--client-processes 4] [-n 1] [--json]

The stack of bench/failover_load.py (two simulated hosts, `manage.py serve` with its reconcile
loop), whose simulated engines stream one token every `--token-delay-ms`. Per round:

1. The baseline: the `--streams` requests, all at once, uninterrupted, through the proxy.
2. The same requests again; once every stream has received a tenth of its tokens, every
   process of the active host is SIGKILLed (supervisor and model servers). The proxy holds the
   cut streams until routing commits to the standby, then continues each there.
3. Every stream is checked against its baseline (haru/local/streams.py): byte-identical text,
   the same finish_reason and usage, one `id`, one `created`, one role chunk, one
   finish_reason, usage once, no token-id field unless the client asked for ids, and where it
   asked (a quarter of the streams, `return_token_ids`) the same token ids.

Clients are the official OpenAI SDK (`AsyncOpenAI`, `max_retries=0`), one connection per
stream, spread over `--client-processes` processes; half chat, half completions, the two
models in turn, every stream its own prompt, `temperature` 0 and
`stream_options.include_usage`. Printed: streams, in flight at the kill,
cut (ended without their one finish_reason), failed (an error), byte-identical share, the
added stall p50/p99 (per stream, the last chunk before the cut to the first after it: the
wait between two chunks that spans the routing commit), where it goes (the wait already open
at the kill, the kill to the commit with the promotion's steps, the commit to the first
chunk), and, for comparison, detection + wake + probe of the promotion; with `--json` the last
line is one JSON object with those figures.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from openai import APIStatusError, AsyncOpenAI, DefaultAsyncHttpxClient

from bench.failover_load import POLICY, Stack, _demote_if_awake, op_figures, pct
from haru.local.processes import wait_for
from haru.local.streams import StreamSeen, faults, read_events, seam

MODELS = ("llama-small", "qwen-small")  # each host serves both, each on its own engine
FLEET = "e2e"
TOPICS = ("rivers", "lighthouses", "glaciers", "orchards", "comets", "harbours", "deserts")


@dataclass(frozen=True)
class Spec:
    """One stream's request: chat or completions, its own prompt, ids asked for or not."""

    index: int
    model: str
    chat: bool
    asks_ids: bool
    prompt: str
    max_tokens: int


@dataclass
class Outcome:
    spec: Spec
    seen: StreamSeen
    times: list[float] = field(default_factory=list)  # arrival of each chunk (time.time())


def specs(n: int, tokens: int) -> list[Spec]:
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        prompt = f"Stream {i}: tell a long story about {topic}, number {i * 7919 % 1000}."
        model = MODELS[i // 4 % len(MODELS)]
        chat, asks_ids = i % 2 == 0, i % 4 < 2
        out.append(Spec(i, model, chat, asks_ids, prompt=prompt, max_tokens=tokens))
    return out


def sdk(base_url: str, api_key: str, n: int) -> AsyncOpenAI:
    # One connection per stream (the SDK's default pool holds 100 at most).
    http = DefaultAsyncHttpxClient(
        limits=httpx2.Limits(max_connections=n + 8, max_keepalive_connections=n + 8),
        timeout=httpx2.Timeout(180, connect=30),
        trust_env=False,
    )
    return AsyncOpenAI(
        base_url=base_url,
        api_key=api_key,
        default_headers={"X-Haru-Fleet": FLEET},
        max_retries=0,
        http_client=http,
    )


async def one_stream(client: AsyncOpenAI, spec: Spec, progress: Progress) -> Outcome:
    """Run one streamed request with the SDK; record every chunk as the client received it."""
    events: list[dict[str, Any]] = []
    times: list[float] = []
    error = ""
    common: dict[str, Any] = {
        "model": spec.model,
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "extra_body": {"return_token_ids": True} if spec.asks_ids else None,
    }
    try:
        if spec.chat:
            messages = [{"role": "user", "content": spec.prompt}]
            stream: Any = await client.chat.completions.create(messages=messages, **common)
        else:
            stream = await client.completions.create(prompt=spec.prompt, **common)
        async for chunk in stream:
            times.append(time.time())  # as it came out of the SDK, before this run's own work
            events.append(chunk.model_dump(exclude_none=True))
            progress.chunks[spec.index] = len(events)
    except APIStatusError as exc:
        error = f"{exc.status_code} {type(exc).__name__}"
    except Exception as exc:  # noqa: BLE001 - every failure is a data point
        error = type(exc).__name__
    finally:
        progress.ended[spec.index] = 1
    seen = read_events(events)
    seen.error = error
    return Outcome(spec, seen, times)


@dataclass
class Progress:
    """Per stream (by its index), chunks received and whether it ended: shared memory, read
    by the process that decides when to kill the host."""

    chunks: Any
    ended: Any

    @classmethod
    def shared(cls, ctx: Any, n: int) -> Progress:
        return cls(ctx.Array("i", n, lock=False), ctx.Array("b", n, lock=False))


async def run_streams(client: AsyncOpenAI, todo: list[Spec], progress: Progress) -> list[Outcome]:
    """Run every stream at once."""
    return list(await asyncio.gather(*(one_stream(client, s, progress) for s in todo)))


def client_process(
    base_url: str, api_key: str, todo: list[Spec], progress: Progress, go: Any, out: Any
) -> None:
    """One client process's share of the streams: the baseline, then (once `go` is set) the
    same streams again for the cut run; each run's outcomes are put on `out`."""
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)

    async def both() -> None:
        client = sdk(base_url, api_key, len(todo))
        try:
            out.put(("base", await run_streams(client, todo, progress)))
            if await asyncio.to_thread(go.wait, 300):
                out.put(("cut", await run_streams(client, todo, progress)))
        finally:
            await client.close()

    asyncio.run(both())


def collect(out: Any, kind: str, n: int, workers: list[Any]) -> list[Outcome]:
    """The outcomes of `kind` from every one of the `n` client processes."""
    got: list[Outcome] = []
    for _ in range(n):
        try:
            seen, outcomes = out.get(timeout=300)
        except queue.Empty:
            dead = [w.exitcode for w in workers if not w.is_alive()]
            raise SystemExit(f"a client process sent no {kind} run (exit codes {dead})") from None
        assert seen == kind, (seen, kind)
        got += outcomes
    return sorted(got, key=lambda o: o.spec.index)


def wait_and_kill(
    todo: list[Spec], progress: Progress, kill_after: int, kill: Callable[[], None]
) -> dict[str, float]:
    """Once every stream has received `kill_after` chunks (or ended), call `kill()`; return
    how many were in flight then and the kill's times."""
    deadline = time.monotonic() + 120
    indices = [s.index for s in todo]
    while time.monotonic() < deadline:
        if all(progress.chunks[i] >= kill_after or progress.ended[i] for i in indices):
            break
        time.sleep(0.02)
    marks = {
        "in_flight": sum(progress.chunks[i] > 0 and not progress.ended[i] for i in indices),
        "kill_at": time.time(),
    }
    kill()
    marks["killed_at"] = time.time()
    return marks


def check(
    base: list[Outcome], cut: list[Outcome], marks: dict[str, float], commit: float | None
) -> dict[str, Any]:
    """Compare every stream of the cut run with its baseline; time each one's seam."""
    by_index = {o.spec.index: o for o in base}
    problems: dict[int, list[str]] = {}
    stalls: list[float] = []
    after_commit: list[float] = []
    before_kill: list[float] = []  # the stall's start: the last chunk before the kill began
    windowed: list[float] = []  # the longest wait across the kill (the first figure published)
    for o in cut:
        b = by_index[o.spec.index]
        found = faults(o.seen, b.seen, chat=o.spec.chat, asked_ids=o.spec.asks_ids)
        if found:
            problems[o.spec.index] = found
        window = seam(o.times, marks["kill_at"], marks["killed_at"])
        if o.seen.finished and window is not None:
            windowed.append((window[1] - window[0]) * 1000)
        sides = seam_across(o.times, commit) if commit is not None else window
        if o.seen.finished and sides is not None:
            stalls.append((sides[1] - sides[0]) * 1000)
            before_kill.append((marks["kill_at"] - sides[0]) * 1000)
            if commit is not None:
                after_commit.append((sides[1] - commit) * 1000)
    identical = sum(
        o.seen.finished and o.seen.text == by_index[o.spec.index].seen.text for o in cut
    )
    return {
        "streams": len(cut),
        "cut": sum(not o.seen.error and len(o.seen.finish_reasons) != 1 for o in cut),
        "failed": sum(bool(o.seen.error) for o in cut),
        "identical": identical,
        "with_faults": len(problems),
        "problems": problems,
        "stalls_ms": stalls,
        "windowed_ms": windowed,
        "after_commit_ms": after_commit,
        "before_kill_ms": before_kill,
        "kill_to_commit_ms": (commit - marks["kill_at"]) * 1000 if commit is not None else None,
    }


def seam_across(times: list[float], commit: float) -> tuple[float, float] | None:
    """Return the wait of a cut stream that spans the routing commit, as (last chunk before,
    first after), or None when the stream had no chunk on either side of it.

    No chunk after a cut can come before the commit (the continuation is sent once routing
    moved), so this wait is the seam. The longest wait across the kill (`seam`) is not, on a
    loaded machine: a client that lags reads the dead engine's last chunks after the kill, and
    an ordinary gap between two of them was then taken for the seam (its first chunk came
    before the commit)."""
    for before, after in zip(times, times[1:], strict=False):
        if before <= commit < after:
            return before, after
    return None


def baseline_faults(base: list[Outcome]) -> dict[int, list[str]]:
    return {
        o.spec.index: found
        for o in base
        if (found := faults(o.seen, chat=o.spec.chat, asked_ids=o.spec.asks_ids))
    }


def base_and_cut(stack: Stack, host, todo: list[Spec], args):
    """The uninterrupted baseline, then the same streams with the host killed under them.

    The streams are spread over `--client-processes` processes, as a service's users are
    over their own machines: one process reading 200 streams through the SDK takes tens of
    milliseconds to read the burst of first chunks after a seam, on the same two cores."""
    ctx = multiprocessing.get_context("spawn")
    procs = max(1, min(args.client_processes, len(todo)))
    progress, go, out = Progress.shared(ctx, len(todo)), ctx.Event(), ctx.Queue()
    url, token = f"{stack.server.url}/v1", stack.server.api_token
    workers = [
        ctx.Process(
            target=client_process, args=(url, token, todo[k::procs], progress, go, out), daemon=True
        )
        for k in range(procs)
    ]
    started = time.time()
    for w in workers:
        w.start()
    try:
        base = collect(out, "base", procs, workers)
        print(f"  baseline: {len(base)} streams in {time.time() - started:.1f} s", flush=True)
        bad = baseline_faults(base)
        if bad:
            first = dict(list(bad.items())[:3])
            raise SystemExit(f"the uninterrupted baseline is not whole: {first}")
        for i in range(len(todo)):
            progress.chunks[i], progress.ended[i] = 0, 0
        go.set()
        marks = wait_and_kill(todo, progress, max(2, args.tokens // 10), host.crash)
        cut = collect(out, "cut", procs, workers)
    finally:
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
    return base, cut, marks


def stream_round(stack: Stack, args) -> tuple[dict[str, Any], str]:
    from fleets.models import Operation  # noqa: PLC0415 - needs django.setup() (the app registry) first

    wait_for(stack.calm, 120, "a calm fleet", every=0.2)
    active, _ = stack.roles()
    host = stack.hosts[active]
    todo = specs(args.streams, args.tokens)
    before = set(Operation.objects.values_list("id", flat=True))
    base, cut, marks = base_and_cut(stack, host, todo, args)
    op = None
    deadline = time.time() + 30
    while op is None and time.time() < deadline:  # the streams may end before the commit
        op = (
            Operation.objects.exclude(id__in=before)
            .filter(kind="promote", routing_committed=True)
            .first()
        )
        time.sleep(0.05)
    figures: dict[str, float] = {}
    if op is not None:
        wait_for(
            lambda: Operation.objects.filter(pk=op.pk, state__in=["succeeded", "failed"]).exists(),
            60,
            "the promotion to finish",
        )
        op.refresh_from_db()
        figures = op_figures(op, marks["kill_at"])
        figures.update(other_steps(op))
    # The routing commit: the operation's `served_at`, set by the pointer's compare-and-swap
    # (the switch step's event is written after it).
    commit = figures.pop("commit", None)
    if op is not None and op.served_at is not None:
        commit = op.served_at.timestamp()
    row = check(base, cut, marks, commit)
    row["in_flight"] = int(marks["in_flight"])
    row["kill_ms"] = (marks["killed_at"] - marks["kill_at"]) * 1000
    row.update(figures)
    return row, active


def other_steps(op) -> dict[str, float]:
    """The promotion's steps before the routing commit that detection + wake + probe leaves
    out (stopping the trainer, checking the GPU memory, the switch itself), in milliseconds."""
    from fleets.models import Event  # noqa: PLC0415 - needs django.setup() (the app registry) first

    done = Event.objects.filter(operation=op, kind="operation.step.done")
    steps = {e.step: float(e.duration_ms or 0) for e in done}
    return {f"{s} ms": steps[s] for s in ("stop_training", "verify_gpu") if s in steps}


def restore(stack: Stack, crashed: str) -> None:
    """Bring the crashed host back as the standby, for the next round."""
    stack.hosts[crashed].restart()
    wait_for(lambda: stack.calm() or _demote_if_awake(stack, crashed), 120, "the host back")


def summary(rows: list[dict[str, Any]], args) -> dict[str, Any]:
    stalls = [s for r in rows for s in r["stalls_ms"]]
    after_commit = [s for r in rows for s in r["after_commit_ms"]]
    before_kill = [s for r in rows for s in r["before_kill_ms"]]
    windowed = [s for r in rows for s in r["windowed_ms"]]
    to_commit = [r["kill_to_commit_ms"] for r in rows if r["kill_to_commit_ms"] is not None]
    budget = [
        r["detection ms"] + r["wake ms"] + r["probe ms"]
        for r in rows
        if all(k in r for k in ("detection ms", "wake ms", "probe ms"))
    ]
    streams = sum(r["streams"] for r in rows)
    out = {
        "rounds": len(rows),
        "streams": streams,
        "tokens": args.tokens,
        "in_flight_at_kill": min((r["in_flight"] for r in rows), default=0),
        "cut": sum(r["cut"] for r in rows),
        "failed": sum(r["failed"] for r in rows),
        "with_faults": sum(r["with_faults"] for r in rows),
        "identical_share": sum(r["identical"] for r in rows) / streams if streams else 0.0,
        "stall_p50_ms": pct(stalls, 0.5),
        "stall_p99_ms": pct(stalls, 0.99),
        "stalls_measured": len(stalls),
        # The first published figure (4 December 2026): the longest wait across the kill.
        "windowed_stall_p50_ms": pct(windowed, 0.5),
        "windowed_stall_p99_ms": pct(windowed, 0.99),
        # From the routing commit to the stream's first chunk after the cut: the continuation's
        # own share of the stall (the rest is waiting for a domain, as a new request does).
        "after_commit_p50_ms": pct(after_commit, 0.5),
        "after_commit_p99_ms": pct(after_commit, 0.99),
        # Where the stall goes: the stall is the last chunk before the kill began to the kill,
        # plus the kill to the routing commit (detection, every promotion step, the switch),
        # plus the commit to the first chunk after it (the continuation's share).
        "before_kill_p50_ms": pct(before_kill, 0.5),
        "before_kill_p99_ms": pct(before_kill, 0.99),
        "kill_to_commit_ms": pct(to_commit, 0.5),
        "stop_training_ms": pct(
            [r["stop_training ms"] for r in rows if "stop_training ms" in r], 0.5
        ),
        "verify_gpu_ms": pct([r["verify_gpu ms"] for r in rows if "verify_gpu ms" in r], 0.5),
        "switch_route_ms": pct([r["switch_route ms"] for r in rows if "switch_route ms" in r], 0.5),
        "kill_ms": pct([r["kill_ms"] for r in rows], 0.5),
        "detection_ms": pct([r["detection ms"] for r in rows if "detection ms" in r], 0.5),
        "wake_ms": pct([r["wake ms"] for r in rows if "wake ms" in r], 0.5),
        "probe_ms": pct([r["probe ms"] for r in rows if "probe ms" in r], 0.5),
        "detection_wake_probe_ms": pct(budget, 0.5),
    }
    out["stall_target_ms"] = out["detection_wake_probe_ms"] + 200
    out["targets_met"] = bool(
        out["in_flight_at_kill"] >= 200
        and out["cut"] == 0
        and out["failed"] == 0
        and out["with_faults"] == 0
        and out["identical_share"] == 1.0
        and out["stall_p99_ms"] <= out["stall_target_ms"]
    )
    return out


def report(rows: list[dict[str, Any]], out: dict[str, Any]) -> None:
    lines = [
        f"\n== streams: {out['rounds']} round(s), {out['tokens']} tokens each, OpenAI SDK, "
        "max_retries=0, half chat, half completions",
        f"  streams                    {out['streams']}  (in flight at the kill, fewest in a "
        f"round: {out['in_flight_at_kill']}; target >= 200)",
        f"  cut / failed               {out['cut']} / {out['failed']}  (target 0 / 0)",
        f"  byte-identical             {out['identical_share']:.1%}  (target 100%)",
        f"  streams with any fault     {out['with_faults']}",
        f"  added stall ms             p50 {out['stall_p50_ms']:8.1f}   p99 "
        f"{out['stall_p99_ms']:8.1f}  (target p99 <= {out['stall_target_ms']:.0f})",
        f"  (the longest wait across the kill, as measured before: p50 "
        f"{out['windowed_stall_p50_ms']:.1f}, p99 {out['windowed_stall_p99_ms']:.1f}; "
        f"stalls measured {out['stalls_measured']})",
        f"  commit to first chunk ms   p50 {out['after_commit_p50_ms']:8.1f}   p99 "
        f"{out['after_commit_p99_ms']:8.1f}  (the continuation's share of the stall)",
        f"  last chunk to the kill ms  p50 {out['before_kill_p50_ms']:8.1f}   p99 "
        f"{out['before_kill_p99_ms']:8.1f}  (the stall's start: the gap already open)",
        f"  kill to routing commit     {out['kill_to_commit_ms']:8.1f} ms  (detection and every "
        f"step: stop training {out['stop_training_ms']:.0f}, verify GPU "
        f"{out['verify_gpu_ms']:.0f}, switch {out['switch_route_ms']:.0f})",
        f"  the kill took              {out['kill_ms']:8.1f} ms  (every process of the host gone)",
        f"  detection + wake + probe   {out['detection_wake_probe_ms']:8.1f} ms  (detection "
        f"{out['detection_ms']:.0f}, wake {out['wake_ms']:.0f}, probe {out['probe_ms']:.0f})",
    ]
    for i, r in enumerate(rows):
        for index, found in list(r["problems"].items())[:5]:
            lines.append(f"  round {i + 1} stream {index}: {'; '.join(found)}")
    lines.append(f"  targets met                {'yes' if out['targets_met'] else 'no'}")
    print("\n".join(lines))


def run(args, workdir: Path) -> int:
    # Answers generated from the prompt's ids, as long as max_tokens asks, re-sending earlier
    # text when a continuation's prompt ends inside a character, as vLLM does.
    engine_args = (
        "--generate",
        "--reemit-split-prompt",
        "--token-delay-ms",
        str(args.token_delay_ms),
    )
    stack = Stack(workdir, engine_args=engine_args, engine="sim")
    rows: list[dict[str, Any]] = []
    try:
        stack.start({**POLICY, "autoFailover": True})
        for i in range(args.n):
            row, crashed = stream_round(stack, args)
            rows.append(row)
            print(
                f"streams round {i + 1}/{args.n}: {row['in_flight']} in flight at the kill, "
                f"cut {row['cut']}, failed {row['failed']}, "
                f"identical {row['identical']}/{row['streams']}",
                flush=True,
            )
            if i + 1 < args.n:
                restore(stack, crashed)
    finally:
        stack.stop()
    out = summary(rows, args)
    report(rows, out)
    print(f"\nstack kept in {workdir} (server log: {stack.server.log_path})")
    if args.json:
        # NaN (a figure with no sample) is not JSON: null.
        print(json.dumps({k: None if v != v else v for k, v in out.items()}))
    return 0 if out["targets_met"] else 1
