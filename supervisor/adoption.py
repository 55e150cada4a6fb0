"""Adoption: take over the servers and trainers a previous supervisor left running.

Managed servers and trainers run in sessions of their own and outlive a supervisor that is
SIGKILLed or crashes (the active host's servers must keep serving through that). At start-up,
before anything is spawned, the new supervisor reads the state directory and, for each record:

- the process is gone (or its pid now belongs to another process): the record is deleted;
- it is alive and the config still manages it (same model name and port, or a training slot on
  that GPU): it is adopted, watched by polling /proc and stopped by the usual paths;
- it is alive but the config no longer has a place for it: it is stopped (SIGTERM to its group,
  SIGKILL after a grace), exactly as a graceful restart of the old supervisor would have done.

A port held by a process with no record is not ours to touch and stays a conflict.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from typing import Protocol

from supervisor.model_servers import ModelServer
from supervisor.processes import AdoptedProcess
from supervisor.records import Record, ServerRecord, StateDir
from supervisor.training import TrainingSlot

log = logging.getLogger(__name__)

# A leftover the config no longer wants gets this long after SIGTERM, as on a graceful stop.
ORPHAN_SERVER_GRACE_S = 10.0
ORPHAN_TRAINER_GRACE_S = 30.0
# After SIGKILL the kernel needs a moment to tear the process down; past that, give up waiting.
KILL_WAIT_S = 5.0


class Adopter(Protocol):
    """What adoption needs of the host (supervisor/host.py): the servers and trainers its
    config wants, to hand each a recorded process."""

    @property
    def models(self) -> Sequence[ModelServer]: ...

    @property
    def training(self) -> Sequence[TrainingSlot]: ...


def adopt_children(host: Adopter, state: StateDir) -> list[asyncio.Task[None]]:
    """Adopt recorded processes into `host`; return the tasks stopping unwanted leftovers."""
    loaded = state.load()
    servers = {(m.name, m.port): m for m in host.models if m.managed is not None}
    trainers = {slot.gpu_index: slot for slot in host.training}
    stopping: list[asyncio.Task[None]] = []
    records: list[Record] = [*loaded.servers, *loaded.trainers]
    for record in records:
        what = describe(record)
        if not record.stamp.is_alive():
            log.info("%s is gone; deleting its record", what)
            state.drop(record)
            continue
        proc = AdoptedProcess(record.stamp)
        if isinstance(record, ServerRecord):
            model = servers.pop((record.name, record.port), None)
            if model is not None:
                model.adopt(proc, record)
                continue
            grace = ORPHAN_SERVER_GRACE_S
        else:
            slot = trainers.pop(record.gpu_index, None)
            if slot is not None:
                slot.adopt(proc, record)
                continue
            grace = ORPHAN_TRAINER_GRACE_S
        log.warning("%s is still running but the config no longer has it; stopping it", what)
        stopping.append(
            asyncio.get_running_loop().create_task(
                stop_leftover(proc, record, state, grace), name=f"stop-leftover-{proc.pid}"
            )
        )
    return stopping


async def stop_leftover(
    proc: AdoptedProcess, record: Record, state: StateDir, grace_s: float
) -> None:
    """Stop a recorded process nobody wants: SIGTERM, SIGKILL after `grace_s`, drop the record."""
    proc.signal_group(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        log.warning("%s ignored SIGTERM for %.0fs; SIGKILL", describe(record), grace_s)
        proc.signal_group(signal.SIGKILL)
        try:
            await asyncio.wait_for(proc.wait(), KILL_WAIT_S)
        except TimeoutError:
            log.error("%s survived SIGKILL; keeping its record", describe(record))
            return
    # Helpers it forked may outlive the leader; they hold GPU memory.
    proc.signal_group(signal.SIGKILL)
    state.drop(record)
    log.info("%s stopped", describe(record))


def describe(record: Record) -> str:
    """Name a record's process for a log line."""
    if isinstance(record, ServerRecord):
        return f"server {record.name} (port {record.port}, pid {record.stamp.pid})"
    return f"trainer on GPU {record.gpu_index} (pid {record.stamp.pid})"
