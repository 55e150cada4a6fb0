"""Memory backends for the simulated engine: what sleep and wake do to the weights.

The HTTP layer (`supervisor.sim.engine`) owns vLLM's wire contract: routes, bodies, which
requests are held. A backend owns the memory behind it. The default engine has none (it only
publishes simulated MiB to the shared state file); `--backend torch` plugs in
`torch_weights.TorchWeights`, which holds real tensors on a real device.

This module stays free of heavy imports: `python -m supervisor.sim` imports it on every start,
and torch is an optional dependency that only the torch backend loads.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

BACKENDS = ("sim", "torch")
# vLLM's wake tags: `/wake_up?tags=weights` restores the weights only, and the engine stays
# asleep until the KV cache is back too.
WAKE_TAGS = ("weights", "kv_cache")


class SimBackend(Protocol):
    """Memory a simulated engine holds. Every method blocks; the engine calls it in a thread."""

    name: str

    def allocate(self) -> None:
        """Load the weights and the KV cache; the engine reports healthy once this returns."""

    def sleep(self, level: int) -> None:
        """Level 1: weights to host memory, device memory released; level 2: weights dropped."""

    def wake(self, tags: frozenset[str]) -> None:
        """Bring back what `tags` names (a subset of WAKE_TAGS)."""

    def describe(self, *, checksum: bool = False) -> dict[str, Any]:
        """Memory facts for `/_sim/backend`: bytes where, timings of the last sleep and wake."""

    def close(self) -> None:
        """Release everything (the process is exiting)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the backend's command-line options (torch-free: parsing must not load torch)."""
    g = parser.add_argument_group("backend", "real memory behind sleep and wake")
    g.add_argument("--backend", choices=BACKENDS, default="sim")
    g.add_argument(
        "--device",
        default="auto",
        help="torch backend: auto (CUDA when there is one, else CPU), cuda or cpu",
    )
    g.add_argument(
        "--kv-cache-mib", type=int, default=0, help="torch backend: KV-cache stand-in size"
    )
    g.add_argument(
        "--weights-file",
        default=None,
        help="torch backend: safetensors file the weights load from (written first when "
        "missing); level-2 wake reloads from it",
    )
    g.add_argument("--chunk-mib", type=int, default=256, help="torch backend: size of one tensor")
    g.add_argument("--seed", type=int, default=0, help="torch backend: seed of the weights")


def check_arguments(parser: argparse.ArgumentParser, a: argparse.Namespace) -> dict[str, Any]:
    """Validate the backend options; return the torch backend's settings (empty for sim)."""
    if a.backend == "sim":
        if a.kv_cache_mib or a.weights_file or a.device != "auto":
            parser.error("--device, --kv-cache-mib and --weights-file need --backend torch")
        return {}
    if a.device not in ("auto", "cuda", "cpu"):
        parser.error(f"--device must be auto, cuda or cpu, got {a.device!r}")
    if a.kv_cache_mib < 0:
        parser.error("--kv-cache-mib must not be negative")
    if a.chunk_mib < 1:
        parser.error("--chunk-mib must be at least 1")
    return {
        "device": a.device,
        "kv_cache_mib": a.kv_cache_mib,
        "weights_file": a.weights_file,
        "chunk_mib": a.chunk_mib,
        "seed": a.seed,
    }


def build_backend(
    name: str, settings: Mapping[str, Any], *, weights_mib: int, gpu_index: int
) -> SimBackend | None:
    """Return the named backend (None for the plain simulator)."""
    if name == "sim":
        return None
    try:
        # Imported here: the module imports torch, a heavy optional dependency.
        from supervisor.sim.backends.torch_weights import TorchWeights  # noqa: PLC0415
    except ImportError as exc:
        raise SystemExit(f"--backend torch needs torch and safetensors installed: {exc}") from exc

    return TorchWeights(
        weights_mib=weights_mib, gpu_index=gpu_index, environ=os.environ, **dict(settings)
    )


def stop_on_sigterm(*, ignore: bool, log: Callable[[str], None]) -> threading.Event:
    """An event a trainer's loop stops on, set by SIGTERM (unless told to ignore it, as a
    trainer that hangs on shutdown would)."""
    stop = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        if ignore:
            log("SIGTERM received and ignored (--ignore-sigterm)")
            return
        stop.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    return stop


def cuda_ordinal(gpu_index: int, environ: Mapping[str, str]) -> int:
    """The CUDA device number for a GPU the supervisor named by its NVML index.

    The supervisor pins children with CUDA_VISIBLE_DEVICES, after which the pinned GPU is
    device 0 inside the process whatever its NVML index; without a pin the index is used as is.
    """
    visible = (environ.get("CUDA_VISIBLE_DEVICES") or "").strip()
    return 0 if visible else gpu_index
