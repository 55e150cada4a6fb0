"""What bench/scale.py measures with, apart from Haru: the farm as a process, a process group's
CPU, PostgreSQL's own counters, and tick lateness as the hosts saw it.

Standard library, httpx and psycopg only; no Django.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from haru.local import PYTHON
from haru.local.processes import exited, spawn, stop, wait_for

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank percentile `q` (0 to 100) of `values`; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def group_cpu_s(pgids: Iterable[int]) -> float:
    """CPU seconds (user and system) used so far by every live process in these groups."""
    wanted = set(pgids)
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone since the listing
        # After the command name (which may hold spaces and parentheses): state, ppid, pgrp...
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) in wanted:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLOCK_TICKS


def tick_lateness(
    heard: dict[str, list[float]], hosts: Iterable[str], *, t0: float, t1: float, interval_s: float
) -> tuple[list[float], int]:
    """How late each heartbeat of `hosts` came within [t0, t1]: per gap between two heartbeats
    (the window's ends count as heartbeats, so a host never heard is late by the window), its
    excess over the interval. Returns the lateness values and how many hosts were never heard."""
    late: list[float] = []
    silent = 0
    for name in hosts:
        times = sorted(t for t in heard.get(name, ()) if t0 <= t <= t1)
        if not times:
            silent += 1
        points = [t0, *times, t1]
        late.extend(max(0.0, b - a - interval_s) for a, b in zip(points, points[1:], strict=False))
    return late, silent


@dataclass
class FarmProc:
    """`python -m supervisor.farm` serving a manifest, in a session of its own."""

    manifest: Path
    workdir: Path
    proc: Any = None
    control: str = ""
    ready: dict[str, Any] | None = None

    def start(self, timeout_s: float = 180) -> None:
        ready_file = self.workdir / "farm-ready.json"
        ready_file.unlink(missing_ok=True)
        log = self.workdir / "farm.log"
        argv = [
            PYTHON,
            "-m",
            "supervisor.farm",
            "--manifest",
            str(self.manifest),
            "--workdir",
            str(self.workdir / "farm"),
            "--ready-file",
            str(ready_file),
        ]
        self.proc = spawn(argv, env={**os.environ, "PYTHONUNBUFFERED": "1"}, log=log)
        wait_for(ready_file.exists, timeout_s, "the farm", gave_up=exited(self.proc, log))
        time.sleep(0.05)  # the file is written in one call; let it land
        self.ready = json.loads(ready_file.read_text())
        self.control = self.ready["control"]

    def _get(self, path: str) -> Any:
        return httpx.get(f"{self.control}{path}", timeout=30, trust_env=False).json()

    def stats(self) -> dict[str, Any]:
        return self._get("/farm/stats")

    def heartbeats(self) -> dict[str, list[float]]:
        return self._get("/farm/heartbeats")["hosts"]

    def fault(self, host: str, fault: str, target: str = "all") -> None:
        r = httpx.post(
            f"{self.control}/farm/hosts/{host}/fault",
            json={"fault": fault, "target": target},
            timeout=10,
            trust_env=False,
        )
        r.raise_for_status()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, 10)


class Postgres:
    """PostgreSQL's own view of one database: its counters and connections."""

    def __init__(self, url: str) -> None:
        import psycopg  # noqa: PLC0415 - only the PostgreSQL runs need it

        self.name = url.rsplit("/", 1)[1].split("?")[0]
        admin = url.rsplit("/", 1)[0] + "/postgres"
        self._conn = psycopg.connect(admin, autocommit=True)

    def recreate(self) -> None:
        """Drop the database (closing its sessions) and create it empty."""
        with self._conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{self.name}"')

    def counters(self) -> dict[str, int]:
        """Committed transactions and rows written so far (backends report them within about
        a second of a busy period, 10 s of an idle one)."""
        with self._conn.cursor() as cur:
            cur.execute(
                "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted "
                "FROM pg_stat_database WHERE datname = %s",
                (self.name,),
            )
            row = cur.fetchone()
        return {"commits": int(row[0]), "rows": int(row[1])} if row else {"commits": 0, "rows": 0}

    def connections(self) -> tuple[int, int]:
        """Sessions open on the database now, and those of them running a statement."""
        with self._conn.cursor() as cur:
            cur.execute(
                "SELECT count(*), count(*) FILTER (WHERE state <> 'idle') "
                "FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.name,),
            )
            row = cur.fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def close(self) -> None:
        self._conn.close()
