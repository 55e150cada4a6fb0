"""The supervisor's HTTPS: which certificate it serves, and the server-side TLS context.

Beyond loopback the supervisor serves HTTPS unless plain HTTP is asked for by name
(`HARU_SUPERVISOR_TLS=plain-http`, settings.py). The certificate, in order:
- the operator's files (`HARU_SUPERVISOR_TLS_CERT` / `_KEY`), for a private CA the control plane
  verifies with `HARU_SUPERVISOR_CA_BUNDLE`;
- the PEM text a provisioned host is handed (`HARU_SUPERVISOR_TLS_CERT_PEM` / `_KEY_PEM`): the
  control plane made it and pinned its fingerprint before the launch;
- else a self-signed one made once in the state dir (`tls/`, the key mode 0600) and kept across
  restarts, so the fingerprint the operator pinned in the layout stays true.

The fingerprint is logged at start-up and printed by `python -m supervisor tls-fingerprint`;
it is public (a hash of the certificate). The key is never logged, shown or put in an error.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.tls_identity import generate
from common.tls_pin import PinError, fingerprint_of_pem
from supervisor.settings import Settings, SettingsError

# Under the state dir: the self-signed identity, kept so its pin stays valid across restarts.
TLS_DIR = "tls"
CERT_NAME = "supervisor.pem"
KEY_NAME = "supervisor.key"
# A staging folder older than this was left by a killed process (making one takes milliseconds).
LEFTOVER_AGE_S = 60.0


@dataclass(frozen=True)
class ServerTls:
    """What the supervisor serves HTTPS with: the context, its certificate's pin, its source."""

    context: ssl.SSLContext
    fingerprint: str
    source: str  # for the start-up log line: a path, "provisioned", "self-signed in <dir>"

    def factory(self) -> Callable[[Any, Callable[[], ssl.SSLContext]], ssl.SSLContext]:
        """uvicorn's `ssl_context_factory`: this context, whatever uvicorn would have built."""
        return lambda _config, _default: self.context


def server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A TLS server context (1.2 at least) with this certificate chain and key."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # An empty password: an encrypted key fails at once (OpenSSL would otherwise prompt on a
    # terminal a service does not have).
    context.load_cert_chain(str(cert_file), str(key_file), password=lambda: b"")
    return context


def server_tls(settings: Settings, state_dir: Path, names: list[str]) -> ServerTls | None:
    """The HTTPS the settings ask for, or None for plain HTTP; raise SettingsError when a
    certificate cannot be read or made (the supervisor then refuses to start: it never falls
    back to plain HTTP by itself). `names` go into a new self-signed certificate."""
    if not settings.serves_tls:
        return None
    try:
        _remove_leftovers(state_dir)
        if settings.tls_cert is not None and settings.tls_key is not None:
            cert = Path(settings.tls_cert)
            context = server_context(cert, Path(settings.tls_key))
            return ServerTls(context, fingerprint_of_pem(cert.read_bytes()), str(cert))
        if settings.tls_pem is not None:
            return _from_pem(*settings.tls_pem, state_dir)
        cert, key = self_signed(state_dir, names)
        return ServerTls(
            server_context(cert, key),
            fingerprint_of_pem(cert.read_bytes()),
            f"self-signed, kept in {cert.parent}",
        )
    except (OSError, ssl.SSLError, PinError) as exc:
        # The reason names a file or an OpenSSL error, never the key's content.
        raise SettingsError(f"cannot serve HTTPS: {_reason(exc)}") from None


def _remove_leftovers(state_dir: Path) -> None:
    """Remove the private folders a killed supervisor left while loading or making a key (a
    minute old at least: a maker running now keeps its own)."""
    if not state_dir.is_dir():
        return
    for folder in state_dir.glob(".tls-*"):
        with contextlib.suppress(OSError):
            if folder.is_dir() and time.time() - folder.stat().st_mtime > LEFTOVER_AGE_S:
                shutil.rmtree(folder)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return f"{type(exc).__name__}: {exc}"


def _from_pem(cert_pem: str, key_pem: str, state_dir: Path) -> ServerTls:
    """Serve the PEM text handed to a provisioned host: OpenSSL loads keys from files only, so
    the key is written to a private file in the state dir and removed once loaded."""
    fingerprint = fingerprint_of_pem(cert_pem.encode())
    state_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".tls-", dir=state_dir) as tmp:  # mode 0700
        cert, key = Path(tmp) / CERT_NAME, Path(tmp) / KEY_NAME
        _write_private(cert, cert_pem.encode())
        _write_private(key, key_pem.encode())
        context = server_context(cert, key)
    return ServerTls(context, fingerprint, "provisioned (HARU_SUPERVISOR_TLS_CERT_PEM)")


def _write_private(path: Path, data: bytes) -> None:
    """Create `path` (it must not exist) readable by this account only, and write `data`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def self_signed(state_dir: Path, names: list[str]) -> tuple[Path, Path]:
    """The state dir's self-signed certificate and key, made on first use. Both are written
    into a new private folder that is then renamed into place in one step: a crash leaves no
    certificate without its key, and of two makers (the `tls-fingerprint` command racing a
    starting supervisor) the first one's pair is kept whole."""
    folder = state_dir / TLS_DIR
    cert, key = folder / CERT_NAME, folder / KEY_NAME
    if cert.is_file() and key.is_file():
        return cert, key
    state_dir.mkdir(parents=True, exist_ok=True)
    identity = generate(names)
    staging = Path(tempfile.mkdtemp(prefix=".tls-new-", dir=state_dir))  # mode 0700
    try:
        _write_private(staging / KEY_NAME, identity.key_pem)
        _write_private(staging / CERT_NAME, identity.cert_pem)
        with contextlib.suppress(FileExistsError, OSError):
            # Refused when another maker's folder is already there (not empty): keep theirs.
            os.rename(staging, folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    if not (cert.is_file() and key.is_file()):
        raise FileNotFoundError(2, "no certificate and key after making them", str(folder))
    return cert, key


def certificate_names(bind_host: str, config_host: str | None) -> list[str]:
    """Names for a new self-signed certificate: informative (the pin is what is checked)."""
    names = [n for n in (config_host, socket.gethostname(), bind_host) if n]
    return [n for n in names if n not in ("0.0.0.0", "::", "[::]")]
