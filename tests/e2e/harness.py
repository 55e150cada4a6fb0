"""Real processes for end-to-end tests: simulated GPU hosts (supervisor + sim engines + sim
trainer) and the Haru server, on free ports, in a private work directory each.

Every process is started in its own session and killed by process group at teardown. The
supervisor's children run in sessions of their own (so a trainer's whole tree dies with one
killpg); they are found again by the host's private directory in their environment, which also
catches children orphaned by a crashed supervisor.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
TOKEN = "e2e-supervisor-token-0123456789"
MODELS = ("llama-small", "qwen-small")

# Short timings so a whole scenario takes seconds; still far above the sim latencies.
FAST_POLICY = {
    "autoFailover": True,
    "heartbeatStaleMs": 1500,
    "degradedGraceMs": 3000,
    "trainingStopGraceMs": 600,
    "stopTrainingTimeoutMs": 4000,
    "verifyGpuTimeoutMs": 1500,
    "wakeTimeoutMs": 2500,
    "probeTimeoutMs": 2500,
    "switchActiveTimeoutMs": 2000,
    "sleepTimeoutMs": 2500,
    "startTrainingTimeoutMs": 2500,
}


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    every: float = 0.05,
    *,
    gave_up: Callable[[], str | None] | None = None,
):
    """Poll `predicate` until it returns a truthy value; fail naming `what`.

    `gave_up` returns why waiting longer is pointless (a process that exited), or None; the
    wait then fails at once with that reason instead of at its deadline.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        reason = gave_up() if gave_up is not None else None
        if reason is not None:
            raise AssertionError(f"gave up waiting for {what}: {reason}")
        try:
            value = predicate()
        except Exception as exc:  # noqa: BLE001 - keep polling; report the last one
            last_error = exc
            value = None
        if value:
            return value
        time.sleep(every)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what} (last error: {last_error})"
    )


def exited(proc: subprocess.Popen, log_path: Path, lines: int = 30) -> Callable[[], str | None]:
    """A `gave_up` for `wait_for`: the exit status and the log's last lines once `proc` exits."""

    def reason() -> str | None:
        status = proc.poll()
        if status is None:
            return None
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        tail = "\n".join(text.splitlines()[-lines:])
        return f"the process exited with status {status}; its log ends:\n{tail}"

    return reason


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def pids_with_env(marker: str) -> list[int]:
    """Return the live processes whose environment mentions `marker` (a private directory)."""
    needle = marker.encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                out.append(int(entry.name))
        except OSError:
            continue
    return out


