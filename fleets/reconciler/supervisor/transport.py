"""The HTTP door to a supervisor: one request, one bounded answer, one `Call`.

Every call returns a `Call`: a parsed value, or a `CallError` whose `kind` says what went wrong
(unauthorized, network, timeout, http, bad_body, refused). Nothing here raises on a bad answer,
so a supervisor that returns garbage can never abort a tick. The token goes in the Authorization
header only: never into a message, an event or a log line.

The whole exchange is bounded by one deadline (`deadline.py`), the body by a size cap and a
nesting depth; HTTPS supervisors are verified against HARU_SUPERVISOR_CA_BUNDLE when set, or,
for a domain with a pinned fingerprint, by that pin alone (a pool of its own per pin, so a
connection checked against one pin never carries another domain's calls). The
HTTP transport is injectable (`use_transport`) so unit tests can script a supervisor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode

import httpx

from common.wire import bounded_json
from fleets.base.conf import haru_settings
from fleets.base.supervisor_tokens import LEGACY_TOKEN_ENV, warn_once
from fleets.core.model_health import Reach
from fleets.core.supervisor_tls import TLS, transport_problem
from fleets.core.urls import host_allowed, scrub_urls, without_userinfo
from fleets.reconciler.supervisor import answers, peers
from fleets.reconciler.supervisor.deadline import DeadlineTransport, PinMismatch, deadline

# httpx logs every request at INFO: one line per heartbeat per domain per second would bury
# everything else. Quiet it unless the logging config chose a level for it.
if logging.getLogger("httpx").level == logging.NOTSET:
    logging.getLogger("httpx").setLevel(logging.WARNING)

# A single supervisor call never blocks a tick longer than this, whatever the step's budget.
CALL_CAP_S = 10.0
# Even a step past its budget gets one short final look, so a reply that lands right at the
# deadline still counts.
MIN_CALL_S = 0.25
# Defaults for the limits `client_for` reads from settings (HARU_SUPERVISOR_MAX_RESPONSE_BYTES,
# HARU_JSON_MAX_DEPTH): a status or GPU report is a few kilobytes and a few levels deep.
MAX_RESPONSE_BYTES = 2 * 1024 * 1024

UNAUTHORIZED = "unauthorized"
NETWORK = "network"
TIMEOUT = "timeout"
HTTP = "http"
BAD_BODY = "bad_body"
# Never sent: the supervisor's host is not in HARU_SUPERVISOR_HOSTS.
REFUSED = "refused"

T = TypeVar("T")


@dataclass(frozen=True)
class CallError:
    """Why a call produced no value; `code` is the supervisor's own error code, if it sent one."""

    kind: str
    message: str
    status: int | None = None
    code: str | None = None
    # The connection itself was refused: nothing listens there (a dead process), as opposed
    # to a timeout (a slow host or a partition). Data-path confirmation decides on it.
    refused: bool = False


@dataclass(frozen=True)
class Call(Generic[T]):
    value: T | None = None
    error: CallError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def unauthorized(self) -> bool:
        return self.error is not None and self.error.kind == UNAUTHORIZED


class BadBody(ValueError):
    """A response body that does not match the contract (a parser raises it; a call ends
    `bad_body`)."""


# -- the process-wide HTTP client ---------------------------------------------------------------


class _NoCookies(httpx.Cookies):
    """A jar that keeps nothing: a supervisor has no session, and a cookie one set must never
    ride along to another supervisor on the same host (httpx keys cookies by host, not port).
    Also the cheapest: httpx wraps every response for `http.cookiejar` just to look."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class _SupervisorHttp(httpx.Client):
    """httpx's client, without its cookie jar."""

    _no_cookies = _NoCookies()

    @property
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        # httpx's own constructor sets its (empty) jar; anything else has no business here.
        if cookies:
            raise ValueError("supervisor calls carry no cookies")


