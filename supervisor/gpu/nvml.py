"""GPU facts through NVML (the `pynvml` module from nvidia-ml-py).

The module is injected, so tests drive this code with a scripted fake: normal GPUs, a MIG
GPU, a host without NVML. Where a GPU is MIG-partitioned the parent often reports no usable
memory figure; memory is then summed from its instances instead of failing the whole read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:  # a base dependency; a host whose install lacks it reads "no GPU facts", not a crash at start
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is in the base dependencies
    pynvml = None

from supervisor.gpu.facts import (
    MIB,
    GpuFacts,
    GpuProcess,
    GpuQueryFailed,
    GpuUnavailable,
    MigInstance,
)

log = logging.getLogger(__name__)

# NVML error codes this module reacts to (stable across NVML versions).
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_GPU_IS_LOST = 15
NVML_DEVICE_MIG_ENABLE = 1


def import_pynvml() -> Any:
    """Return the real NVML binding; GpuUnavailable when it is not installed."""
    if pynvml is None:
        raise GpuUnavailable("nvidia-ml-py (pynvml) is not installed")
    return pynvml


class NvmlBackend:
    """Read GPU facts with NVML, initialising it on first use."""

    name = "nvml"

    def __init__(
        self,
        load: Callable[[], Any] = import_pynvml,
        process_name: Callable[[int], str | None] | None = None,
    ) -> None:
        self._load = load
        self._nvml: Any = None
        # NVML init is process-wide; two threads racing to init would double-count its refcount.
        self._lock = threading.Lock()
        self._process_name = process_name or read_process_name
        self._processes_hidden = False

    async def read(self) -> list[GpuFacts]:
        # NVML calls block (some for tens of milliseconds); keep them off the event loop.
        return await asyncio.to_thread(self.read_sync)

    def read_sync(self) -> list[GpuFacts]:
        nvml = self._ensure_init()
        try:
            count = nvml.nvmlDeviceGetCount()
            return [self._read_gpu(nvml, i) for i in range(count)]
        except nvml.NVMLError as exc:
            raise GpuQueryFailed(f"NVML query failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._nvml is not None:
                # Shutting down: an error here has nowhere useful to go.
                with contextlib.suppress(Exception):
                    self._nvml.nvmlShutdown()
                self._nvml = None

    def _ensure_init(self) -> Any:
        with self._lock:
            if self._nvml is not None:
                return self._nvml
            nvml = self._load()
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                # No library, no driver, no GPU: a property of this host, not a failure to retry
                # loudly; the API answers 501 and the next request tries again.
                raise GpuUnavailable(f"NVML is not available on this host: {exc}") from exc
            self._nvml = nvml
            return nvml

    def _read_gpu(self, nvml: Any, index: int) -> GpuFacts:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(_optional(nvml, nvml.nvmlDeviceGetName, handle))
        uuid = _text(_optional(nvml, nvml.nvmlDeviceGetUUID, handle))
        capability = _optional(nvml, nvml.nvmlDeviceGetCudaComputeCapability, handle)
        cc = f"{capability[0]}.{capability[1]}" if capability else None
        if self._mig_enabled(nvml, handle):
            return self._read_mig_gpu(nvml, index, handle, name, uuid, cc)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return GpuFacts(
            index=index,
            used_mib=int(memory.used) // MIB,
            total_mib=int(memory.total) // MIB,
            name=name,
            uuid=uuid,
            compute_capability=cc,
            processes=self._processes(nvml, handle),
        )

    def _read_mig_gpu(
        self,
        nvml: Any,
        index: int,
        handle: Any,
        name: str | None,
        uuid: str | None,
        cc: str | None,
    ) -> GpuFacts:
        instances: list[MigInstance] = []
        count = _optional(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        for slot in range(count):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == NVML_ERROR_NOT_FOUND:
                    continue  # an empty slot in the partition table
                raise
            memory = nvml.nvmlDeviceGetMemoryInfo(mig)
            instances.append(
                MigInstance(
                    gpu_instance_id=_optional(nvml, nvml.nvmlDeviceGetGpuInstanceId, mig),
                    compute_instance_id=_optional(nvml, nvml.nvmlDeviceGetComputeInstanceId, mig),
                    uuid=_text(_optional(nvml, nvml.nvmlDeviceGetUUID, mig)),
                    used_mib=int(memory.used) // MIB,
                    total_mib=int(memory.total) // MIB,
                    processes=self._processes(nvml, mig),
                )
            )
        # The parent's own memory figure is often unsupported under MIG; sum the instances then.
        parent = _optional(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
        parent_total = int(parent.total) // MIB if parent is not None and parent.total else 0
        return GpuFacts(
            index=index,
            used_mib=sum(m.used_mib for m in instances),
            total_mib=parent_total or sum(m.total_mib for m in instances),
            name=name,
            uuid=uuid,
            compute_capability=cc,
            processes=tuple(p for m in instances for p in m.processes),
            mig=tuple(instances),
        )

    def _mig_enabled(self, nvml: Any, handle: Any) -> bool:
        getter = getattr(nvml, "nvmlDeviceGetMigMode", None)
        mode = _optional(nvml, getter, handle) if getter else None
        return mode is not None and bool(mode) and mode[0] == NVML_DEVICE_MIG_ENABLE

    def _warn_processes_hidden(self, exc: Exception) -> None:
        if not self._processes_hidden:
            self._processes_hidden = True
            log.warning("NVML lists no processes here (%s); reporting device memory only", exc)

    def _processes(self, nvml: Any, handle: Any) -> tuple[GpuProcess, ...]:
        seen: dict[int, GpuProcess] = {}
        getters = (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        )
        for getter in getters:
            fn = getattr(nvml, getter, None)
            try:
                procs = _optional(nvml, fn, handle) if fn else None
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == NVML_ERROR_GPU_IS_LOST:
                    raise
                # Per-process lists are detail: inside a sandbox (gVisor, some containers) they
                # fail with no-permission or unknown while the device's own memory reads fine.
                # Failing the whole read would fail verify_gpu and so every promotion there.
                self._warn_processes_hidden(exc)
                continue
            for proc in procs or []:
                pid = int(proc.pid)
                if pid in seen:
                    continue
                used = getattr(proc, "usedGpuMemory", None)
                seen[pid] = GpuProcess(
                    pid=pid,
                    used_mib=int(used) // MIB if used is not None else None,
                    name=self._process_name(pid),
                )
        return tuple(seen.values())


def _optional(nvml: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Call an NVML getter for a field this GPU may not support; None when it does not."""
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND):
            return None
        raise


def _text(value: Any) -> str | None:
    # Older nvidia-ml-py releases return bytes, newer ones str.
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def read_process_name(pid: int) -> str | None:
    """Read a process's short name from /proc; None inside another PID namespace."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or None
    except OSError:
        return None
