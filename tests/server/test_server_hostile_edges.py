"""Issue 29: every phase of a request bounded at the control plane's edge, whatever it claims.

One `manage.py serve` with an operator token and a chat token (so routes need credentials), small
limits (header deadline 1 s, body deadline 3 s, keep-alive 1 s, 20 connections, 5 per address),
raw sockets from this process. Hostile clients connect from 127.0.0.2; 127.0.0.1 is the trusted
proxy's address (uvicorn's FORWARDED_ALLOW_IPS default) and exempt from the per-address cap. On
the edge before this issue: an upgrade with a body was never answered nor closed, a POST's
headers alone held a busy slot for the body deadline, trailers were counted by no limit, blank
lines kept a connection open for ever, and one address could take every slot.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from bench.hostile_clients import closed_by_peer, read_response, still_open
from bench.hostile_floods import HOSTILE_SOURCE, attacks
from tests.server import harness

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 3.0
KEEPALIVE_S = 1.0
MAX_CONNECTIONS = 20
PER_ADDRESS = 5
MAX_HEADER_BYTES = 16_384
MAX_HEADERS = 32
API_TOKEN = "hostile-edge-api-token-0123456789abcdef"
CHAT_TOKEN = "hostile-edge-chat-token-0123456789abcdef"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("hostile-edges")
    env = harness.server_env(
        work,
        HARU_DEFAULT_FLEET="edge",
        HARU_API_TOKEN=API_TOKEN,
        HARU_CHAT_TOKENS=CHAT_TOKEN,
        HARU_HTTP_HEADER_TIMEOUT_MS=str(int(HEADER_TIMEOUT_S * 1000)),
        HARU_HTTP_BODY_TIMEOUT_MS=str(int(BODY_TIMEOUT_S * 1000)),
        HARU_HTTP_KEEPALIVE_TIMEOUT_MS=str(int(KEEPALIVE_S * 1000)),
        HARU_HTTP_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
        HARU_HTTP_MAX_CONNECTIONS_PER_ADDRESS=str(PER_ADDRESS),
        HARU_HTTP_MAX_HEADER_BYTES=str(MAX_HEADER_BYTES),
        HARU_HTTP_MAX_HEADERS=str(MAX_HEADERS),
    )
    harness.prepare(env, work, harness.layout("edge", harness.free_port_in(20000, 30000)))
    serve = harness.Serve(env, work)
    yield serve
    serve.stop()


def connect(server: harness.Serve, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", server.port))
    return sock


def hostile(server: harness.Serve) -> socket.socket:
    return connect(server, HOSTILE_SOURCE)


def refused_at_once(sock: socket.socket, status: int) -> dict:
    """The server answers `status` within a second, then closes; return the error envelope."""
    got, data = read_response(sock, timeout=1)
    assert got == status, data[:300]
    assert closed_by_peer(sock, 1), "answered but left open"
    return json.loads(data.partition(b"\r\n\r\n")[2] or b"{}")


def healthz_served(server: harness.Serve) -> bool:
    sock = connect(server)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        return read_response(sock, timeout=5)[0] == 200
    finally:
        sock.close()


# ---------------------------------------------------------------------------------------------
# Upgrades


def test_an_upgrade_with_a_body_is_refused_400_and_closed_at_once(server):
    sock = hostile(server)
    sock.sendall(attacks(post_path="/healthz")["upgrade_body"].opening + b"hello")
    assert refused_at_once(sock, 400)["error"]["code"] == "upgrade_with_body"
    sock.close()


def test_a_chunked_upgrade_is_refused_too(server):
    sock = hostile(server)
    sock.sendall(
        b"POST /ws/overview/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
        b"Upgrade: websocket\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
    )
    assert refused_at_once(sock, 400)["error"]["code"] == "upgrade_with_body"
    sock.close()


@pytest.mark.parametrize("upgrade", ["websocket", "h2c"])
def test_an_upgrade_off_the_websocket_routes_is_refused(server, upgrade):
    sock = hostile(server)
    sock.sendall(
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: %s\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        % upgrade.encode()
    )
    assert refused_at_once(sock, 400)["error"]["code"] == "upgrade_refused"
    sock.close()


def test_a_websocket_handshake_that_never_completes_is_closed(server):
    # Accepted on its route (no session: the consumer refuses it, or the handshake waits):
    # either way the connection does not outlive the header deadline by much.
    sock = hostile(server)
    sock.sendall(
        b"GET /ws/overview/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
        b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: http://127.0.0.1\r\n\r\n"
    )
    assert closed_by_peer(sock, HEADER_TIMEOUT_S + 5)
    sock.close()


# ---------------------------------------------------------------------------------------------
# Authentication before the body


@pytest.mark.parametrize("path", ["/v1/fleets", "/v1/chat/completions", "/login/", "/healthz"])
def test_a_post_without_credentials_gets_401_before_its_body(server, path):
    sock = hostile(server)
    sock.sendall(attacks(post_path=path)["header_only_post"].opening)
    assert refused_at_once(sock, 401)["error"]["code"] == "unauthorized"
    sock.close()


def test_a_wrong_token_gets_401_before_its_body(server):
    sock = hostile(server)
    extra = f"Authorization: Bearer {API_TOKEN[::-1]}\r\n"
    sock.sendall(attacks(post_path="/v1/fleets", extra_headers=extra)["header_only_post"].opening)
    assert refused_at_once(sock, 401)["error"]["code"] == "unauthorized"
    sock.close()


@pytest.mark.parametrize(
    ("path", "credential"),
    [
        ("/v1/fleets/edge/reconcile", f"Authorization: Bearer {API_TOKEN}\r\n"),
        ("/v1/chat/completions", f"Authorization: Bearer {CHAT_TOKEN}\r\n"),
        ("/login/", "Cookie: csrftoken=abc\r\n"),
    ],
)
def test_a_client_with_credentials_may_send_its_body_later(server, path, credential):
    sock = connect(server)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{credential}"
        "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n".encode()
    )
    assert not closed_by_peer(sock, 0.5), "closed before its body came"
    sock.sendall(b"{}")
    status, _ = read_response(sock, timeout=10)
    assert status not in (401, 408), status
    sock.close()


def test_a_stored_api_token_may_send_its_body_later(server):
    # A stored token (`manage.py api_token`) is checked against the database, so the edge lets
    # its shape through and the API authenticates it once the body is in.
    secret = harness.manage(
        server.env, "api_token", "create", "late-body", "--scope", "operate", "--all-fleets"
    ).stdout.strip()
    sock = connect(server)
    sock.sendall(
        f"POST /v1/fleets/edge/reconcile HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {secret}\r\n"
        "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n".encode()
    )
    assert not closed_by_peer(sock, 0.5), "closed before its body came"
    sock.sendall(b"{}")
    status, data = read_response(sock, timeout=10)
    assert status == 200, data[:300]
    sock.close()


def test_a_made_up_stored_token_waits_only_to_be_refused_by_the_api(server):
    made_up = "haru_" + "A" * 43
    sock = connect(server)
    sock.sendall(
        f"POST /v1/fleets/edge/reconcile HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {made_up}\r\n"
        "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n".encode()
    )
    assert not closed_by_peer(sock, 0.5)
    sock.sendall(b"{}")
    status, _ = read_response(sock, timeout=10)
    assert status == 401
    sock.close()


def test_connections_waiting_for_a_body_make_room_like_idle_ones(server):
    # A forged session cookie passes the cheap check; such connections still cannot hold
    # every slot: until their body's first byte they are closed to make room.
    held = []
    try:
        for _ in range(MAX_CONNECTIONS + 5):
            sock = connect(server)  # 127.0.0.1: exempt from the per-address cap
            sock.sendall(
                b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: sessionid=forged\r\n"
                b"Content-Length: 100\r\n\r\n"
            )
            held.append(sock)
        time.sleep(0.3)
        assert healthz_served(server)
    finally:
        for sock in held:
            sock.close()


# ---------------------------------------------------------------------------------------------
# Trailers


def chunked_head(path: str = "/healthz") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_TOKEN}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()


def test_an_endless_trailer_value_is_cut_431_at_the_header_limit(server):
    sock = connect(server)
    sock.sendall(chunked_head() + b"2\r\n{}\r\n0\r\nX-Trailer: ")
    sent = 0
    status = None
    sock.settimeout(0.05)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and status is None:
        try:
            sock.sendall(b"a" * 4096)
            sent += 4096
        except OSError:
            break
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        status = int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else -1
    assert status == 431, (status, sent)
    # Cut within a few reads past the limit, not after megabytes.
    assert sent < MAX_HEADER_BYTES + 256 * 1024, sent
    sock.close()


def test_too_many_trailer_fields_are_refused_431(server):
    sock = connect(server)
    trailers = b"".join(b"X-T%d: v\r\n" % i for i in range(MAX_HEADERS + 1))
    sock.sendall(chunked_head() + b"2\r\n{}\r\n0\r\n" + trailers + b"\r\n")
    assert refused_at_once(sock, 431)["error"]["code"] == "too_many_headers"
    sock.close()


def test_a_request_with_a_small_trailer_is_served(server):
    sock = connect(server)
    body = b"2\r\n{}\r\n0\r\nX-Checksum: 1\r\n\r\n"
    sock.sendall(chunked_head("/v1/fleets/edge/reconcile") + body)
    status, data = read_response(sock)
    assert status < 300, data[:300]
    sock.close()


# ---------------------------------------------------------------------------------------------
# Blank lines


def test_blank_lines_between_requests_do_not_keep_a_connection_open(server):
    sock = hostile(server)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert read_response(sock)[0] == 200
    closed = False
    started = time.monotonic()
    while time.monotonic() - started < KEEPALIVE_S + 4:
        try:
            sock.sendall(b"\r\n")
        except OSError:
            closed = True
            break
        if closed_by_peer(sock, 0.2):
            closed = True
            break
    assert closed, "blank lines kept the connection past its keep-alive limit"
    sock.close()


def test_blank_lines_before_the_first_request_do_not_move_the_header_deadline(server):
    sock = hostile(server)
    closed = False
    started = time.monotonic()
    while time.monotonic() - started < HEADER_TIMEOUT_S + 4:
        try:
            sock.sendall(b"\r\n")
        except OSError:
            closed = True
            break
        if closed_by_peer(sock, 0.2):
            closed = True
            break
    assert closed
    sock.close()


# ---------------------------------------------------------------------------------------------
# The per-address cap


def test_one_address_cannot_take_more_than_its_share(server):
    held = [hostile(server) for _ in range(PER_ADDRESS)]
    try:
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # reading headers: not closed yet
        newcomer = hostile(server)
        # At once: well before the header deadline would close it anyway.
        assert closed_by_peer(newcomer, HEADER_TIMEOUT_S / 4), "kept past the address's cap"
        newcomer.close()
        assert healthz_served(server)  # another address (here the trusted one) is served
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    # The address's connections are counted down as they close: it may connect again.
    again = hostile(server)
    again.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert read_response(again)[0] == 200
    again.close()


def test_making_room_closes_the_newcomers_own_address_first(server):
    # At the cap, a newcomer from an address that already waits closes that address's oldest
    # connection, not the oldest of all (here the trusted address's, opened first).
    trusted = [connect(server) for _ in range(MAX_CONNECTIONS - 2 * (PER_ADDRESS - 1))]
    mine = [hostile(server) for _ in range(PER_ADDRESS - 1)]
    other = [connect(server, "127.0.0.3") for _ in range(PER_ADDRESS - 1)]
    try:
        newcomer = hostile(server)  # the 21st connection, its address's 5th
        time.sleep(0.2)
        assert still_open(trusted) == len(trusted)
        assert still_open(other) == len(other)
        assert still_open(mine) == len(mine) - 1
        newcomer.close()
    finally:
        for sock in trusted + mine + other:
            sock.close()
