"""Issue 11, finding 1 on the GPU host: deadlines and limits at the supervisor's HTTP edge.

One real `python -m supervisor` (simulated GPU) with small limits (header deadline 1 s, body
deadline 1.5 s, keep-alive 1 s, 20 connections, 300 open files; header size, header count and
body cap at their defaults), real sockets from this process, no token on the hostile ones: the
header phase comes before the token check. On stock uvicorn each of these was kept or served:
a trickled header block for ever, 50 MB of headers buffered whole, idle connections until the
process ran out of descriptors (then /healthz and the heartbeat's /v1/status stopped
answering, and the control plane failed over a healthy active).
"""

from __future__ import annotations

import json
import resource
import socket
import sys
import time

import httpx
import pytest

from bench import hostile_clients as hostile
from bench.hostile_floods import HOSTILE_SOURCE, attacks
from supervisor.api import MAX_BODY_BYTES as API_MAX_BODY_BYTES
from supervisor.settings import EDGE_SETTINGS

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.5
KEEPALIVE_S = 1.0
MAX_CONNECTIONS = 20
SUPERVISOR_NOFILE = 300  # 20 connections x 2 + 256 reserved fit; 400 idle sockets would not
MAX_HEADER_BYTES = EDGE_SETTINGS["max_header_bytes"][1]
MAX_HEADERS = EDGE_SETTINGS["max_headers"][1]
MAX_BODY = EDGE_SETTINGS["max_body_bytes"][1]
TOKEN = "edge-test-token-0123456789"
PER_ADDRESS = 5  # from 127.0.0.2; 127.0.0.1 (FORWARDED_ALLOW_IPS' default) is exempt

pytestmark = pytest.mark.integration


def _limit_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SUPERVISOR_NOFILE, SUPERVISOR_NOFILE))


@pytest.fixture(scope="module")
def supervisor(module_processes, tools, tmp_path_factory):
    work = tmp_path_factory.mktemp("supervisor-edges")
    port = tools.free_port()
    config = {
        "gpu": {"backend": "sim", "simStateFile": str(work / "gpu.json")},
        "stateDir": str(work / "state"),
        "slots": [{"kind": "inference", "gpuIndex": 0, "models": [{"name": "m", "port": 9}]}],
    }
    env = tools.child_env(
        {
            "PORT": str(port),
            "HARU_SUPERVISOR_CONFIG": json.dumps(config),
            "HARU_SUPERVISOR_TOKEN": TOKEN,
            "HARU_SUPERVISOR_HTTP_HEADER_TIMEOUT_MS": str(int(HEADER_TIMEOUT_S * 1000)),
            "HARU_SUPERVISOR_HTTP_BODY_TIMEOUT_MS": str(int(BODY_TIMEOUT_S * 1000)),
            "HARU_SUPERVISOR_HTTP_KEEPALIVE_TIMEOUT_MS": str(int(KEEPALIVE_S * 1000)),
            "HARU_SUPERVISOR_HTTP_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
            "HARU_SUPERVISOR_HTTP_MAX_CONNECTIONS_PER_ADDRESS": str(PER_ADDRESS),
        }
    )
    proc = module_processes.start(
        [sys.executable, "-m", "supervisor"], env=env, preexec_fn=_limit_nofile
    )
    url = f"http://127.0.0.1:{port}"
    tools.wait_for(lambda: httpx.get(f"{url}/healthz", timeout=1).status_code == 200, timeout=15)
    return proc, port, url


def address(supervisor) -> hostile.Address:
    return ("127.0.0.1", supervisor[1])


def status(url: str) -> int:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return httpx.get(f"{url}/v1/status", headers=headers, timeout=5).status_code


def test_slowloris_headers_are_closed_after_the_header_deadline(supervisor):
    took = hostile.slowloris(address(supervisor), give_up_s=10 * HEADER_TIMEOUT_S)
    assert took is not None, "a trickled header block kept its connection"


