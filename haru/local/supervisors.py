"""Simulated GPU hosts: `python -m supervisor` in managed mode with simulated engines and a
simulated trainer, each host in a private directory of its own.

The supervisor's children run in sessions of their own (so a trainer's whole tree dies with
one killpg); they are found again by the host's private directory in their environment, which
also catches children orphaned by a crashed supervisor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from functools import partial
from pathlib import Path
from typing import Any, Self

import httpx

from common.ports import free_port, port_free
from fleets.base.setting_table import SetByHaru

from . import PYTHON
from .processes import exited, kill_group, kill_group_of, pids_with_env, spawn, stop, wait_for

# The supervisor token a simulated host gets unless told otherwise (the control plane is
# configured with the same one).
TOKEN = "e2e-supervisor-token-0123456789abcdef"
MODELS = ("llama-small", "qwen-small")
# Marks every child of a simulated host, orphans included (see pids_with_env).
HOST_DIR_ENV = SetByHaru.local_host_dir.env


def start_supervisor(
    *, port: int, config: str, token: str, log: Path, env: dict[str, str]
) -> subprocess.Popen:
    """Start `python -m supervisor` on `port` with `config` (a path, or the JSON itself)."""
    env = {
        **env,
        "PORT": str(port),
        "HARU_SUPERVISOR_CONFIG": config,
        "HARU_SUPERVISOR_TOKEN": token,
    }
    return spawn([PYTHON, "-m", "supervisor"], env=env, log=log)


def supervisor_ready(url: str, token: str) -> bool:
    """Whether the supervisor answers and knows every model's sleep state (`ready` means
    "every model awake", which a standby started asleep never is)."""
    r = httpx.get(
        f"{url}/v1/status",
        headers={"Authorization": f"Bearer {token}"},
        timeout=2,
        trust_env=False,
    )
    return r.status_code == 200 and r.json().get("stateKnown") is True


def supervisor_children(url: str, token: str) -> list[int]:
    """Return the PIDs of the engines and trainers a supervisor reports (each leads a process
    group of its own, so a caller's teardown can kill them if the supervisor died first)."""
    with httpx.Client(base_url=url, timeout=5, trust_env=False) as c:
        body = c.get("/v1/status", headers={"Authorization": f"Bearer {token}"}).json()
    pids: list[int] = []
    for slot in body.get("slots", []):
        for model in slot.get("models") or []:
            pid = (model.get("process") or {}).get("pid")
            if pid:
                pids.append(pid)
        pids.extend((slot.get("training") or {}).get("pids") or [])
    return pids


def sim_trainer(
    *args: str,
    memory_mib: int = 40960,
    step_s: float = 0.02,
    checkpoint_every_s: float = 0.3,
    sigterm_save_s: float | None = 0.05,
) -> list[str]:
    """Return the simulated trainer's command line, by default fast enough for a scenario of
    seconds (`sigterm_save_s=None`: the trainer's own default)."""
    argv = [
        PYTHON, "-m", "supervisor.sim.trainer", "--memory-mib", str(memory_mib),
        "--step-s", str(step_s), "--checkpoint-every-s", str(checkpoint_every_s),
    ]  # fmt: skip
    if sigterm_save_s is not None:
        argv += ["--sigterm-save-s", str(sigterm_save_s)]
    return [*argv, *args]


def adapter_trainer_args(
    name: str,
    model: str,
    *,
    publish_every_s: float,
    bad_versions: tuple[int, ...] = (),
    bad_error_rate: float = 0.5,
) -> tuple[str, ...]:
    """Return the simulated trainer's flags that make it publish a servable LoRA adapter of
    `model` named `name` every `publish_every_s` seconds (docs/adapters.md); the versions it
    publishes in `bad_versions` (counted from 1 by this run of the trainer) fail a share
    `bad_error_rate` of their requests on the simulated engine, which a rollout's gates catch."""
    args = ["--adapter-name", name, "--served-model", model]
    args += ["--publish-every-s", str(publish_every_s)]
    if bad_versions:
        args += ["--bad-versions", ",".join(str(v) for v in bad_versions)]
        args += ["--bad-error-rate", str(bad_error_rate)]
    return tuple(args)


def _engine_args(wake_latency_ms: int, sleep_latency_ms: int, weights_mib: int, asleep: bool):
    args = [
        "--weights-mib", str(weights_mib), "--context-mib", "768",
        "--wake-latency-ms", str(wake_latency_ms),
        "--sleep-latency-ms", str(sleep_latency_ms),
    ]  # fmt: skip
    return [*args, "--start-asleep"] if asleep else args


class SupervisedHost:
    """What every local stand-in for a GPU host shares (SimHost here, VllmHost in
    vllm_hosts.py): a supervisor in managed mode in a directory of its own, its lifecycle
    (stop, crash, restart) and the calls tests and benchmarks make to it. A subclass sets
    `name`, `dir`, `port`, `model_ports`, `log_path`, `token`, `proc` and `url`, and the
    timeouts its engines need."""

    name: str
    dir: Path
    port: int
    model_ports: dict[str, int]
    log_path: Path
    token: str
    proc: subprocess.Popen | None
    # How long a stop may take, how long its processes may take to go after a SIGKILL (and how
    # often to look), and how long one call to the supervisor may take.
    STOP_GRACE_S = 10.0
    GONE_TIMEOUT_S = 10.0
    GONE_EVERY_S = 0.002
    CALL_TIMEOUT_S = 10.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, token: str | None = None, wait: bool = True) -> Any:
        """Start the supervisor (each host its own way); `token` overrides the default."""
        raise NotImplementedError

    def ready(self) -> bool:
        return supervisor_ready(self.url, self.token)

    def stop(self) -> None:
        """SIGTERM the supervisor (it stops its children), then kill anything left."""
        if self.proc is not None:
            stop(self.proc, grace_s=self.STOP_GRACE_S)
        self.crash()

    def crash(self) -> None:
        """SIGKILL the supervisor and every child it started: the host went down."""
        if self.proc is not None:
            stop(self.proc, grace_s=0, sig=signal.SIGKILL)
        for pid in pids_with_env(str(self.dir)):
            kill_group(pid)
            kill_group_of(pid)
        # SIGKILL is asynchronous: the host is down once its processes are (a zombie has no
        # environment left, and its sockets are closed), so what follows starts after that.
        gone = f"{self.name}'s processes gone"
        alive = partial(pids_with_env, str(self.dir))
        wait_for(lambda: not alive(), self.GONE_TIMEOUT_S, gone, every=self.GONE_EVERY_S)

    def restart(self, **kwargs: Any) -> Self:
        self.crash()
        for port in (self.port, *self.model_ports.values()):
            wait_for(partial(port_free, port), self.GONE_TIMEOUT_S, f"port {port} free")
        return self.start(**kwargs)

    # -- calls -----------------------------------------------------------------------------

    def get(self, path: str, *, token: str | None = "default", raw: bool = False) -> Any:
        return self._call("GET", path, None, token, raw)

    def post(self, path: str, body: dict | None = None, *, raw: bool = False) -> Any:
        return self._call("POST", path, body, "default", raw)

    def _call(self, method: str, path: str, body: dict | None, token: str | None, raw: bool) -> Any:
        token = self.token if token == "default" else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = httpx.request(
            method,
            self.url + path,
            json=body,
            headers=headers,
            timeout=self.CALL_TIMEOUT_S,
            trust_env=False,
        )
        if raw:
            return response
        response.raise_for_status()
        return response.json()

    def status(self) -> dict:
        return self.get("/v1/status")

    def asleep(self) -> dict[str, bool | None]:
        return {
            m["name"]: m["sleeping"]
            for s in self.status()["slots"]
            if s["kind"] == "inference"
            for m in s["models"]
        }

    def trainer(self) -> dict:
        return next(s["training"] for s in self.status()["slots"] if s["kind"] == "training")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class SimHost(SupervisedHost):
    """One simulated GPU host: a supervisor in managed mode with two sim engines and a trainer."""

    def __init__(
        self,
        name: str,
        workdir: Path,
        *,
        wake_latency_ms: int = 150,
        sleep_latency_ms: int = 30,
        trainer_args: tuple[str, ...] = (),
        grace_ms: int = 600,
        start_asleep: bool = False,
        weights_mib: int = 6144,
        planned_memory: bool = False,
        adapters: dict[str, list[str]] | None = None,
        engine_args: tuple[str, ...] = (),
        lora: dict[str, int] | None = None,
    ) -> None:
        self.name = name
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.model_ports = {m: free_port() for m in MODELS}
        # LoRA adapters each model serves (the sim answers them by name, as vLLM does).
        self.adapters = adapters or {}
        # Runtime LoRA loading (the profile's `lora`, e.g. {"maxLoras": 2, "maxLoraRank": 8}):
        # the supervisor starts each engine with vLLM's flags for it, and the registry loads
        # the trainer's adapters through it (docs/adapters.md).
        self.lora = lora
        self.checkpoints = self.dir / "checkpoints"
        self.log_path = self.dir / "supervisor.log"
        self.proc: subprocess.Popen | None = None
        self.token = TOKEN
        # `engine_args`: more of the sim engine's flags (e.g. `--token-delay-ms` for streams
        # long enough to be cut mid-answer).
        engine_args = (
            *_engine_args(wake_latency_ms, sleep_latency_ms, weights_mib, start_asleep),
            *engine_args,
        )
        # As `manage.py supervisor_config` writes them from the plan.
        memory = {"memoryMiB": weights_mib + 768, "sleepResidueMiB": 768} if planned_memory else {}
        self.config = {
            "host": name,
            "gpu": {
                "backend": "sim",
                "simStateFile": str(self.dir / "sim-gpu.json"),
                "simGpus": [
                    {"index": 0, "totalMiB": 81920, "name": "SIM-H100", "computeCapability": "9.0"}
                ],
            },
            "slots": [
                {
                    "kind": "inference",
                    "gpuIndex": 0,
                    "models": [
                        {
                            "name": m,
                            "port": p,
                            "profile": {
                                "engine": "sim",
                                "extraArgs": [*engine_args, *self._lora_args(m)],
                                **({"lora": lora} if lora else {}),
                            },
                            **memory,
                        }
                        for m, p in self.model_ports.items()
                    ],
                },
                {
                    "kind": "training",
                    "gpuIndex": 0,
                    "command": sim_trainer(*trainer_args),
                    "checkpointDir": str(self.checkpoints),
                    "graceMs": grace_ms,
                },
            ],
        }
        (self.dir / "config.json").write_text(json.dumps(self.config, indent=1))

    def boot_awake(self) -> None:
        """Start the engines awake from the next start on, as a real engine does: a host
        started as a fresh standby (`start_asleep`) must come back serving when it is restarted
        as the active."""
        slots: list[dict[str, Any]] = self.config["slots"]  # type: ignore[assignment]
        for slot in slots:
            for model in slot.get("models", []):
                args = model["profile"]["extraArgs"]
                model["profile"]["extraArgs"] = [a for a in args if a != "--start-asleep"]
        (self.dir / "config.json").write_text(json.dumps(self.config, indent=1))

    def _lora_args(self, model: str) -> list[str]:
        names = self.adapters.get(model)
        return ["--lora-modules", *(f"{a}=/dev/null" for a in names)] if names else []

    def layout_domain(self, priority: int, engine: str | None = None) -> dict:
        """Return this host as a domain of a fleet layout; `engine`, when given, is named in
        each binding's profile."""
        profile: dict[str, Any] = {"profile": {"engine": engine}} if engine else {}
        if self.lora:
            # The binding says what its server runs: runtime LoRA on the simulated engine.
            profile = {"profile": {"engine": engine or "sim", "lora": self.lora}}
        return {
            "slug": self.name,
            "provider": "static",
            "priority": priority,
            "supervisorUrl": self.url,
            "servingBaseUrl": f"http://127.0.0.1:{self.model_ports['qwen-small']}",
            "slots": [
                {
                    "kind": "inference",
                    "gpuIndex": 0,
                    "sleepLevel": 1,
                    "models": [
                        {
                            "name": m,
                            "servingUrl": f"http://127.0.0.1:{p}",
                            **profile,
                            **({"adapters": self.adapters[m]} if m in self.adapters else {}),
                        }
                        for m, p in self.model_ports.items()
                    ],
                },
                {
                    "kind": "training",
                    "gpuIndex": 0,
                    "command": ["python3", "-m", "supervisor.sim.trainer"],
                    "checkpointDir": str(self.checkpoints),
                },
            ],
        }

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, *, token: str | None = None, wait: bool = True) -> SimHost:
        """Start the supervisor; `token` overrides the one Haru is configured with."""
        self.token = token or TOKEN
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env[HOST_DIR_ENV] = str(self.dir)
        self.proc = start_supervisor(
            port=self.port,
            config=str(self.dir / "config.json"),
            token=self.token,
            log=self.log_path,
            env=env,
        )
        if wait:
            wait_for(
                self.ready,
                20,
                f"supervisor {self.name} ready",
                gave_up=exited(self.proc, self.log_path),
            )
        return self

    def fault(self, model: str, **faults: bool) -> dict:
        """Inject faults (wakeFails, wakeHangs, inference5xx, ...) into one sim engine."""
        url = f"http://127.0.0.1:{self.model_ports[model]}/_sim/faults"
        response = httpx.post(url, json=dict(faults), timeout=5, trust_env=False)
        response.raise_for_status()
        return response.json()


def put_in_standby_posture(host: SimHost) -> None:
    """Sleep a host's models and start its trainer directly (a fresh standby, before Haru)."""
    host.post("/v1/vllm/sleep")
    host.post("/v1/training/start")
    wait_for(lambda: host.trainer()["state"] == "running" and host.trainer()["pids"], 10, "trainer")
