"""A planned promotion with a long stream in flight: how long it takes, and what the stream saw.

    .venv/bin/python bench/planned_stream.py [--tokens 600] [--token-delay-ms 100]
                                             [--after-ms 0] [--rounds 3] [--json]

The stack of bench/failover_load.py (two simulated hosts whose engines generate the answer from
the prompt's token ids, `manage.py serve` with its reconcile loop). Planned promotions, each
asked of the API as an operator does, each to the current standby; `--rounds` times:

1. one with no stream in flight;
2. one with a streamed chat answer in flight through the proxy (`--tokens` tokens
   `--token-delay-ms` apart: 60 s by default) and stream migration on (the policy's
   `streamMigrationAfterMs`, `--after-ms`, 0 by default): the old active's drain ends at the
   bound, its sleep aborts the stream and the proxy continues it on the new active; the next
   round waits for the stream's end;

then once more with migration off (`streamMigrationAfterMs` null): the drain waits for the answer.

Printed: each promotion's duration (the operation's start to its end), and each stream's
verdict against an uninterrupted run of the same request (haru/local/streams.py: text byte for
byte, one id, one role chunk, one finish_reason, one `[DONE]`, usage once), with how many
streams the proxy continued. With `--json` the last line is one JSON object with those figures.
The hosts' own drain budget is raised above the answer's length, and the sleep step's budget
with it, so that with migration off nothing but the answer's end ends the drain.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.failover_load import POLICY, Stack  # noqa: E402 - after the path above
from haru.local.processes import wait_for  # noqa: E402
from haru.local.streams import StreamSeen, faults, parse_sse, read_events  # noqa: E402

MODEL = "llama-small"
PROMPT = "Tell a long story about harbours, lighthouses and the ships between them."


class Stream(threading.Thread):
    """One streamed chat answer read through the proxy as raw SSE (so `[DONE]` is counted)."""

    def __init__(self, stack: Stack, tokens: int) -> None:
        super().__init__(daemon=True)
        self.url = f"{stack.server.url}/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {stack.server.api_token}", "X-Haru-Fleet": "e2e"}
        self.body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        self.raw = b""
        self.chunks = 0
        self.error = ""
        self.started_at = time.time()
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST",
                self.url,
                json=self.body,
                headers=self.headers,
                timeout=httpx.Timeout(300, connect=30),
                trust_env=False,
            ) as answer:
                for piece in answer.iter_bytes():
                    self.raw += piece
                    self.chunks += piece.count(b"\n\n")
        except httpx.HTTPError as exc:  # a cut: the verdict says so
            self.error = f"{type(exc).__name__}: {exc}"
        self.ended_at = time.time()

    def seen(self) -> StreamSeen:
        events, done = parse_sse(self.raw)
        seen = read_events(events, done=done)
        seen.error = self.error
        return seen


def continued_total(stack: Stack) -> int:
    text = httpx.get(f"{stack.server.url}/metrics", timeout=10, trust_env=False).text
    found = re.findall(r"^haru_proxy_streams_continued_total\{[^}]*\} (\S+)$", text, re.M)
    return int(sum(float(v) for v in found))


def promote(stack: Stack) -> dict[str, Any]:
    """Promote the standby through the API; return the ended operation's duration and state."""
    from fleets.models import Domain, Operation  # noqa: PLC0415 - needs django.setup() first

    _, standby = stack.roles()
    target = Domain.objects.get(fleet=stack.fleet(), slug=standby)
    accepted = stack.api("POST", "/fleets/e2e/promote", {"targetDomainId": str(target.id)})
    if accepted.status_code != 202:
        raise SystemExit(f"the promotion was refused: {accepted.status_code} {accepted.text}")
    op_id = accepted.json()["operation"]["id"]
    op = wait_for(
        lambda: Operation.objects.filter(pk=op_id, state__in=["succeeded", "failed"]).first(),
        300,
        "the promotion",
        every=0.1,
    )
    return {
        "state": op.state,
        "error": op.error,
        "s": (op.finished_at - op.started_at).total_seconds(),
        "finished_at": op.finished_at.timestamp(),
    }


def promote_under_stream(stack: Stack, tokens: int) -> tuple[dict[str, Any], Stream]:
    """Start a long stream on the active, promote once it runs; return the promotion's figures
    and the stream (still running, or ended)."""
    stream = Stream(stack, tokens)
    stream.start()
    wait_for(lambda: stream.chunks >= 10 or not stream.is_alive(), 60, "the stream running")
    op = promote(stack)
    op["stream_running_at_end"] = stream.is_alive()
    return op, stream


def verdict(seen: StreamSeen, base: StreamSeen) -> str:
    found = faults(seen, base, chat=True, asked_ids=False)
    return "whole, byte-identical" if not found else "; ".join(found)


