"""`python -m supervisor.farm --hosts N` (or `--manifest FILE`): serve many simulated hosts.

With `--hosts N` the farm plans N hosts on free ports with tokens of its own and writes them
to `--manifest` (readable by its owner only); with an existing `--manifest` (as the control
plane's seeding writes it, tokens derived per domain) it serves exactly those. Once every
host listens it writes `--ready-file` (the control API's URL and the figures of `/farm/stats`)
and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from common.farm_manifest import MAX_HOSTS, plan_hosts, read_manifest, write_manifest
from common.ports import free_port
from supervisor.farm.control import Farm

log = logging.getLogger("supervisor.farm")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m supervisor.farm", description=__doc__)
    p.add_argument("--hosts", type=int, help=f"plan this many hosts (1 to {MAX_HOSTS})")
    p.add_argument("--manifest", type=Path, required=True, help="the hosts: read, or written")
    p.add_argument("--workdir", type=Path, help="the simulated GPUs' state (default: a temp dir)")
    p.add_argument("--control-port", type=int, default=0, help="default: a free port")
    p.add_argument("--ready-file", type=Path, help="written once every host listens")
    p.add_argument("--log-level", default="warning")
    a = p.parse_args(argv)
    if a.hosts is None and not a.manifest.exists():
        p.error("give --hosts N, or an existing --manifest")
    if a.hosts is not None and not 0 < a.hosts <= MAX_HOSTS:
        p.error(f"--hosts must be 1 to {MAX_HOSTS}")
    return a


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop where it is installed (the farm's per-request cost is mostly the loop's)."""
    try:
        import uvloop  # noqa: PLC0415 (optional: the farm runs on asyncio's own loop too)
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


async def serve(a: argparse.Namespace, workdir: Path) -> None:
    if a.hosts is not None:
        plans = plan_hosts(a.hosts)
        write_manifest(a.manifest, plans)
    else:
        plans = read_manifest(a.manifest)
    farm = Farm(plans, workdir=workdir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    control_port = a.control_port or free_port()
    try:
        await farm.start(control_port)
        ready = {"control": f"http://127.0.0.1:{control_port}", **farm.stats()}
        log.warning("farm: %d hosts listening; control on %s", len(plans), ready["control"])
        if a.ready_file is not None:
            a.ready_file.write_text(json.dumps(ready))
        await stop.wait()
    finally:
        await farm.close()


def run(coro: Coroutine[Any, Any, None]) -> None:
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(coro)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, a.log_level.upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if a.workdir is not None:
            a.workdir.mkdir(parents=True, exist_ok=True)
            run(serve(a, a.workdir))
        else:
            with tempfile.TemporaryDirectory(prefix="haru-farm-") as tmp:
                run(serve(a, Path(tmp)))
    except (OSError, ValueError) as exc:
        print(f"supervisor.farm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
