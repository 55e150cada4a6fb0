"""Real weights behind the simulated engine: torch tensors on a GPU (or the CPU).

Sleep and wake do what vLLM's level-1 sleep does to memory, so a real card shows what the
supervisor's failover costs:
- level 1 copies every weight tensor into pinned host memory (pinned only where CUDA is there:
  pinning is what lets the copy back run at the bus's speed), drops the device copies and the
  KV-cache stand-in, and hands the freed memory back to the driver (`empty_cache`), so NVML
  sees it go; wake allocates again and copies back;
- level 2 drops the weights outright; wake reloads them from the safetensors file.

torch and safetensors are heavy optional dependencies: this module is imported only when
`--backend torch` is asked for, never by the default install.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch  # heavy optional dependency: only `--backend torch` imports this module
from safetensors.torch import load_file, save_file

from supervisor.sim.backends import cuda_ordinal

log = logging.getLogger("supervisor.sim.torch")

MIB = 1024 * 1024
# The checksum folds this many elements at a time, bounding its scratch memory on the device.
CHECKSUM_SLICE = 8 * MIB
# Position weights of the checksum cycle through this prime, so swapped elements change it.
CHECKSUM_PRIME = 65521


def pick_device(device: str, gpu_index: int, environ: Mapping[str, str]) -> torch.device:
    """Resolve `auto`, `cuda` or `cpu` to a torch device; refuse `cuda` without one."""
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device("cuda", cuda_ordinal(gpu_index, environ))


def checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """A position-sensitive fold of the tensors' raw bits, computed where they live.

    Bit-exact: it reads the 16-bit patterns, not the values, so a wake that changed a single
    bit (or swapped two elements) changes it. Cheap enough for tens of GiB on a GPU.
    """
    total = 0
    for name in sorted(tensors):
        flat = tensors[name].reshape(-1).view(torch.int16)
        for start in range(0, flat.numel(), CHECKSUM_SLICE):
            part = flat[start : start + CHECKSUM_SLICE].to(torch.int64)
            weights = torch.arange(start, start + part.numel(), device=part.device)
            weights = weights.remainder_(CHECKSUM_PRIME).add_(1)
            total = (total * 1_000_003 + int((part * weights).sum().item())) % (2**61 - 1)
    return f"{total:016x}"


class TorchWeights:
    """Weight tensors and a KV-cache stand-in on one device, moved by sleep and wake."""

    name = "torch"

    def __init__(
        self,
        *,
        weights_mib: int,
        gpu_index: int,
        environ: Mapping[str, str],
        device: str = "auto",
        kv_cache_mib: int = 0,
        weights_file: str | None = None,
        chunk_mib: int = 256,
        seed: int = 0,
    ) -> None:
        self.device = pick_device(device, gpu_index, environ)
        self.cuda = self.device.type == "cuda"
        self.weights_bytes = weights_mib * MIB
        self.kv_cache_bytes = kv_cache_mib * MIB
        self.chunk_bytes = chunk_mib * MIB
        self.seed = seed
        self.weights_file = Path(weights_file) if weights_file else None
        self._own_file = False
        self.weights: dict[str, torch.Tensor] = {}
        self.backup: dict[str, torch.Tensor] = {}
        self.kv_cache: torch.Tensor | None = None
        self.level: int | None = None
        self.last_load: dict[str, Any] | None = None
        self.last_sleep: dict[str, Any] | None = None
        self.last_wake: dict[str, Any] | None = None
        self.last_weights_wake: dict[str, Any] | None = None

    # -- loading -------------------------------------------------------------------------------

    def allocate(self) -> None:
        started = time.perf_counter()
        if self.weights_file is not None and self.weights_file.exists():
            self.weights = self._load_file()
            source = "file"
        else:
            self.weights = self._generate()
            source = "generated"
            if self.weights_file is not None:
                self._save(self.weights_file)
        self._allocate_kv_cache()
        self._sync()
        seconds = time.perf_counter() - started
        self.last_load = {"source": source, "seconds": seconds, "bytes": self._weights_size()}
        log.info("loaded %d bytes of weights (%s) in %.2fs", self._weights_size(), source, seconds)

    def _generate(self) -> dict[str, torch.Tensor]:
        # Seeded on the device itself: generating 32 GiB on the host and copying it over would
        # take longer than the whole benchmark may.
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        out: dict[str, torch.Tensor] = {}
        remaining, i = self.weights_bytes, 0
        while remaining > 0:
            size = min(self.chunk_bytes, remaining)
            out[f"layers.{i:04d}.weight"] = torch.randn(
                size // 2, dtype=torch.bfloat16, device=self.device, generator=generator
            )
            remaining -= size
            i += 1
        return out

    def _save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
        os.close(fd)
        try:
            save_file({k: v.contiguous() for k, v in self.weights.items()}, tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _allocate_kv_cache(self) -> None:
        if self.kv_cache_bytes and self.kv_cache is None:
            # Zeroed so a CPU run commits the pages too; on a GPU the allocation alone does.
            self.kv_cache = torch.zeros(self.kv_cache_bytes, dtype=torch.uint8, device=self.device)

    # -- sleep and wake ------------------------------------------------------------------------

    def sleep(self, level: int) -> None:
        if self.level is not None:
            return  # already asleep: vLLM answers a second sleep without moving anything
        started = time.perf_counter()
        moved = self._weights_size()
        if level == 1:
            self.backup = {}
            for name, tensor in self.weights.items():
                host = torch.empty(
                    tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=self.cuda
                )
                host.copy_(tensor, non_blocking=self.cuda)
                self.backup[name] = host
            self._sync()
        elif self.weights_file is None:
            # vLLM reloads a level-2 sleeper from its model directory; without a file named
            # on the command line, write one now, so the wake has somewhere to read from.
            handle, name = tempfile.mkstemp(prefix="haru-sim-weights-", suffix=".safetensors")
            os.close(handle)
            self.weights_file, self._own_file = Path(name), True
            self._save(self.weights_file)
        self.weights = {}
        self.kv_cache = None
        self._release()
        self.level = level
        self.last_sleep = {
            "level": level,
            "seconds": time.perf_counter() - started,
            "bytes": moved,
        }

    def wake(self, tags: frozenset[str]) -> None:
        started = time.perf_counter()
        source = None
        moved = 0
        if "weights" in tags and not self.weights:
            moved = self._restore_weights()
            source = "pinned" if self.level == 1 else "file"
        kv_started = time.perf_counter()
        if "kv_cache" in tags:
            self._allocate_kv_cache()
        self._sync()
        finished = time.perf_counter()
        if self.weights and (self.kv_cache is not None or not self.kv_cache_bytes):
            self.level = None
        self.last_wake = {"tags": sorted(tags), "seconds": finished - started}
        if moved:
            # Kept apart from the last call: a wake in two steps (`tags=weights`, then the
            # rest) must not hide the figure that matters, the weights' copy back.
            seconds = kv_started - started
            self.last_weights_wake = {
                "source": source,
                "bytes": moved,
                "seconds": seconds,
                "bytesPerS": moved / seconds if seconds > 0 else None,
            }

    def _restore_weights(self) -> int:
        if self.level == 1:
            for name, host in self.backup.items():
                self.weights[name] = torch.empty_like(host, device=self.device)
                self.weights[name].copy_(host, non_blocking=self.cuda)
            self._sync()
            # Like vLLM, the host copy is freed once the weights are back on the device.
            self.backup = {}
        else:
            self.weights = self._load_file()
        return self._weights_size()

    # -- facts ---------------------------------------------------------------------------------

    def describe(self, *, checksum: bool = False) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "backend": self.name,
            "device": str(self.device),
            "torch": torch.__version__,
            "asleepLevel": self.level,
            "weightsBytes": self.weights_bytes,
            "weightsOnDeviceBytes": self._weights_size(),
            "weightsInHostBytes": sum(t.nbytes for t in self.backup.values()),
            "hostPinned": self.cuda and bool(self.backup),
            "kvCacheBytes": self.kv_cache.nbytes if self.kv_cache is not None else 0,
            "weightsFile": str(self.weights_file) if self.weights_file else None,
            "torchReservedBytes": torch.cuda.memory_reserved(self.device) if self.cuda else None,
            "torchAllocatedBytes": (
                torch.cuda.memory_allocated(self.device) if self.cuda else None
            ),
            "lastLoad": self.last_load,
            "lastSleep": self.last_sleep,
            "lastWake": self.last_wake,
            "lastWeightsWake": self.last_weights_wake,
            "pid": os.getpid(),
        }
        if checksum:
            source = self.weights or self.backup
            facts["checksum"] = self._checksum(source) if source else None
        return facts

    def close(self) -> None:
        self.weights, self.backup, self.kv_cache = {}, {}, None
        self._release()
        if self._own_file and self.weights_file is not None:
            self.weights_file.unlink(missing_ok=True)

    # -- helpers -------------------------------------------------------------------------------

    def _load_file(self) -> dict[str, torch.Tensor]:
        assert self.weights_file is not None
        tensors = load_file(str(self.weights_file), device=str(self.device))
        if not self.cuda:
            # On the CPU safetensors maps the file instead of reading it; copy, so the weights
            # really are loaded (and held) the way a device load would hold them.
            tensors = {k: v.clone() for k, v in tensors.items()}
        return tensors

    def _weights_size(self) -> int:
        return sum(t.nbytes for t in self.weights.values())

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _checksum(self, tensors: Mapping[str, torch.Tensor]) -> str:
        value = checksum(tensors)
        # The fold's scratch must not linger in the allocator and skew the next memory reading.
        self._release()
        return value

    def _release(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            # Without this the caching allocator keeps the freed blocks: torch would be done with
            # them, but the driver (and so NVML and the next process) would still see them used.
            torch.cuda.empty_cache()
