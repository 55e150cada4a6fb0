"""The adapter chunk upload's own body cap at the supervisor's real HTTP edge (uvicorn).

Every other route keeps the edge's 1 MiB cap and the API's 64 KiB; only an authenticated
`PUT /v1/adapters/{id}/files/{path}` may send up to HARU_SUPERVISOR_ADAPTER_CHUNK_BYTES.
"""

from __future__ import annotations

import json

import httpx
import pytest

from bench import hostile_clients as hostile
from supervisor.settings import SupervisorSettings

pytestmark = pytest.mark.integration

TOKEN = "adapter-edge-token-0123456789abcdef"
CHUNK = SupervisorSettings.adapter_chunk_bytes.default
EDGE_CAP = SupervisorSettings.max_body_bytes.default
ADAPTER = "d" * 32


@pytest.fixture(scope="module")
def supervisor(module_processes, tools, tmp_path_factory):
    work = tmp_path_factory.mktemp("adapter-edges")
    config = {
        "gpu": {"backend": "sim", "simStateFile": str(work / "gpu.json")},
        "stateDir": str(work / "state"),
        "slots": [{"kind": "inference", "gpuIndex": 0, "models": [{"name": "m", "port": 9}]}],
    }
    return tools.start_supervisor(module_processes, config, token=TOKEN, wait_ready=False)


def put(sup, offset: int, body: bytes, *, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.put(
        f"{sup.url}/v1/adapters/{ADAPTER}/files/adapter_model.safetensors?offset={offset}",
        content=body,
        headers=headers,
        timeout=30,
        trust_env=False,
    )


def test_a_2_mib_body_to_the_probe_is_still_413_at_the_edge(supervisor):
    response = httpx.post(
        f"{supervisor.url}/v1/probe",
        content=b"{" + b" " * (2 * 1024**2) + b"}",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        timeout=30,
        trust_env=False,
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert "HARU_SUPERVISOR_HTTP_MAX_BODY_BYTES" in response.json()["error"]["message"]


def test_an_8_mib_chunk_passes_and_one_byte_more_is_413(supervisor):
    first = put(supervisor, 0, b"\x01" * CHUNK)
    assert first.status_code == 200, first.text
    assert first.json() == {"id": ADAPTER, "path": "adapter_model.safetensors", "bytes": CHUNK}
    over = put(supervisor, CHUNK, b"\x02" * (CHUNK + 1))
    assert over.status_code == 413
    assert "HARU_SUPERVISOR_ADAPTER_CHUNK_BYTES" in over.json()["error"]["message"]
    # Nothing of the refused chunk was kept: the next one continues at the same offset.
    listed = httpx.get(
        f"{supervisor.url}/v1/adapters", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    ).json()
    assert listed["incoming"] == [{"id": ADAPTER, "files": {"adapter_model.safetensors": CHUNK}}]


def test_the_chunk_cap_is_only_for_that_route_and_method(supervisor):
    # The same path with POST, and a GET-able path with PUT: the edge's cap holds.
    response = httpx.post(
        f"{supervisor.url}/v1/adapters/{ADAPTER}/commit",
        content=b"x" * (EDGE_CAP + 1),
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
        trust_env=False,
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_an_anonymous_chunk_keeps_the_edge_cap_and_is_never_read(supervisor):
    too_big = put(supervisor, 0, b"x" * (EDGE_CAP + 1), token=None)
    assert too_big.status_code == 413
    assert "HARU_SUPERVISOR_HTTP_MAX_BODY_BYTES" in too_big.json()["error"]["message"]
    sock = hostile.connect(("127.0.0.1", supervisor.port))
    sock.sendall(
        b"PUT /v1/adapters/%s/files/w.bin?offset=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: 4096\r\n\r\n" % ADAPTER.encode()
    )
    code, data = hostile.read_response(sock, timeout=5)
    sock.close()
    assert code == 401, data[:300]
    assert json.loads(data.partition(b"\r\n\r\n")[2])["error"]["code"] == "unauthorized"
