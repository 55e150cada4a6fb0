"""`python -m supervisor.sim --port N --model NAME [...]`: run one simulated model server."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import fields

import uvicorn

from supervisor.gpu.sim_state import ENV_VAR, SimGpuState
from supervisor.sim import backends
from supervisor.sim.engine import SimEngine, SimOptions, build_app

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def parse_args(argv: list[str] | None = None) -> tuple[SimOptions, str]:
    p = argparse.ArgumentParser(
        prog="python -m supervisor.sim",
        description="A simulated OpenAI-compatible model server with vLLM's sleep endpoints.",
    )
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--weights-mib", type=int, default=0, help="what sleep frees, wake restores")
    p.add_argument("--context-mib", type=int, default=0, help="held even while asleep")
    p.add_argument("--gpu-index", type=int, default=0)
    p.add_argument(
        "--sim-state", default=os.environ.get(ENV_VAR) or None, help=f"default ${ENV_VAR}"
    )
    p.add_argument("--wake-latency-ms", type=int, default=0)
    p.add_argument("--sleep-latency-ms", type=int, default=0)
    p.add_argument("--ttft-ms", type=int, default=0, help="time to first token")
    p.add_argument("--token-delay-ms", type=int, default=0, help="delay between tokens")
    p.add_argument("--load-ms", type=int, default=0, help="startup time before /health is 200")
    p.add_argument("--reply", default=None, help="the text every completion answers with")
    p.add_argument("--echo", action="store_true", help="answer with the last user message")
    p.add_argument(
        "--generate",
        action="store_true",
        help="generate answers from the prompt's token ids, as long as max_tokens asks",
    )
    p.add_argument(
        "--eos-per-mille",
        type=int,
        default=0,
        help="with --generate: chance per 1000 word boundaries of ending with the EOS token",
    )
    p.add_argument(
        "--reemit-split-prompt",
        action="store_true",
        help="with --generate: as vLLM, a prompt ending mid-character re-sends its text",
    )
    p.add_argument("--start-asleep", action="store_true")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument(
        "--enable-server-load-tracking",
        dest="server_load_tracking",
        action="store_true",
        help="as vLLM's",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY") or None,
        help="like vLLM's: inference routes need this bearer key (default $VLLM_API_KEY)",
    )
    p.add_argument(
        "--lora-modules",
        nargs="*",
        default=[],
        metavar="NAME=PATH",
        help="as vLLM's: LoRA adapters served under their own names (the path is not read)",
    )
    g = p.add_argument_group("lora", "vLLM's runtime LoRA adapters (/v1/load_lora_adapter)")
    g.add_argument("--enable-lora", action="store_true", help="as vLLM's: adapters may load")
    g.add_argument("--max-loras", type=int, default=1, help="as vLLM's (sizes the cache)")
    g.add_argument("--max-lora-rank", type=int, default=16, help="as vLLM's: higher is refused")
    g.add_argument(
        "--max-cpu-loras",
        type=int,
        default=None,
        help="as vLLM's: adapters cached (default --max-loras); evicted ones are read again",
    )
    p.add_argument("--log-level", default="warning")
    backends.add_arguments(p)
    a = p.parse_args(argv)
    backend_settings = backends.check_arguments(p, a)
    for name in ("weights_mib", "context_mib", "wake_latency_ms", "ttft_ms", "token_delay_ms"):
        if getattr(a, name) < 0:
            p.error(f"--{name.replace('_', '-')} must not be negative")
    if a.max_loras < 1 or a.max_lora_rank < 1:
        p.error("--max-loras and --max-lora-rank must be at least 1")
    if a.max_cpu_loras is not None and a.max_cpu_loras < a.max_loras:
        p.error(f"--max-cpu-loras ({a.max_cpu_loras}) must be >= --max-loras ({a.max_loras})")
    if not 0 <= a.eos_per_mille <= 1000:
        p.error("--eos-per-mille must be between 0 and 1000")
    # The options' names are their fields' (argparse's dests); only these are read otherwise.
    given = {f.name: getattr(a, f.name) for f in fields(SimOptions) if hasattr(a, f.name)}
    given["lora_modules"] = tuple(m.split("=", 1)[0] for m in a.lora_modules)
    given["backend_settings"] = backend_settings
    # Read as vLLM reads it (vllm/envs.py): the routes exist only when this says so.
    flag = os.environ.get(RUNTIME_LORA_ENV, "0").strip().lower()
    given["runtime_lora_updating"] = flag in ("1", "true")
    return SimOptions(**given), a.log_level


def main(argv: list[str] | None = None) -> int:
    options, log_level = parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.WARNING),
        format=f"%(asctime)s %(levelname)s sim[{options.model}]: %(message)s",
        stream=sys.stderr,
    )
    state = SimGpuState(options.sim_state) if options.sim_state else None
    backend = backends.build_backend(
        options.backend,
        options.backend_settings,
        weights_mib=options.weights_mib,
        gpu_index=options.gpu_index,
    )
    engine = SimEngine(options, state, backend)
    uvicorn.run(
        build_app(engine),
        host=options.host,
        port=options.port,
        log_level=log_level,
        # Access logs would dominate the cost of a benchmark request.
        access_log=False,
        lifespan="on",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
