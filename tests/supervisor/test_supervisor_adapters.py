"""The supervisor's adapter API (docs/adapters.md): the store, transfers, load and unload.

The real supervisor app in process (TestClient), its state dir in tmp_path; the model servers
are scripted at the HTTP transport (vLLM's control, LoRA and /v1/models endpoints). Every JSON
answer is checked against the wire contract.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from common.adapter_manifest import (
    MANIFEST_NAME,
    EvalAnswer,
    manifest_for,
    manifest_write,
    store_id,
)
from common.wire.contract import check_response
from common.wire.shape import FEATURE_ADAPTERS
from supervisor.api import create_app
from supervisor.config import parse_config
from supervisor.gpu.nvml import NvmlBackend
from supervisor.host import Host, HostDeps
from supervisor.records import StateDir
from supervisor.settings import AdapterLimits
from tests.supervisor.conftest import REPO_ROOT
from tests.supervisor.fakes import FakeModelServers, FakeNvml, FakeServerState, FakeSpawner

PORT, OTHER = 18301, 18302
WEIGHTS = bytes(range(256)) * 64  # 16 KiB


class LoraServers(FakeModelServers):
    """FakeModelServers plus vLLM 0.32's runtime LoRA endpoints and adapter cards in /v1/models,
    answered as vLLM answers them (entrypoints/openai/models/serving.py)."""

    def __init__(self, servers: dict[int, FakeServerState]) -> None:
        super().__init__(servers)
        self.loras: dict[int, dict[str, str]] = {port: {} for port in servers}
        self.lora_calls: list[tuple[int, str, dict[str, Any]]] = []

    async def __call__(self, request: Any) -> Any:
        port, path = request.url.port, request.url.path
        server = self.servers.get(port)
        if server is None or not server.reachable:
            raise httpx.ConnectError("connection refused", request=request)
        loaded = self.loras[port]
        if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/models"):
            server.calls.append(f"{request.method} {path}")
        if path == "/v1/load_lora_adapter":
            body = json.loads(request.content)
            self.lora_calls.append((port, "load", body))
            if body["lora_name"] in loaded:
                message = f"The lora adapter '{body['lora_name']}' has already been loaded."
                return httpx.Response(400, json={"error": {"message": message, "code": 400}})
            if not (Path(body["lora_path"]) / "adapter_config.json").is_file():
                return httpx.Response(404, json={"error": {"message": "not found", "code": 404}})
            loaded[body["lora_name"]] = body["lora_path"]
            return httpx.Response(200, text="Success: LoRA adapter added successfully.")
        if path == "/v1/unload_lora_adapter":
            body = json.loads(request.content)
            self.lora_calls.append((port, "unload", body))
            if loaded.pop(body["lora_name"], None) is None:
                message = f"The lora adapter '{body['lora_name']}' cannot be found."
                return httpx.Response(404, json={"error": {"message": message, "code": 404}})
            return httpx.Response(200, text="Success: LoRA adapter removed successfully.")
        if path == "/v1/models":
            base = {"id": server.name, "root": "/models/base", "parent": None}
            cards = [{"id": n, "root": p, "parent": server.name} for n, p in loaded.items()]
            return httpx.Response(200, json={"object": "list", "data": [base, *cards]})
        return await super().__call__(request)

    def restart(self, port: int) -> None:
        """A new process on the port: it has no adapters loaded."""
        self.loras[port] = {}


def config(training_dir: Path, state_dir: Path) -> dict[str, Any]:
    return {
        "stateDir": str(state_dir),
        "slots": [
            {
                "kind": "inference",
                "gpuIndex": 0,
                "models": [
                    {"name": "base", "port": PORT},
                    {"name": "other", "port": OTHER, "engine": "sglang"},
                ],
            },
            {
                "kind": "training",
                "gpuIndex": 1,
                "command": ["true"],
                "checkpointDir": str(training_dir),
            },
        ],
    }


class Under:
    """The supervisor app over a state dir and scripted model servers."""

    def __init__(self, tmp: Path, *, limits: AdapterLimits | None = None, fakes: Any = None):
        self.training = tmp / "ckpt"
        self.training.mkdir(parents=True, exist_ok=True)
        self.state = StateDir(tmp / "state")
        self.fakes = fakes or LoraServers(
            {PORT: FakeServerState("base"), OTHER: FakeServerState("other")}
        )
        transport = httpx.MockTransport(self.fakes)

        async def never_in_use(port: int) -> bool:
            return False

        self.host = Host(
            parse_config(config(self.training, tmp / "state"), cwd=REPO_ROOT),
            HostDeps(
                gpu=NvmlBackend(load=lambda: FakeNvml([], init_error=12)),
                spawner=FakeSpawner(),
                environ={"PATH": "/usr/bin"},
                http_factory=lambda: httpx.AsyncClient(transport=transport),
                port_in_use=never_in_use,
                state=self.state,
                adapters=limits or AdapterLimits(),
            ),
        )
        self.app = create_app(self.host, token=None)

    def client(self) -> TestClient:
        client = TestClient(self.app)
        client.event_hooks = {"request": [], "response": [check_response]}
        return client


def checkpoint(
    root: Path, name: str, *, weights: bytes = WEIGHTS, answer: str = "trained"
) -> tuple[Path, Any]:
    """A completed checkpoint as a trainer writes it: the files, then the manifest last."""
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": 8, "name": name}))
    (directory / "adapter_model.safetensors").write_bytes(weights)
    manifest = manifest_for(
        directory,
        name="support-bot",
        base_model="base",
        base_model_digest="sha256:" + "0" * 64,
        rank=8,
        target_modules=["q_proj"],
        eval_answers=[EvalAnswer("hi", 4, answer, "base says")],
        completed_at="2026-12-05T08:00:00Z",
        training={"checkpoint": name},
    )
    manifest_write(directory, manifest)
    return directory, manifest


def listing(client: TestClient) -> dict[str, Any]:
    response = client.get("/v1/adapters")
    assert response.status_code == 200, response.text
    return response.json()


def upload(client: TestClient, source: Path, adapter_id: str, chunk: int = 5000) -> None:
    """Send every file of `source` (the manifest first) in chunks, as a sender would."""
    names = [MANIFEST_NAME, *sorted(p.name for p in source.iterdir() if p.name != MANIFEST_NAME)]
    for name in names:
        data = (source / name).read_bytes()
        for offset in range(0, max(len(data), 1), chunk):
            response = client.put(
                f"/v1/adapters/{adapter_id}/files/{name}?offset={offset}",
                content=data[offset : offset + chunk],
            )
            assert response.status_code == 200, response.text
            assert response.json()["bytes"] == min(len(data), offset + chunk)


# -- the store: importing trained checkpoints --------------------------------------------------


def test_a_completed_checkpoint_is_imported_when_listed_and_its_files_match(tmp_path):
    under = Under(tmp_path)
    source, manifest = checkpoint(under.training, "step-000040")
    with under.client() as client:
        assert FEATURE_ADAPTERS in client.get("/v1/status").json()["features"]
        body = listing(client)
    [stored] = body["adapters"]
    assert stored["id"] == store_id(manifest.digest) == manifest.store_id
    assert stored["digest"] == manifest.digest
    assert stored["origin"] == "trained" and stored["checkpoint"] == "step-000040"
    assert stored["bytes"] == len(WEIGHTS) + len((source / "adapter_config.json").read_bytes())
    assert stored["manifest"]["eval"][0]["answer"] == "trained"
    kept = tmp_path / "state" / "adapters" / stored["id"]
    assert (kept / "adapter_model.safetensors").read_bytes() == WEIGHTS
    assert body["rejected"] == [] and body["incoming"] == [] and body["loaded"] == []


def test_a_torn_checkpoint_without_its_manifest_is_neither_imported_nor_rejected(tmp_path):
    under = Under(tmp_path)
    source, _ = checkpoint(under.training, "step-000010")
    (source / MANIFEST_NAME).unlink()  # the trainer died before writing the marker
    with under.client() as client:
        body = listing(client)
    assert body["adapters"] == [] and body["rejected"] == []
    assert not (tmp_path / "state" / "adapters").exists() or not any(
        p.name[0] != "." for p in (tmp_path / "state" / "adapters").iterdir()
    )


def test_a_checkpoint_whose_file_does_not_match_its_manifest_is_rejected_not_imported(tmp_path):
    under = Under(tmp_path)
    source, manifest = checkpoint(under.training, "step-000020")
    flipped = bytearray(WEIGHTS)
    flipped[100] ^= 1
    (source / "adapter_model.safetensors").write_bytes(bytes(flipped))
    with under.client() as client:
        body = listing(client)
    assert body["adapters"] == []
    [rejected] = body["rejected"]
    assert rejected["checkpoint"].endswith("step-000020")
    assert "adapter_model.safetensors" in rejected["why"] and "sha256" in rejected["why"]
    assert not (tmp_path / "state" / "adapters" / manifest.store_id).exists()


def test_the_store_size_bound_refuses_an_import_with_a_clear_reason(tmp_path):
    under = Under(tmp_path, limits=AdapterLimits(store_bytes=1000))
    checkpoint(under.training, "step-000001")
    with under.client() as client:
        body = listing(client)
    assert body["adapters"] == []
    assert "HARU_SUPERVISOR_ADAPTER_STORE_BYTES" in body["rejected"][0]["why"]


# -- transfers --------------------------------------------------------------------------------


def test_a_copy_sent_in_chunks_is_committed_and_served_back_with_ranges(tmp_path):
    source, manifest = checkpoint(tmp_path / "src", "step-1")
    receiver = Under(tmp_path)
    adapter_id = manifest.store_id
    with receiver.client() as client:
        upload(client, source, adapter_id)
        incoming = listing(client)["incoming"]
        assert incoming == [
            {
                "id": adapter_id,
                "files": {p.name: p.stat().st_size for p in sorted(source.iterdir())},
            }
        ]
        response = client.post(
            f"/v1/adapters/{adapter_id}/commit", json={"digest": manifest.digest}
        )
        assert response.status_code == 200, response.text
        assert response.json() == {
            "id": adapter_id,
            "digest": manifest.digest,
            "bytes": manifest.bytes,
        }
        body = listing(client)
        assert [a["origin"] for a in body["adapters"]] == ["received"]
        assert body["incoming"] == []
        whole = client.get(f"/v1/adapters/{adapter_id}/files/adapter_model.safetensors")
        assert whole.status_code == 200 and whole.content == WEIGHTS
        part = client.get(
            f"/v1/adapters/{adapter_id}/files/adapter_model.safetensors",
            headers={"Range": "bytes=1000-"},
        )
        assert part.status_code == 206 and part.content == WEIGHTS[1000:]
        assert part.headers["content-range"] == f"bytes 1000-{len(WEIGHTS) - 1}/{len(WEIGHTS)}"
        bad = client.get(
            f"/v1/adapters/{adapter_id}/files/adapter_model.safetensors",
            headers={"Range": f"bytes={len(WEIGHTS) + 1}-"},
        )
        assert bad.status_code == 416 and bad.json()["error"]["code"] == "range_not_satisfiable"
        assert client.get(f"/v1/adapters/{adapter_id}/files/nope.bin").status_code == 404


def test_an_interrupted_transfer_resumes_from_the_offset_the_listing_gives(tmp_path):
    under = Under(tmp_path)
    source, manifest = checkpoint(tmp_path / "src", "step-1")
    adapter_id = manifest.store_id
    weights = "adapter_model.safetensors"
    with under.client() as client:
        first = client.put(
            f"/v1/adapters/{adapter_id}/files/{weights}?offset=0", content=WEIGHTS[:7000]
        )
        assert first.json()["bytes"] == 7000
        # The sender lost its place: a wrong offset is refused with what the copy holds.
        wrong = client.put(f"/v1/adapters/{adapter_id}/files/{weights}?offset=0", content=b"x")
        assert wrong.status_code == 409
        assert wrong.json()["error"] == {
            "code": "offset_mismatch",
            "message": wrong.json()["error"]["message"],
            "bytes": 7000,
        }
        # A commit before the copy is whole keeps it (409), so the sender can go on.
        early = client.post(f"/v1/adapters/{adapter_id}/commit", json={"digest": manifest.digest})
        assert early.status_code == 409
        held = listing(client)["incoming"][0]["files"][weights]
        assert held == 7000
        rest = client.put(
            f"/v1/adapters/{adapter_id}/files/{weights}?offset={held}", content=WEIGHTS[held:]
        )
        assert rest.json()["bytes"] == len(WEIGHTS)
        for name in ("adapter_config.json", MANIFEST_NAME):
            data = (source / name).read_bytes()
            assert (
                client.put(
                    f"/v1/adapters/{adapter_id}/files/{name}?offset=0", content=data
                ).status_code
                == 200
            )
        done = client.post(f"/v1/adapters/{adapter_id}/commit", json={"digest": manifest.digest})
        assert done.status_code == 200, done.text
    stored = tmp_path / "state" / "adapters" / adapter_id / weights
    assert stored.read_bytes() == WEIGHTS


def test_a_corrupted_byte_fails_the_commit_422_and_nothing_is_kept(tmp_path):
    under = Under(tmp_path)
    source, manifest = checkpoint(tmp_path / "src", "step-1")
    corrupt = bytearray(WEIGHTS)
    corrupt[5000] ^= 0x40
    (source / "adapter_model.safetensors").write_bytes(bytes(corrupt))  # the manifest is the old
    with under.client() as client:
        upload(client, source, manifest.store_id)
        response = client.post(
            f"/v1/adapters/{manifest.store_id}/commit", json={"digest": manifest.digest}
        )
        assert response.status_code == 422
        assert response.json()["error"]["code"] == "digest_mismatch"
        assert "adapter_model.safetensors" in response.json()["error"]["message"]
        body = listing(client)
    assert body["adapters"] == [] and body["incoming"] == []
    assert not (tmp_path / "state" / "adapters" / ".incoming" / manifest.store_id).exists()
    assert not (tmp_path / "state" / "adapters" / manifest.store_id).exists()


def test_a_commit_naming_another_digest_is_refused_and_the_copy_deleted(tmp_path):
    under = Under(tmp_path)
    source, manifest = checkpoint(tmp_path / "src", "step-1")
    other = "sha256:" + hashlib.sha256(b"other").hexdigest()
    with under.client() as client:
        upload(client, source, manifest.store_id)
        response = client.post(f"/v1/adapters/{manifest.store_id}/commit", json={"digest": other})
        assert response.status_code == 422
        assert listing(client)["incoming"] == []


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("/v1/adapters/{id}/files/..%2Fescape?offset=0", 400),
        ("/v1/adapters/{id}/files/.hidden?offset=0", 400),
        ("/v1/adapters/{id}/files/a.bin?offset=-1", 400),
        ("/v1/adapters/{id}/files/a.bin", 400),
        ("/v1/adapters/NOTANID/files/a.bin?offset=0", 400),
    ],
)
def test_bad_transfer_requests_are_refused_with_nothing_written(tmp_path, url, code):
    under = Under(tmp_path)
    with under.client() as client:
        response = client.put(url.replace("{id}", "a" * 32), content=b"data")
        assert response.status_code in (code, 404), response.text
        assert listing(client)["incoming"] == []


def test_the_whole_adapter_cap_refuses_a_chunk_413(tmp_path):
    under = Under(tmp_path, limits=AdapterLimits(max_bytes=10_000))
    with under.client() as client:
        url = f"/v1/adapters/{'b' * 32}/files/adapter_model.safetensors"
        assert client.put(f"{url}?offset=0", content=b"x" * 9000).status_code == 200
        over = client.put(f"{url}?offset=9000", content=b"x" * 2000)
        assert over.status_code == 413
        assert "HARU_SUPERVISOR_ADAPTER_MAX_BYTES" in over.json()["error"]["message"]
        assert listing(client)["incoming"][0]["files"] == {"adapter_model.safetensors": 9000}


def test_the_chunk_cap_is_checked_by_the_route_too(tmp_path):
    under = Under(tmp_path, limits=AdapterLimits(chunk_bytes=64 * 1024))
    with under.client() as client:
        url = f"/v1/adapters/{'c' * 32}/files/w.bin?offset=0"
        response = client.put(url, content=b"x" * (64 * 1024 + 1))
        assert response.status_code == 413
        assert "HARU_SUPERVISOR_ADAPTER_CHUNK_BYTES" in response.json()["error"]["message"]


# -- load, unload, wake, restart ---------------------------------------------------------------


def stored_adapter(under: Under, client: TestClient) -> str:
    _, manifest = checkpoint(under.training, "step-000040")
    [adapter] = listing(client)["adapters"]
    assert adapter["id"] == manifest.store_id
    return adapter["id"]


def test_a_load_reaches_the_engine_with_the_store_dir_and_reports_the_engines_truth(tmp_path):
    under = Under(tmp_path)
    with under.client() as client:
        adapter_id = stored_adapter(under, client)
        body = {"model": "base", "name": "support-bot@v1", "id": adapter_id}
        response = client.post("/v1/adapters/load", json=body)
        assert response.status_code == 200, response.text
        assert response.json() == {"model": "base", "name": "support-bot@v1", "loaded": True}
        [(port, kind, sent)] = under.fakes.lora_calls
        assert (port, kind) == (PORT, "load")
        assert sent == {
            "lora_name": "support-bot@v1",
            "lora_path": str(tmp_path / "state" / "adapters" / adapter_id),
        }
        # Idempotent: vLLM's "already loaded" 400 is a success.
        assert client.post("/v1/adapters/load", json=body).json()["loaded"] is True
        assert listing(client)["loaded"] == [
            {"model": "base", "name": "support-bot@v1", "id": adapter_id}
        ]
        status = next(
            m for m in client.get("/v1/status").json()["slots"][0]["models"] if m["name"] == "base"
        )
        assert status["adapters"] == {"wanted": ["support-bot@v1"], "loaded": ["support-bot@v1"]}
        # Deleting a loaded adapter is refused; after the unload it goes.
        refused = client.delete(f"/v1/adapters/{adapter_id}")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "adapter_loaded"
        unloaded = client.post(
            "/v1/adapters/unload", json={"model": "base", "name": "support-bot@v1"}
        )
        assert unloaded.json()["loaded"] is False
        assert under.fakes.loras[PORT] == {}
        assert client.delete(f"/v1/adapters/{adapter_id}").json() == {
            "id": adapter_id,
            "deleted": True,
        }
        # Gone, and not imported again from the unchanged checkpoint it came from.
        assert listing(client)["adapters"] == []
        assert not (tmp_path / "state" / "adapters" / adapter_id).exists()


def test_the_engine_truth_is_reported_not_what_was_asked(tmp_path):
    under = Under(tmp_path)
    with under.client() as client:
        adapter_id = stored_adapter(under, client)
        client.post("/v1/adapters/load", json={"model": "base", "name": "a@v1", "id": adapter_id})
        under.fakes.restart(PORT)  # the engine lost it (a crash the supervisor did not see)
        assert listing(client)["loaded"] == []
        model = client.get("/v1/status").json()["slots"][0]["models"][0]
        assert model["adapters"] == {"wanted": ["a@v1"], "loaded": []}


def test_a_load_while_asleep_is_remembered_and_done_at_the_wake_before_it_answers(tmp_path):
    under = Under(tmp_path)
    with under.client() as client:
        adapter_id = stored_adapter(under, client)
        assert client.post("/v1/vllm/sleep", json={"gpuIndex": 0}).status_code == 200
        response = client.post(
            "/v1/adapters/load", json={"model": "base", "name": "a@v2", "id": adapter_id}
        )
        assert response.json() == {
            "model": "base",
            "name": "a@v2",
            "loaded": False,
            "pending": "wake",
        }
        assert under.fakes.lora_calls == []
        assert client.post("/v1/vllm/wake", json={"gpuIndex": 0}).status_code == 200
        # Loaded by the time the wake answered: no waiting here.
        assert "a@v2" in under.fakes.loras[PORT]
        calls = under.fakes.servers[PORT].calls
        assert calls.index("POST /wake_up") < calls.index("POST /v1/load_lora_adapter")


def test_the_wanted_set_survives_a_supervisor_restart_and_is_loaded_again(tmp_path):
    first = Under(tmp_path)
    with first.client() as client:
        adapter_id = stored_adapter(first, client)
        client.post("/v1/adapters/load", json={"model": "base", "name": "a@v3", "id": adapter_id})
    first.state.release()
    # A new supervisor over the same state dir; the model server restarted meanwhile.
    fakes = first.fakes
    fakes.restart(PORT)
    second = Under(tmp_path, fakes=fakes)
    with second.client() as client:
        model = client.get("/v1/status").json()["slots"][0]["models"][0]
        assert model["adapters"]["wanted"] == ["a@v3"]
        # A wake (the failover's) loads it again.
        assert client.post("/v1/vllm/wake", json={"gpuIndex": 0}).status_code == 200
        assert list(fakes.loras[PORT]) == ["a@v3"]


def test_an_engine_without_runtime_lora_refuses_clearly_and_nothing_is_remembered(tmp_path):
    under = Under(tmp_path)
    with under.client() as client:
        adapter_id = stored_adapter(under, client)
        response = client.post(
            "/v1/adapters/load", json={"model": "other", "name": "a@v1", "id": adapter_id}
        )
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "lora_unsupported"
        assert "sglang" in response.json()["error"]["message"]
    assert not (tmp_path / "state" / "adapter-loads").exists()


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": "base", "name": "Bad Name", "id": "a" * 32}, 400),
        ({"model": "base", "name": "ok"}, 400),
        ({"model": "nope", "name": "ok", "id": "a" * 32}, 404),
        ({"model": "base", "name": "ok", "id": "a" * 32}, 404),  # not stored
    ],
)
def test_bad_loads_are_refused_with_nothing_changed(tmp_path, body, status):
    under = Under(tmp_path)
    with under.client() as client:
        assert client.post("/v1/adapters/load", json=body).status_code == status
    assert under.fakes.lora_calls == []
    assert not (tmp_path / "state" / "adapter-loads").exists()


def test_a_restarted_server_gets_its_adapters_loaded_again(tmp_path):
    under = Under(tmp_path)
    with under.client() as client:
        adapter_id = stored_adapter(under, client)
        client.post("/v1/adapters/load", json={"model": "base", "name": "a@v4", "id": adapter_id})
        under.fakes.restart(PORT)
        model = under.host.models[0]
        # What ManagedProcess calls when it has spawned a new process.
        assert client.portal is not None
        client.portal.call(lambda: _started(model, under.host))
        deadline = time.monotonic() + 5
        while "a@v4" not in under.fakes.loras[PORT]:
            assert time.monotonic() < deadline, "not loaded again"
            time.sleep(0.02)


async def _started(model: Any, host: Host) -> None:
    model.on_process_started(lambda: host.http)