class _SharedHttp:
    """The process-wide HTTP client, the CA bundle it verifies with, and a test's transport."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.transport: httpx.BaseTransport | None = None
        self.client: httpx.Client | None = None
        # The CA bundle `client` verifies HTTPS supervisors with (rebuilt when it changes).
        self.ca_bundle: str | None = None
        # One client per pinned fingerprint (a handful: one per pinned domain).
        self.pinned: dict[str, httpx.Client] = {}


_shared = _SharedHttp()


def _shared_http() -> httpx.Client:
    """Return the process-wide HTTP client: pooled keep-alive connections to every supervisor."""
    ca_bundle = haru_settings().supervisor_ca_bundle
    with _shared.lock:
        if _shared.client is not None and ca_bundle != _shared.ca_bundle:
            _shared.client.close()
            _shared.client = None
        if _shared.client is None:
            _shared.ca_bundle = ca_bundle
            # trust_env=False: an HTTP(S)_PROXY meant for the internet must never capture calls
            # to supervisors on private addresses.
            # The default transport bounds every socket operation by the call's overall
            # deadline (a trickling supervisor never resets it); tests inject their own.
            _shared.client = _SupervisorHttp(
                transport=_shared.transport or DeadlineTransport(ca_bundle=ca_bundle),
                trust_env=False,
                follow_redirects=False,
                headers={"User-Agent": "haru-reconciler"},
            )
        return _shared.client


# Past this many pins (domains re-provisioned many times over), the pinned clients are dropped
# and made again on use: a bound, not a cache policy.
MAX_PINNED_CLIENTS = 256


def _pinned_http(pin: str) -> httpx.Client:
    """The client whose every connection presented the certificate `pin` (a test's transport,
    when one is injected, replaces it like every other)."""
    with _shared.lock:
        client = _shared.pinned.get(pin)
        if client is None:
            if len(_shared.pinned) >= MAX_PINNED_CLIENTS:
                for old in _shared.pinned.values():
                    old.close()
                _shared.pinned.clear()
            client = _shared.pinned[pin] = _SupervisorHttp(
                transport=_shared.transport or DeadlineTransport(pin=pin),
                trust_env=False,
                follow_redirects=False,
                headers={"User-Agent": "haru-reconciler"},
            )
        return client


def use_transport(transport: httpx.BaseTransport | None) -> httpx.BaseTransport | None:
    """Route every supervisor call through `transport` (tests); return the previous one."""
    peers.forget()  # other peers behind another transport
    answers.forget()
    with _shared.lock:
        previous, _shared.transport = _shared.transport, transport
        old, _shared.client = _shared.client, None
        pinned, _shared.pinned = list(_shared.pinned.values()), {}
    for client in [old, *pinned]:
        if client is not None:
            client.close()
    return previous


# -- one supervisor's door ----------------------------------------------------------------------

# What `Door._exchange` read: the status and the body, or why it stopped reading.
Read = tuple[int, bytes] | CallError


class Door:
    """Send requests to one supervisor: its base URL, its tokens, its host check, its caps."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        fallback_token: str | None = None,
        key: str | None = None,
        allowed_hosts: Sequence[str] = (),
        http: httpx.Client | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        max_depth: int = bounded_json.DEFAULT_MAX_DEPTH,
        tls: TlsTrust | None = None,
    ) -> None:
        """`token` is sent as the bearer token; `fallback_token` (the deprecated shared one,
        during the migration only) is sent once after this supervisor refuses `token`, and
        remembered under `key` (the domain) when it is accepted. A host outside
        `allowed_hosts` (when not empty) is never called, nor one `tls` (the domain's transport
        and pin) refuses; with a pin, only a supervisor presenting that certificate is."""
        self.base_url = base_url.rstrip("/")
        self._max_bytes = max_response_bytes
        self._max_depth = max_depth
        # Never shown with credentials: messages land in events, the dashboard and logs.
        self.where = without_userinfo(self.base_url)
        self._token = token
        self._fallback = fallback_token if fallback_token != token else None
        self._key = key or self.where
        self._allowed = host_allowed(self.base_url, allowed_hosts)
        self._http = http
        self._tls = tls or TlsTrust()
        self._refusal = self._tls.refusal(self.base_url)

    def send(
        self,
        method: str,
        path: str,
        timeout: float,
        parse: Callable[[Any], T],
        body: Any = None,
        params: list[tuple[str, str]] | None = None,
        *,
        reuse: bool = False,
    ) -> Call[T]:
        """Send one request and parse its answer with `parse`, within `timeout` in all.

        `reuse`: `parse` returns frozen values, so a body identical to the last one read on
        this route is answered with the value read then (`answers.py`), not read again."""
        where = f"{method} {self.where}{path}"
        if not self._allowed:
            return Call(
                error=CallError(
                    REFUSED,
                    f"{where}: not called: the host is not in HARU_SUPERVISOR_HOSTS, and a "
                    "supervisor token is only sent to an allowed host",
                )
            )
        if self._refusal is not None:
            return Call(error=CallError(REFUSED, f"{where}: not called: {self._refusal}"))
        read = self._read(method, path, timeout, body, params, where)
        if isinstance(read, CallError):
            return Call(error=read)
        return self._answer(read, parse, where, reuse=reuse)

    def _read(
        self,
        method: str,
        path: str,
        timeout: float,
        body: Any,
        params: list[tuple[str, str]] | None,
        where: str,
    ) -> Read:
        """Exchange the request, presenting each token in turn until one is not refused;
        a transport failure becomes its CallError."""
        pin = self._tls.pin
        http = self._http or (_pinned_http(pin) if pin else _shared_http())
        # Without userinfo: httpx would turn a legacy `user:password@` into Basic auth in place
        # of the bearer token (and send the password).
        url = self.where + path
        budget = max(MIN_CALL_S, timeout)
        # `budget` bounds the whole exchange (connect, headers, body), not each read; a retry
        # with the fallback token shares it.
        try:
            with deadline(budget) as at:
                for token in self._tokens():
                    # Ask for the body as sent: a compressed one could inflate past the cap.
                    headers = {"Accept-Encoding": "identity"}
                    if token:
                        headers["Authorization"] = f"Bearer {token}"
                    read = self._exchange(http, method, url, body, params, headers, at, where)
                    if not (isinstance(read, tuple) and read[0] in (401, 403)):
                        self._learn_token(token)
                        break
        except httpx.TimeoutException:
            return CallError(TIMEOUT, f"{where} timed out after {budget:.1f}s")
        except httpx.ConnectError as exc:
            mismatch = _pin_mismatch(exc)
            if mismatch is not None:
                return CallError(NETWORK, f"{where}: {self._tls.mismatch_message(mismatch)}")
            text = scrub_urls(f"{exc}")
            return CallError(
                NETWORK, f"{where}: {type(exc).__name__}: {text}", refused=connection_refused(exc)
            )
        except httpx.HTTPError as exc:
            # The exception text names the URL and the OS error, never our headers.
            text = scrub_urls(f"{exc}")
            return CallError(NETWORK, f"{where}: {type(exc).__name__}: {text}")
        except Exception as exc:  # noqa: BLE001 - a broken transport must not abort a tick
            return CallError(NETWORK, f"{where}: {type(exc).__name__}")
        return read

    def _answer(
        self, read: tuple[int, bytes], parse: Callable[[Any], T], where: str, *, reuse: bool
    ) -> Call[T]:
        """Turn a status and a body into the call's result: refused, an HTTP error, or the
        parsed value (a body off the contract is `bad_body`)."""
        status, raw = read
        if reuse and 200 <= status < 300:
            known = answers.recall(where, parse, self._max_depth, raw)
            if not answers.missing(known):
                return Call(value=known)
        if status in (401, 403):
            return Call(
                error=CallError(
                    UNAUTHORIZED,
                    f"{where}: supervisor refused our token (HTTP {status})",
                    status=status,
                )
            )
        refused: str | None = None
        try:
            payload = bounded_json.loads(raw, max_depth=self._max_depth) if raw.strip() else None
        except ValueError as exc:
            payload, refused = None, str(exc)
        if not 200 <= status < 300:
            code, message = _envelope(payload)
            # The status once ("HTTP 302 HTTP 302" read twice), the supervisor's words after it.
            detail = f" {code}: {message}" if code else ""
            message = f"{where}: HTTP {status}{detail}"[:500]
            return Call(error=CallError(HTTP, message, status, code))
        if payload is None:
            why = f"body is not JSON ({refused})" if refused else "body is not JSON"
            return Call(error=CallError(BAD_BODY, f"{where}: {why}"[:500], status))
        try:
            value = parse(payload)
        except BadBody as exc:
            return Call(error=CallError(BAD_BODY, f"{where}: {exc}"[:500], status))
        if reuse:
            answers.keep(where, parse, self._max_depth, raw, value)
        return Call(value=value)

    def _tokens(self) -> list[str | None]:
        """The tokens to present, in order: the domain's own first, unless this supervisor was
        last seen taking only the shared one."""
        if self._fallback is None:
            return [self._token]
        if peers.on_shared_token(self._key):
            return [self._fallback, self._token]
        return [self._token, self._fallback]

    def _learn_token(self, accepted: str | None) -> None:
        if self._fallback is None:
            return
        shared = accepted == self._fallback
        peers.learn_shared_token(self._key, shared)
        if shared:
            warn_once(
                f"shared-token:{self._key}",
                f"supervisor {self.where} (domain {self._key}) refused its own token and "
                f"accepted the shared {LEGACY_TOKEN_ENV}: give it its own "
                "(manage.py supervisor_token <fleet>/<domain>), then unset the shared one",
            )

    def _exchange(
        self,
        http: httpx.Client,
        method: str,
        url: str,
        body: Any,
        params: list[tuple[str, str]] | None,
        headers: dict[str, str],
        at: float,
        where: str,
    ) -> Read:
        """Send the request and read the body, refusing one past the size cap before it is
        all read (a declared length at once, a chunked one as it arrives)."""
        cap = self._max_bytes
        with http.stream(
            method,
            url,
            json=body if method == "POST" else None,
            params=urlencode(params) if params else None,
            headers=headers,
            timeout=max(MIN_CALL_S, at - time.monotonic()),
        ) as response:
            status = response.status_code
            if status in (401, 403):
                return status, b""  # refused: what it says is not worth reading
            if 300 <= status < 400:
                # Never followed (a token must not travel to wherever it points); said once.
                moved = _shown_location(response.headers.get("location", ""))
                return CallError(
                    HTTP, f"{where}: HTTP {status}, redirect{moved} not followed", status
                )
            too_big = CallError(BAD_BODY, f"{where}: body exceeds {cap} bytes", status)
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > cap:
                return too_big
            if response.headers.get("content-encoding", "identity").lower() != "identity":
                return CallError(BAD_BODY, f"{where}: body is encoded; identity asked", status)
            chunks: list[bytes] = []
            size = 0
            # Identity only (checked above), so these are the bytes as sent.
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > cap:
                    return too_big
                if time.monotonic() > at:
                    # An injected transport bypasses the socket-level deadline.
                    raise httpx.ReadTimeout("the call's overall deadline passed")
                chunks.append(chunk)
        return status, b"".join(chunks)