class SimHost:
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
    ) -> None:
        self.name = name
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.model_ports = {m: free_port() for m in MODELS}
        # LoRA adapters each model serves (the sim answers them by name, as vLLM does).
        self.adapters = adapters or {}
        self.checkpoints = self.dir / "checkpoints"
        self.log_path = self.dir / "supervisor.log"
        self.proc: subprocess.Popen | None = None
        self.token = TOKEN
        engine_args = [
            "--weights-mib", str(weights_mib), "--context-mib", "768",
            "--wake-latency-ms", str(wake_latency_ms),
            "--sleep-latency-ms", str(sleep_latency_ms),
        ]  # fmt: skip
        if start_asleep:
            engine_args.append("--start-asleep")
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
                                "extraArgs": [
                                    *engine_args,
                                    *(
                                        ["--lora-modules", *(f"{a}=/dev/null" for a in names)]
                                        if (names := self.adapters.get(m))
                                        else []
                                    ),
                                ],
                            },
                            # As `manage.py supervisor_config` writes them from the plan.
                            **(
                                {"memoryMiB": weights_mib + 768, "sleepResidueMiB": 768}
                                if planned_memory
                                else {}
                            ),
                        }
                        for m, p in self.model_ports.items()
                    ],
                },
                {
                    "kind": "training",
                    "gpuIndex": 0,
                    "command": [
                        PYTHON,
                        "-m",
                        "supervisor.sim.trainer",
                        "--memory-mib",
                        "40960",
                        "--step-s",
                        "0.02",
                        "--checkpoint-every-s",
                        "0.3",
                        "--sigterm-save-s",
                        "0.05",
                        *trainer_args,
                    ],  # fmt: skip
                    "checkpointDir": str(self.checkpoints),
                    "graceMs": grace_ms,
                },
            ],
        }
        (self.dir / "config.json").write_text(json.dumps(self.config, indent=1))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def layout_domain(self, priority: int) -> dict:
        """Return this host as a domain of a fleet layout."""
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
        env = {
            **os.environ,
            "PORT": str(self.port),
            "HARU_SUPERVISOR_TOKEN": self.token,
            "HARU_SUPERVISOR_CONFIG": str(self.dir / "config.json"),
            # Marks every child of this host, orphans included (see pids_with_env).
            "HARU_E2E_HOST_DIR": str(self.dir),
        }
        for key in ("DATABASE_URL", "REDIS_URL"):
            env.pop(key, None)
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "supervisor"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        if wait:
            wait_for(
                self.ready,
                20,
                f"supervisor {self.name} ready",
                gave_up=exited(self.proc, self.log_path),
            )
        return self

    def ready(self) -> bool:
        body = self.get("/v1/status", raw=True)
        # Up and every sleep state known (`ready` means "every model awake", which a
        # standby started asleep never is).
        return body.status_code == 200 and body.json()["stateKnown"]

    def stop(self) -> None:
        """SIGTERM the supervisor (it stops its children), then kill anything left."""
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.crash()

    def crash(self) -> None:
        """SIGKILL the supervisor and every child it started: the host went down."""
        if self.proc is not None:
            kill_group(self.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        for pid in pids_with_env(str(self.dir)):
            kill_group(pid)
            kill_group_of(pid)
        # SIGKILL is asynchronous: the host is down once its processes are (a zombie has no
        # environment left, and its sockets are closed), so what follows starts after that.
        gone = f"{self.name}'s processes gone"
        wait_for(lambda: not pids_with_env(str(self.dir)), 10, gone, every=0.002)

    def restart(self, **kwargs) -> SimHost:
        self.crash()
        for port in (self.port, *self.model_ports.values()):
            wait_for(lambda p=port: port_free(p), 10, f"port {port} free")
        return self.start(**kwargs)

    # -- calls -----------------------------------------------------------------------------

    def get(self, path: str, *, token: str | None = "default", raw: bool = False):
        return self._call("GET", path, None, token, raw)

    def post(self, path: str, body: dict | None = None, *, raw: bool = False):
        return self._call("POST", path, body, "default", raw)

    def _call(self, method, path, body, token, raw):
        token = self.token if token == "default" else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = httpx.request(
            method, self.url + path, json=body, headers=headers, timeout=10, trust_env=False
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

    def fault(self, model: str, **faults: bool) -> dict:
        """Inject faults (wakeFails, wakeHangs, inference5xx, ...) into one sim engine."""
        wire = dict(faults)
        url = f"http://127.0.0.1:{self.model_ports[model]}/_sim/faults"
        response = httpx.post(url, json=wire, timeout=5, trust_env=False)
        response.raise_for_status()
        return response.json()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def kill_group_of(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgid(pid), signal.SIGKILL)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        # As the servers bind: a closed listener's TIME_WAIT connections do not block it.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def fleet_layout(
    east: SimHost, west: SimHost, policy: dict | None = None, slug: str = "e2e"
) -> dict:
    return {
        "slug": slug,
        "activeDomainSlug": "east",
        "policy": {**FAST_POLICY, **(policy or {})},
        "domains": [east.layout_domain(10), west.layout_domain(20)],
    }


def put_in_standby_posture(host: SimHost) -> None:
    """Sleep a host's models and start its trainer directly (a fresh standby, before Haru)."""
    host.post("/v1/vllm/sleep")
    host.post("/v1/training/start")
    wait_for(lambda: host.trainer()["state"] == "running" and host.trainer()["pids"], 10, "trainer")


class ServerProc:
    """`manage.py serve` with its own database, var dir, port and reconcile loop."""

    def __init__(self, workdir: Path, *, env: dict[str, str]) -> None:
        self.dir = workdir / "server"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.api_token = "e2e-api-token-abcdef"
        self.log_path = self.dir / "server.log"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("HARU_")},
            "HARU_VAR_DIR": str(self.dir / "var"),
            "HARU_API_TOKEN": self.api_token,
            "HARU_SUPERVISOR_TOKEN": TOKEN,
            "HARU_RECONCILE_INTERVAL_MS": "200",
            **env,
        }
        self.env.pop("REDIS_URL", None)  # the embedded loop, not Celery
        self.proc: subprocess.Popen | None = None

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, "manage.py", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    def start(self, *args: str) -> ServerProc:
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [PYTHON, "manage.py", "serve", "--port", str(self.port), *args],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        wait_for(self.healthy, 20, "server /healthz", gave_up=exited(self.proc, self.log_path))
        return self

    def healthy(self) -> bool:
        return httpx.get(f"{self.url}/healthz", timeout=2, trust_env=False).status_code == 200

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            kill_group(self.proc.pid)

    def api(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.url}/v1{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.api_token}"},
            timeout=30,
            trust_env=False,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