def test_a_connection_that_sends_nothing_is_closed(supervisor):
    sock = hostile.connect(address(supervisor))
    assert hostile.closed_by_peer(sock, 10 * HEADER_TIMEOUT_S)
    sock.close()


def test_50_mb_of_headers_is_refused_431_without_memory_growth(supervisor):
    proc, _, url = supervisor
    with hostile.PeakRss(proc.pid) as rss:
        statuses = hostile.header_flood(address(supervisor), clients=4, mib=50)
    assert 431 in statuses, statuses
    assert all(s in (431, None) for s in statuses), statuses  # never a 200
    assert rss.grew_mib < 32, f"the supervisor grew by {rss.grew_mib:.0f} MiB at its peak"
    assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200


def test_too_many_headers_is_refused_431(supervisor):
    sock = hostile.connect(address(supervisor))
    fields = b"".join(b"X-F%d: v\r\n" % i for i in range(MAX_HEADERS + 50))
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + fields + b"\r\n")
    code, data = hostile.read_response(sock)
    sock.close()
    assert code == 431
    assert b'"too_many_headers"' in data


def test_headers_within_the_limits_are_served(supervisor):
    _, _, url = supervisor
    count = MAX_HEADERS - 10
    headers = {f"X-F{i}": "v" * (MAX_HEADER_BYTES // (2 * count)) for i in range(count)}
    assert httpx.get(f"{url}/healthz", headers=headers, timeout=10).status_code == 200


def test_many_idle_connections_do_not_stop_healthz_or_an_authenticated_status(supervisor):
    """400 idle sockets against a supervisor allowed 300 open files: stock uvicorn ran out of
    descriptors (accept failed, /healthz reset); here the oldest idle ones are closed."""
    proc, _, url = supervisor
    hostile.raise_own_nofile(1000)
    idle = hostile.idle_flood(address(supervisor), 400)
    try:
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        # What the control plane's heartbeat calls, authenticated, answered by the host.
        assert status(url) == 200
        assert hostile.open_sockets(proc.pid) <= MAX_CONNECTIONS + 8  # listener and spare
        assert len(idle) - hostile.still_open(idle) >= 400 - MAX_CONNECTIONS
    finally:
        for sock in idle:
            sock.close()


def test_an_idle_keep_alive_connection_is_closed_after_its_limit(supervisor):
    sock = hostile.connect(address(supervisor))
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    code, _ = hostile.read_response(sock)
    assert code == 200
    # uvicorn's default was 5 s; the setting says 1 s.
    assert hostile.closed_by_peer(sock, 4 * KEEPALIVE_S)
    sock.close()


def test_a_trickled_body_gets_408_after_the_body_deadline(supervisor):
    sock = hostile.connect(address(supervisor))
    sock.sendall(
        b"POST /v1/probe HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{" % TOKEN.encode()
    )
    started = time.monotonic()
    data = b""
    sock.settimeout(0.2)
    while time.monotonic() - started < 10 * BODY_TIMEOUT_S and not data:
        try:
            sock.sendall(b" ")
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
    sock.close()
    assert data.startswith(b"HTTP/1.1 408 "), data[:200]
    assert b'"request_timeout"' in data


def test_a_declared_body_over_the_edge_cap_is_refused_413_before_the_token_is_read(supervisor):
    sock = hostile.connect(address(supervisor))
    # No token, no body: answered at the end of the headers, before the app (or its 401) runs.
    sock.sendall(
        b"POST /v1/probe HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (256 * 1024 * 1024)
    )
    code, data = hostile.read_response(sock, timeout=BODY_TIMEOUT_S * 4)
    sock.close()
    assert code == 413, data[:300]
    assert b'"request_too_large"' in data
    assert b"HARU_SUPERVISOR_HTTP_MAX_BODY_BYTES (%d bytes)" % MAX_BODY in data


def test_a_body_under_the_edge_cap_but_over_the_apis_gets_the_apis_own_413(supervisor):
    _, _, url = supervisor
    assert API_MAX_BODY_BYTES < MAX_BODY
    response = httpx.post(
        f"{url}/v1/probe",
        content=b"{" + b" " * (API_MAX_BODY_BYTES + 1024) + b"}",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


# ---------------------------------------------------------------------------------------------
# Issue 29: upgrades, authentication before the body, trailers, blank lines, one address.


def from_hostile(supervisor) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(10)
    sock.bind((HOSTILE_SOURCE, 0))
    sock.connect(address(supervisor))
    return sock


def refused_at_once(sock: socket.socket, status: int) -> str:
    """`status` within a second, then closed; return the envelope's code."""
    code, data = hostile.read_response(sock, timeout=1)
    assert code == status, data[:300]
    assert hostile.closed_by_peer(sock, 1), "answered but left open"
    return json.loads(data.partition(b"\r\n\r\n")[2])["error"]["code"]


def test_every_upgrade_is_refused_the_supervisor_has_no_websocket(supervisor):
    sock = from_hostile(supervisor)
    sock.sendall(
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
        b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    assert refused_at_once(sock, 400) == "upgrade_refused"
    sock.close()


def test_an_upgrade_with_a_body_is_refused_at_once(supervisor):
    sock = from_hostile(supervisor)
    sock.sendall(attacks(post_path="/v1/probe")["upgrade_body"].opening)
    assert refused_at_once(sock, 400) == "upgrade_with_body"
    sock.close()


@pytest.mark.parametrize("path", ["/v1/probe", "/healthz"])
def test_a_post_without_the_token_gets_401_before_its_body(supervisor, path):
    sock = from_hostile(supervisor)
    sock.sendall(attacks(post_path=path)["header_only_post"].opening)
    assert refused_at_once(sock, 401) == "unauthorized"
    sock.close()


def test_a_post_with_the_token_may_send_its_body_later(supervisor):
    sock = from_hostile(supervisor)
    sock.sendall(
        b"POST /v1/probe HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
        b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n" % TOKEN.encode()
    )
    assert not hostile.closed_by_peer(sock, 0.5)
    sock.sendall(b"{}")
    code, _ = hostile.read_response(sock)
    assert code not in (401, 408), code
    sock.close()


def test_an_endless_trailer_is_cut_431(supervisor):
    sock = from_hostile(supervisor)
    sock.sendall(
        b"POST /v1/probe HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: " % TOKEN.encode()
    )
    sock.settimeout(0.05)
    sent, data = 0, b""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not data:
        try:
            sock.sendall(b"a" * 4096)
            sent += 4096
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
    sock.close()
    assert data.startswith(b"HTTP/1.1 431 "), (data[:200], sent)
    assert sent < MAX_HEADER_BYTES + 256 * 1024, sent


def test_blank_lines_do_not_keep_a_kept_alive_connection_open(supervisor):
    sock = from_hostile(supervisor)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert hostile.read_response(sock)[0] == 200
    closed = False
    started = time.monotonic()
    while not closed and time.monotonic() - started < KEEPALIVE_S + 4:
        try:
            sock.sendall(b"\r\n")
        except OSError:
            closed = True
            break
        closed = hostile.closed_by_peer(sock, 0.2)
    sock.close()
    assert closed, "blank lines kept the connection past its keep-alive limit"


def test_one_address_gets_at_most_its_share_of_connections(supervisor):
    _, _, url = supervisor
    held = [from_hostile(supervisor) for _ in range(PER_ADDRESS)]
    try:
        newcomer = from_hostile(supervisor)
        assert hostile.closed_by_peer(newcomer, HEADER_TIMEOUT_S / 4)
        newcomer.close()
        assert status(url) == 200
    finally:
        for sock in held:
            sock.close()
