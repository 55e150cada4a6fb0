"""Run the supervisor: read the environment and config, bind, serve, shut down in bounds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import uvicorn

from common.edge.handshake import handshake_bounded_loops
from common.edge.limits import EdgeLimits, fit_descriptors
from common.edge.protocol import BodyRoute, EdgeHttpProtocol, protocol_with
from common.loopback import is_loopback
from common.strict_json import ConfigError
from supervisor.api import create_app
from supervisor.config import (
    SupervisorConfig,
    load_config,
    state_dir_for,
    validate_against_hardware,
)
from supervisor.engines.profile import GpuSpec
from supervisor.engines.registry import EngineRegistry, default_registry
from supervisor.gpu.facts import GpuBackend, GpuQueryFailed, GpuUnavailable
from supervisor.gpu.nvml import NvmlBackend
from supervisor.gpu.sim_backend import SimGpuBackend
from supervisor.gpu.sim_state import SimGpuState
from supervisor.host import Host, HostDeps
from supervisor.records import StateDir, StateDirBusy
from supervisor.settings import (
    AdapterLimits,
    Settings,
    SettingsError,
    SupervisorSettings,
    settings_from_env,
)
from supervisor.tls import ServerTls, certificate_names, server_tls

log = logging.getLogger("supervisor")

# A signalled supervisor gives trainers up to 30 s; past this it kills everything and exits,
# so a wedged child can never keep a host from restarting.
HARD_EXIT_S = 40.0
# Open HTTP connections get this long to finish once shutdown starts.
GRACEFUL_HTTP_S = 5


def build_gpu_backend(config: SupervisorConfig) -> GpuBackend:
    """Pick NVML or the simulated backend, as the config says."""
    if config.gpu.backend == "sim":
        assert config.gpu.sim_state_file is not None
        return SimGpuBackend(
            SimGpuState(config.gpu.sim_state_file), config.gpu.sim_gpus, host=config.host
        )
    return NvmlBackend()


def hardware_facts(backend: GpuBackend) -> dict[int, GpuSpec]:
    """Read GPU types and capabilities for validation; empty when the GPUs cannot be read."""
    try:
        gpus = backend.read_sync()
    except (GpuUnavailable, GpuQueryFailed) as exc:
        log.warning("cannot read GPU facts (%s); profiles are checked without them", exc)
        return {}
    return {g.index: GpuSpec(g.index, g.name, g.compute_capability) for g in gpus}


class SupervisorServer(uvicorn.Server):
    """uvicorn, plus: stop trainers at the first signal and hard-exit if that overruns."""

    def __init__(
        self,
        config: uvicorn.Config,
        host: Host,
        hard_exit_s: float = HARD_EXIT_S,
        *,
        handshake_timeout_s: float,
    ):
        super().__init__(config)
        self.host = host
        self.hard_exit_s = hard_exit_s
        self.handshake_timeout_s = handshake_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        # Like uvicorn's, on a loop whose TLS servers bound the handshake: the edge's protocol
        # meets a connection only once its handshake is done (common/edge/handshake.py).
        with asyncio.Runner(loop_factory=handshake_bounded_loops(self.handshake_timeout_s)) as r:
            r.run(self.serve(sockets=sockets))

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: object) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)  # type: ignore[arg-type]
        if first:
            log.warning("received %s: stopping", signal.Signals(sig).name)
            threading.Thread(target=self._hard_exit, daemon=True, name="hard-exit").start()
            if self._loop is not None:
                # Start stopping trainers now, not after uvicorn has drained its connections.
                self._loop.call_soon_threadsafe(self.host.begin_shutdown)
        elif self.force_exit:
            log.error("second signal: killing every child now")
            self.host.kill_now()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # Like uvicorn's, minus re-raising the signal afterwards: an orderly stop exits 0.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def _hard_exit(self) -> None:
        threading.Event().wait(self.hard_exit_s)
        log.error("shutdown took longer than %.0fs: killing children and exiting", self.hard_exit_s)
        self.host.kill_now()
        os._exit(1)


def edge_protocol(
    limits: EdgeLimits, token: str | None = None, adapters: AdapterLimits | None = None
) -> type[EdgeHttpProtocol]:
    """The HTTP protocol serving the API with the edge's deadlines and limits, its connection
    cap fitted to the open-file limit (raised as far as the cap needs); with a token, a request
    waits for its body only if it bears the token (every route: `/healthz` takes no body). The
    adapter chunk upload alone has a body cap and deadline of its own (`adapter_body_route`)."""
    fitted = fit_descriptors(limits, setting="HARU_SUPERVISOR_HTTP_MAX_CONNECTIONS", log=log)
    log.info(
        "HTTP edge: headers within %gs, body within %gs, keep-alive idle %gs, headers at most "
        "%d bytes and %d fields, bodies at most %d bytes, at most %d connections (%d per "
        "address)",
        fitted.header_timeout_s,
        fitted.body_timeout_s,
        fitted.keepalive_timeout_s,
        fitted.max_header_bytes,
        fitted.max_headers,
        fitted.max_body_bytes,
        fitted.max_connections,
        fitted.max_connections_per_address,
    )
    return protocol_with(
        fitted,
        body_setting="HARU_SUPERVISOR_HTTP_MAX_BODY_BYTES",
        token=token,
        body_routes=(adapter_body_route(adapters or AdapterLimits()),),
    )


# `PUT /v1/adapters/{id}/files/{path}?offset=N` (supervisor/api.py), as the edge sees its raw
# request target: nothing else gets the chunk cap.
ADAPTER_CHUNK_TARGET = re.compile(rb"^/v1/adapters/[0-9a-f]{32}/files/[A-Za-z0-9._-]{1,128}(\?|\Z)")


def adapter_body_route(adapters: AdapterLimits) -> BodyRoute:
    return BodyRoute(
        b"PUT",
        ADAPTER_CHUNK_TARGET,
        adapters.chunk_bytes,
        adapters.chunk_timeout_s,
        "HARU_SUPERVISOR_ADAPTER_CHUNK_BYTES",
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before anything starts, so a taken port fails fast and leaves no children behind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    # Close-on-exec, and kept so: uvloop ignores close_fds, so an inheritable socket would leak
    # into every model server and trainer, and after a supervisor crash those orphans would hold
    # its port and swallow the connections meant for the supervisor that replaces it.
    sock.set_inheritable(False)
    return sock


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # httpx logs every request at INFO; with heartbeats every few seconds that drowns the log.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def prepare(
    environ: Mapping[str, str], cwd: Path, registry: EngineRegistry | None = None
) -> tuple[Settings, SupervisorConfig, GpuBackend]:
    """Validate settings, config and profiles; raise SettingsError or ConfigError."""
    registry = registry or default_registry()
    settings = settings_from_env(environ)
    config = load_config(settings.config_source, cwd=cwd, registry=registry)
    ports = {m.port: m.path for m in config.models}
    if settings.port in ports:
        raise ConfigError(
            [f"{ports[settings.port]}.port: {settings.port} is the supervisor's own PORT"]
        )
    config = replace(config, state_dir=state_dir_for(config, port=settings.port, cwd=cwd))
    backend = build_gpu_backend(config)
    if any(m.profile for m in config.models):
        problems = validate_against_hardware(config, hardware_facts(backend), registry)
        if problems:
            raise ConfigError(problems)
    return settings, config, backend


def log_exposure(settings: Settings, tls: ServerTls | None) -> None:
    """Say at start-up who can reach the API: no token (loopback only), a weak one, TLS."""
    if settings.token is None:
        log.warning(
            "!!! HARU_SUPERVISOR_TOKEN is not set: the API is UNAUTHENTICATED and listens on "
            "%s only. Set a token before exposing this supervisor. !!!",
            settings.bind_host,
        )
    elif settings.token_weakness is not None:  # only on loopback: beyond, settings refused it
        log.warning("HARU_SUPERVISOR_TOKEN %s", settings.token_weakness)
    if not is_loopback(settings.bind_host):
        log.info("listening beyond loopback on %s (token required)", settings.bind_host)
    if tls is not None:
        # The fingerprint is public (a hash of the certificate): it is what the layout's
        # supervisorFingerprint pins.
        log.info("serving HTTPS: certificate %s, fingerprint %s", tls.source, tls.fingerprint)
    elif not is_loopback(settings.bind_host):
        log.warning(
            "!!! serving PLAIN HTTP beyond loopback on %s (HARU_SUPERVISOR_TLS=plain-http): the "
            "token and every answer cross the network in clear. !!!",
            settings.bind_host,
        )


def uvicorn_config(app: Any, settings: Settings, tls: ServerTls | None = None) -> uvicorn.Config:
    """uvicorn serving the API behind the HTTP edge, as the settings say, over `tls` if any."""
    return uvicorn.Config(
        app,
        # Deadlines and limits at the edge, before the token is checked: a flood of idle or
        # slowloris connections must not run the supervisor out of descriptors, or the
        # control plane's heartbeats would fail and fail over a healthy active.
        http=edge_protocol(settings.edge, settings.token, settings.adapters),
        # No route is a WebSocket: the edge refuses every upgrade request (400), and none is
        # ever handed to a WebSocket protocol.
        ws="none",
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_HTTP_S,
        log_config=None,
        ssl_context_factory=tls.factory() if tls is not None else None,
    )


def tls_fingerprint(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> int:
    """`python -m supervisor tls-fingerprint`: print the fingerprint of the certificate this
    supervisor serves (with the same environment), making the self-signed one if it has none
    yet, so the operator can pin it in the layout before the first start. Run it as the account
    the supervisor runs as: the files it makes belong to that account."""
    environ = dict(os.environ if environ is None else environ)
    cwd = cwd or Path.cwd()
    try:
        settings = settings_from_env(environ)
        config = load_config(settings.config_source, cwd=cwd, registry=default_registry())
        state_dir = state_dir_for(config, port=settings.port, cwd=cwd)
        tls = server_tls(settings, state_dir, certificate_names(settings.bind_host, config.host))
    except SettingsError as exc:
        print(f"haru-supervisor: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"haru-supervisor: invalid config:\n{exc.render()}", file=sys.stderr)
        return 2
    if tls is None:
        print(
            f"haru-supervisor: serves plain HTTP on {settings.bind_host} (no certificate): "
            "HTTPS is the default beyond loopback, or set HARU_SUPERVISOR_TLS=on",
            file=sys.stderr,
        )
        return 1
    print(tls.fingerprint)
    print(f"# {tls.source}; layout: supervisorFingerprint: {tls.fingerprint}", file=sys.stderr)
    return 0


def main(environ: Mapping[str, str] | None = None) -> int:
    """Run until signalled; return the process exit status."""
    environ = dict(os.environ if environ is None else environ)
    configure_logging((environ.get(SupervisorSettings.log_level.env) or "info").strip() or "info")
    try:
        settings, config, backend = prepare(environ, Path.cwd())
        assert config.state_dir is not None  # resolved by prepare()
        names = certificate_names(settings.bind_host, config.host)
        tls = server_tls(settings, config.state_dir, names)
    except SettingsError as exc:
        log.error("cannot start: %s", exc)
        print(f"haru-supervisor: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        log.error("cannot start: invalid config")
        print(f"haru-supervisor: invalid config:\n{exc.render()}", file=sys.stderr)
        return 2
    log_exposure(settings, tls)
    try:
        sock = bind_socket(settings.bind_host, settings.port)
    except OSError as exc:
        print(
            f"haru-supervisor: cannot listen on {settings.bind_host}:{settings.port}: "
            f"{exc.strerror}",
            file=sys.stderr,
        )
        return 1
    state = StateDir(config.state_dir)
    try:
        # After the bind: a second supervisor on this port has already failed above, so a busy
        # state dir means a stateDir shared by two supervisors, which would adopt each other's.
        state.acquire()
    except (OSError, StateDirBusy) as exc:
        sock.close()
        print(f"haru-supervisor: cannot use state dir {config.state_dir}: {exc}", file=sys.stderr)
        return 1
    try:
        deps = HostDeps(gpu=backend, environ=environ, state=state, adapters=settings.adapters)
        host = Host(config, deps)
    except ConfigError as exc:
        sock.close()
        state.release()
        print(f"haru-supervisor: invalid config:\n{exc.render()}", file=sys.stderr)
        return 2
    app = create_app(host, token=settings.token)
    server = SupervisorServer(
        uvicorn_config(app, settings, tls),
        host,
        # A TLS handshake gets the header deadline, as the first request's headers do.
        handshake_timeout_s=settings.edge.header_timeout_s,
    )
    log.info(
        "supervisor%s on %s://%s:%s: %d model(s), %d training slot(s), GPU backend %s, "
        "state dir %s",
        f" {config.host}" if config.host else "",
        "https" if tls is not None else "http",
        settings.bind_host,
        settings.port,
        len(config.models),
        len(config.training_slots),
        backend.name,
        config.state_dir,
    )
    server.run(sockets=[sock])
    return 0 if server.started else 1