def _shown_location(location: str) -> str:
    """` to <Location>` as safe to show in an event: no userinfo, no query or fragment (either
    may hold a key), printable ASCII, bounded; "" when there is none."""
    shown = without_userinfo(location.strip()).split("?", 1)[0].split("#", 1)[0]
    shown = "".join(c if 32 < ord(c) < 127 else "?" for c in shown)[:200]
    return f" to {shown}" if shown else ""


@dataclass(frozen=True)
class TlsTrust:
    """How one domain's supervisor may be reached (fleets.core.supervisor_tls): its transport,
    its pin ("" for none) and the domain's name for messages."""

    transport: str = TLS
    pin: str = ""
    domain: str = ""

    def refusal(self, url: str) -> str | None:
        """Why this supervisor must not be called at all (a row the loader would refuse)."""
        problem = transport_problem(url, self.transport, self.pin)
        if problem is None:
            return None
        field, rule = problem
        return f"domain {self.domain or '?'}: {field}: {rule}"

    def mismatch_message(self, mismatch: PinMismatch) -> str:
        return (
            f"TLS certificate refused for domain {self.domain or '?'}: the supervisor presented "
            f"{mismatch.presented or 'no certificate'}, not the pinned {mismatch.pinned} "
            "(supervisorFingerprint); nothing was sent. A supervisor whose certificate was "
            "remade needs its new fingerprint in the layout (python -m supervisor "
            "tls-fingerprint on its host)"
        )


