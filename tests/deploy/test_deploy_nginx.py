"""deploy/nginx/, checked by the nginx Debian ships (1.22 on Debian 12), not by grep.

Each site is included, as /etc/nginx/conf.d/ is, inside a throwaway main config whose pid, logs
and temporary paths are in a temporary directory, with a self-signed certificate in place of
/etc/ssl/haru/: no root and nothing under /etc or /var is needed or touched.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from common.ports import free_port
from tests.deploy.real_tools import require

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "deploy" / "nginx" / "haru.conf"
GPU_HOST_SITE = ROOT / "deploy" / "nginx" / "haru-gpu-host.conf"
CERT = "/etc/ssl/haru/fullchain.pem"
KEY = "/etc/ssl/haru/privkey.pem"
SERVER_NAME = "haru.example.com"

MAIN = """\
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 64; }}
http {{
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    access_log off;
    include {d}/haru.conf;
}}
"""


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"expected {old!r} once"
    return text.replace(old, new)


def _prefix(tmp_path: Path, site: str) -> Path:
    """A main config around `site`, with a certificate of our own; returns the main config."""
    if CERT in site:
        site = _with_own_certificate(tmp_path, site)
    (tmp_path / "haru.conf").write_text(site)
    main = tmp_path / "nginx.conf"
    main.write_text(MAIN.format(d=tmp_path))
    return main


def _with_own_certificate(tmp_path: Path, site: str) -> str:
    openssl = require("openssl")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", f"/CN={SERVER_NAME}", "-keyout", str(tmp_path / "key.pem")]
        + ["-out", str(tmp_path / "cert.pem")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    site = _replace_once(site, CERT, str(tmp_path / "cert.pem"))
    return _replace_once(site, KEY, str(tmp_path / "key.pem"))


def _nginx(nginx: str, tmp_path: Path, main: Path, *args: str) -> list[str]:
    # -e: the error log before the config is read (Debian's default is /var/log/nginx).
    return [nginx, "-p", f"{tmp_path}/", "-e", str(tmp_path / "error.log"), "-c", str(main), *args]


@pytest.mark.parametrize("site", [SITE, GPU_HOST_SITE], ids=lambda p: p.name)
def test_nginx_t_accepts_the_site(tmp_path, site):
    nginx = require("nginx")
    text = site.read_text()
    if site == GPU_HOST_SITE:
        # nginx -t checks that a listen address is one of this machine's: a loopback one here.
        text = _replace_once(text, "listen 10.0.0.11:8000;", "listen 127.0.0.2:8000;")
    main = _prefix(tmp_path, text)
    result = subprocess.run(
        _nginx(nginx, tmp_path, main, "-t"), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    # A deprecated or ignored directive is only a warning: the test wants none.
    assert "[warn]" not in result.stderr and "[emerg]" not in result.stderr, result.stderr


class _Backend(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self):  # noqa: N802 - the standard library's name
        _Backend.seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
        body = b"from haru"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _wait_for(host: str, port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nginx did not listen on {port}")


@contextlib.contextmanager
def _served(tmp_path: Path, site: str, ports: list[tuple[str, int]]):
    """`site` served by the real nginx (in the foreground) until the block ends."""
    nginx = require("nginx")
    main = _prefix(tmp_path, site)
    proc = subprocess.Popen(
        _nginx(nginx, tmp_path, main, "-g", "daemon off;"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        for host, port in ports:
            _wait_for(host, port, deadline)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture
def backend():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Backend.seen = []
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def running_site(tmp_path, backend):
    """The shipped site served by the real nginx on loopback ports, in front of a tiny backend."""
    tls, plain = free_port(), free_port()
    site = SITE.read_text()
    site = _replace_once(site, "listen 443 ssl http2;", f"listen 127.0.0.1:{tls} ssl http2;")
    site = _replace_once(site, "listen 80;", f"listen 127.0.0.1:{plain};")
    site = _replace_once(site, "server 127.0.0.1:8700 ", f"server 127.0.0.1:{backend.server_port} ")
    with _served(tmp_path, site, [("127.0.0.1", tls), ("127.0.0.1", plain)]):
        yield tls, plain


def _tls_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # our own throwaway certificate
    return ctx


def test_the_site_speaks_http2_redirects_plain_http_and_proxies_with_the_headers(running_site):
    tls, plain = running_site
    # HTTP/2 is offered (ALPN), as `http2 on;` did on newer nginx.
    ctx = _tls_context()
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", tls), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=SERVER_NAME) as conn,
    ):
        assert conn.selected_alpn_protocol() == "h2"

    http_conn = http.client.HTTPConnection("127.0.0.1", plain, timeout=5)
    http_conn.request("GET", "/fleets", headers={"Host": SERVER_NAME})
    redirect = http_conn.getresponse()
    assert redirect.status == 301
    assert redirect.getheader("Location") == f"https://{SERVER_NAME}/fleets"

    https = http.client.HTTPSConnection("127.0.0.1", tls, timeout=5, context=_tls_context())
    https.request("GET", "/healthz", headers={"Host": SERVER_NAME})
    answer = https.getresponse()
    assert (answer.status, answer.read()) == (200, b"from haru")
    seen = _Backend.seen[-1]
    assert seen["host"] == SERVER_NAME
    assert seen["x-forwarded-proto"] == "https"
    assert seen["x-forwarded-for"] == "127.0.0.1"

    # /metrics is for Prometheus on the private network only.
    https.request("GET", "/metrics", headers={"Host": SERVER_NAME})
    denied = https.getresponse()
    denied.read()
    assert denied.status == 403
    assert all(s["path"] != "/metrics" for s in _Backend.seen)


def test_a_gpu_host_publishes_only_the_inference_paths_on_the_model_servers_port(tmp_path, backend):
    """As on a GPU host: the model server on 127.0.0.1:P, nginx on the host's own address, same
    port (here 127.0.0.2, another loopback address), open to the control plane's address only."""
    port = backend.server_port
    site = GPU_HOST_SITE.read_text().replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    site = _replace_once(site, "listen 10.0.0.11:8000;", f"listen 127.0.0.2:{port};")
    site = _replace_once(site, "allow 10.0.0.10;", "allow 127.0.0.1;")
    with _served(tmp_path, site, [("127.0.0.2", port)]):
        conn = http.client.HTTPConnection("127.0.0.2", port, timeout=5)
        for path in ("/v1/chat/completions", "/v1/completions", "/health"):
            conn.request("GET", path)
            answer = conn.getresponse()
            assert (answer.status, answer.read()) == (200, b"from haru"), path
        for path in ("/sleep?level=1", "/wake_up", "/is_sleeping", "/metrics", "/v1/models"):
            conn.request("GET", path)
            answer = conn.getresponse()
            answer.read()
            assert answer.status == 404, path
        assert [s["path"] for s in _Backend.seen] == [
            "/v1/chat/completions",
            "/v1/completions",
            "/health",
        ]
    # Anyone but the control plane is refused (here: the site allowing another address).
    site = _replace_once(
        GPU_HOST_SITE.read_text(), "listen 10.0.0.11:8000;", f"listen 127.0.0.2:{port};"
    )
    with _served(tmp_path, site, [("127.0.0.2", port)]):
        conn = http.client.HTTPConnection("127.0.0.2", port, timeout=5)
        conn.request("GET", "/v1/chat/completions")
        answer = conn.getresponse()
        answer.read()
        assert answer.status == 403