def run(args, workdir: Path) -> dict[str, Any]:
    engine_args = (
        "--generate",
        "--reemit-split-prompt",
        "--token-delay-ms",
        str(args.token_delay_ms),
    )
    stack = Stack(workdir, engine_args=engine_args, engine="sim")
    answer_ms = args.tokens * args.token_delay_ms
    for host in stack.hosts.values():
        # The migration-off run must drain the whole answer: the host's drain budget outlasts it.
        host.config["drainBudgetMs"] = answer_ms + 60_000
        (host.dir / "config.json").write_text(json.dumps(host.config, indent=1))
    policy = {
        **POLICY,
        "autoFailover": False,
        "sleepTimeoutMs": answer_ms + 60_000,
        "streamMigrationAfterMs": args.after_ms,
    }
    out: dict[str, Any] = {
        "tokens": args.tokens,
        "token_delay_ms": args.token_delay_ms,
        "answer_s": answer_ms / 1000,
        "stream_migration_after_ms": args.after_ms,
        "rounds": args.rounds,
        "no_stream_s": [],
        "migration_on_s": [],
        "migration_on_states": [],
        "migration_on_ended_before_stream": [],
        "migration_on_streams": [],
        "migration_on_continued": [],
    }
    base: StreamSeen | None = None
    try:
        stack.start(policy)
        for i in range(args.rounds):
            wait_for(stack.calm, 120, "a calm fleet", every=0.2)
            plain = promote(stack)
            out["no_stream_s"].append(plain["s"])
            print(
                f"round {i + 1}: no stream      {plain['s']:.2f} s ({plain['state']})", flush=True
            )

            wait_for(stack.calm, 120, "a calm fleet", every=0.2)
            before = continued_total(stack)
            moved, stream = promote_under_stream(stack, args.tokens)
            print(
                f"round {i + 1}: migration on   {moved['s']:.2f} s ({moved['state']})", flush=True
            )
            baseline = None
            if base is None:  # the uninterrupted run, on the new active, while the moved one ends
                baseline = Stream(stack, args.tokens)
                baseline.start()
            # The next promotion waits for this stream's end: one continuation each, no more.
            stream.join(answer_ms / 1000 + 120)
            if baseline is not None:
                baseline.join(answer_ms / 1000 + 120)
                base = baseline.seen()
                if found := faults(base, chat=True, asked_ids=False):
                    raise SystemExit(f"the uninterrupted baseline is not whole: {found}")
            assert base is not None
            out["migration_on_s"].append(moved["s"])
            out["migration_on_states"].append(moved["state"])
            out["migration_on_ended_before_stream"].append(moved["stream_running_at_end"])
            out["migration_on_streams"].append(verdict(stream.seen(), base))
            out["migration_on_continued"].append(continued_total(stack) - before)

        stack.set_policy(streamMigrationAfterMs=None)
        wait_for(stack.calm, 120, "a calm fleet", every=0.2)
        before = continued_total(stack)
        drained, stream = promote_under_stream(stack, args.tokens)
        stream.join(120)
        print(f"migration off:    {drained['s']:.2f} s ({drained['state']})", flush=True)
        assert base is not None
        out["migration_off_s"] = drained["s"]
        out["migration_off_state"] = drained["state"]
        out["migration_off_ended_before_stream"] = drained["stream_running_at_end"]
        out["migration_off_stream"] = verdict(stream.seen(), base)
        out["migration_off_continued"] = continued_total(stack) - before
    finally:
        stack.stop()
    plain_s, moved_s = out["no_stream_s"], out["migration_on_s"]
    out["no_stream_median_s"] = statistics.median(plain_s)
    out["migration_on_median_s"] = statistics.median(moved_s)
    # The target: a promotion with a long stream in flight takes the time of one without it.
    # A promotion's length varies from one to the next; "the time of one without it" is read
    # as within the range the no-stream promotions of the same run spanned, plus the policy's
    # bound (the short answers' grace, 0 by default), at the median.
    out["limit_s"] = max(plain_s) + args.after_ms / 1000
    out["targets_met"] = bool(
        all(state == "succeeded" for state in out["migration_on_states"])
        and all(out["migration_on_ended_before_stream"])
        and out["migration_on_median_s"] <= out["limit_s"]
        and all(v == "whole, byte-identical" for v in out["migration_on_streams"])
        and all(n == 1 for n in out["migration_on_continued"])
    )
    return out


def report(out: dict[str, Any], workdir: Path) -> None:
    def spread(values: list[float]) -> str:
        return (
            f"{statistics.median(values):5.2f} s  (rounds {', '.join(f'{v:.2f}' for v in values)})"
        )

    print(
        "\n".join(
            [
                f"\n== a planned promotion with a {out['answer_s']:.0f} s stream in flight "
                f"({out['tokens']} tokens, {out['token_delay_ms']} ms apart), "
                f"streamMigrationAfterMs {out['stream_migration_after_ms']}, "
                f"{out['rounds']} rounds",
                f"  no stream, median          {spread(out['no_stream_s'])}",
                f"  stream, migration on       {spread(out['migration_on_s'])}",
                f"    target                     median <= {out['limit_s']:.2f} s (the slowest "
                "promotion with no stream + the bound)",
                f"    ended before the stream    {out['migration_on_ended_before_stream']}",
                f"    the streams                {sorted(set(out['migration_on_streams']))}; "
                f"continued {out['migration_on_continued']}",
                f"  stream, migration off      {out['migration_off_s']:5.2f} s  "
                f"(ended before the stream: {out['migration_off_ended_before_stream']})",
                f"    the stream                 {out['migration_off_stream']}; continued "
                f"{out['migration_off_continued']}",
                f"  targets met                {'yes' if out['targets_met'] else 'no'}",
                f"\nstack kept in {workdir}",
            ]
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=600, help="the long answer's tokens")
    parser.add_argument("--token-delay-ms", type=int, default=100, help="between two tokens")
    parser.add_argument(
        "--after-ms", type=int, default=0, help="streamMigrationAfterMs (0, the policy default)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="promotions with and without")
    parser.add_argument("--json", action="store_true", help="the last line is the figures")
    args = parser.parse_args()
    if args.after_ms < 0 or args.rounds < 1:
        parser.error(
            "--after-ms must be 0 or more (the last run is the migration off), --rounds 1 or more"
        )
    # The stack's own embedded store, whatever the calling environment points at.
    for key in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(key, None)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    workdir = Path(tempfile.mkdtemp(prefix="haru-bench-planned-stream-"))
    out = run(args, workdir)
    report(out, workdir)
    if args.json:
        print(json.dumps(out))
    return 0 if out["targets_met"] else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