def _pin_mismatch(exc: BaseException) -> PinMismatch | None:
    """The PinMismatch behind an httpx error (httpx re-raises httpcore's, from it)."""
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain is short; the bound guards a cycle
        if seen is None:
            return None
        if isinstance(seen, PinMismatch):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _envelope(payload: Any) -> tuple[str | None, str]:
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        err = payload["error"]
        code = err.get("code") if isinstance(err.get("code"), str) else None
        message = err.get("message") if isinstance(err.get("message"), str) else ""
        return code, message[:300]
    return None, ""


def connection_refused(exc: BaseException) -> bool:
    """Tell whether a failed connect was refused (nothing listens: the process is gone).

    httpx raises ConnectError for a refusal but also for a failed name lookup or an unreachable
    network, which a partition can produce too; only a refusal is evidence of a dead host's
    processes, so the others count as "unavailable" and keep the stale window.
    """
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain is short; the bound guards a cycle
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return "refused" in str(exc).lower()


def call_reach(call: Call[Any]) -> Reach:
    """How a supervisor call ended, in the terms of fleets.core.model_health."""
    err = call.error
    if err is None:
        return Reach.ANSWERED
    if err.refused:
        return Reach.REFUSED
    if err.kind == TIMEOUT:
        return Reach.TIMEOUT
    return Reach.UNAVAILABLE


def serving_reach(serving_url: str, *, timeout: float) -> Reach:
    """Ask a model server itself whether it serves: `GET <servingUrl>/health`, bounded.

    Used when its supervisor cannot say. No credentials go with it (vLLM's /health needs none)
    and the body is never read. Any answer below 500 means a live server; 5xx means it says it
    cannot serve; a refused connection means nothing listens there.
    """
    url = without_userinfo(serving_url).rstrip("/") + "/health"
    budget = max(MIN_CALL_S / 5, timeout)
    try:
        with (
            deadline(budget) as at,
            _shared_http().stream(
                "GET",
                url,
                headers={"Accept-Encoding": "identity"},
                timeout=max(0.01, at - time.monotonic()),
            ) as response,
        ):
            status = response.status_code
    except httpx.TimeoutException:
        return Reach.TIMEOUT
    except httpx.ConnectError as exc:
        return Reach.REFUSED if connection_refused(exc) else Reach.UNAVAILABLE
    except Exception:  # noqa: BLE001 - a reset mid-answer: a server in trouble, not a dead one
        return Reach.UNAVAILABLE
    return Reach.UNAVAILABLE if status >= 500 else Reach.ANSWERED
