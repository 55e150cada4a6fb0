"""A faithful fake of the supervisor's adapter API (docs/adapters.md, the table), for FakeHost.

A store of complete adapters (trained here or received), incoming copies (bytes per file, as
PUT appends them), the loads it remembers (loaded while the model is awake, pending while it
sleeps, as the supervisor loads them again on wake), and golden probes of a loaded adapter:
it answers the trainer's recorded `answer` to each eval prompt, or, with a fault, the base
model's answer (`serves_base`: loaded but serving nothing) or another text (`wrong`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from common.adapter_manifest import (
    FORMAT,
    MANIFEST_NAME,
    ManifestInvalid,
    manifest_parse,
    store_id,
)

FEATURE_ADAPTERS = "adapters"


def make_adapter(
    name: str,
    *,
    base: str = "llama-small",
    weights: bytes = b"w" * 3000,
    evals: list[tuple[str, str, str]] | None = None,
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A trainer's output: its manifest (as JSON) and its files. `evals`: (prompt, answer,
    baseAnswer)."""
    files = {"adapter_config.json": b'{"r": 8}', "adapter_model.safetensors": weights}
    manifest = {
        "format": FORMAT,
        "name": name,
        "baseModel": base,
        "baseModelDigest": "sha256:" + "0" * 64,
        "rank": 8,
        "targetModules": ["q_proj"],
        "files": [
            {"path": p, "sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)}
            for p, b in sorted(files.items())
        ],
        "eval": [
            {"prompt": p, "maxTokens": 8, "answer": a, "baseAnswer": b}
            for p, a, b in (evals or [("Say hi", "Ahoy matey", "Hello")])
        ],
        "training": {"steps": 40},
        "completedAt": "2026-12-05T08:00:00Z",
    }
    return manifest, files


def _error(status: int, code: str, message: str, **extra: Any) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message, **extra}})


@dataclass
class FakeAdapterStore:
    # id -> (manifest, files, origin, checkpoint)
    stored: dict[str, tuple[dict, dict[str, bytes], str, str]] = field(default_factory=dict)
    incoming: dict[str, dict[str, bytearray]] = field(default_factory=dict)
    # (model, name) -> id: what the supervisor remembers to load (on wake, after restarts)
    loads: dict[tuple[str, str], str] = field(default_factory=dict)
    # faults: engine names answering like the base model / answering something else
    serves_base: set[str] = field(default_factory=set)
    wrong: set[str] = field(default_factory=set)
    # engine names whose probes time out (a busy CPU engine): no answer, not a wrong one
    silent: set[str] = field(default_factory=set)
    # A PUT body this many bytes long at most (HARU_SUPERVISOR_ADAPTER_CHUNK_BYTES)
    chunk_cap: int = 1024 * 1024
    # After this many PUTs, every further PUT fails (a cut connection); None: no cut
    cut_after_puts: int | None = None
    puts: int = 0
    # A file GET sends this many bytes, then its connection breaks; None: no cut
    cut_get_after: int | None = None

    def train(self, manifest: dict, files: dict[str, bytes], checkpoint: str = "step-40") -> str:
        sid = store_id(manifest_parse(manifest).digest)
        self.stored[sid] = (manifest, dict(files), "trained", checkpoint)
        return sid

    def handle(self, host: Any, request: httpx.Request, body: dict) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")[2:]  # after v1/adapters
        method = request.method
        if method == "GET" and not parts:
            return httpx.Response(200, json=self._listing(host))
        if method == "POST" and parts == ["load"]:
            return self._load(host, body)
        if method == "POST" and parts == ["unload"]:
            self.loads.pop((body.get("model"), body.get("name")), None)
            return httpx.Response(200, json={"model": body.get("model"), "name": body.get("name")})
        sid = parts[0] if parts else ""
        if method == "GET" and len(parts) == 3 and parts[1] == "files":
            return self._get_file(request, sid, parts[2])
        if method == "PUT" and len(parts) == 3 and parts[1] == "files":
            return self._put_file(request, sid, parts[2])
        if method == "POST" and len(parts) == 2 and parts[1] == "commit":
            return self._commit(sid, body)
        if method == "DELETE" and len(parts) == 1:
            if sid in self.loads.values():
                return _error(409, "adapter_loaded", f"adapter {sid} is loaded; unload it first")
            if self.stored.pop(sid, None) is None:
                return _error(404, "not_found", f"no stored adapter {sid}")
            return httpx.Response(200, json={"id": sid, "deleted": True})
        return _error(404, "not_found", f"no route {request.url.path}")

    def _listing(self, host: Any) -> dict:
        return {
            "adapters": [
                {
                    "id": sid,
                    "digest": manifest_parse(m).digest,
                    "bytes": manifest_parse(m).bytes,
                    "origin": origin,
                    "checkpoint": checkpoint,
                    "storedAt": "2026-12-05T08:00:00Z",
                    "manifest": m,
                }
                for sid, (m, _, origin, checkpoint) in self.stored.items()
            ],
            "incoming": [
                {"id": sid, "files": {p: len(b) for p, b in files.items()}}
                for sid, files in self.incoming.items()
            ],
            "rejected": [],
            "loaded": [
                {"model": model, "name": name, "id": sid}
                for (model, name), sid in self.loads.items()
                if host.models.get(model) is False
            ],
        }

    def _load(self, host: Any, body: dict) -> httpx.Response:
        model, name, sid = body.get("model"), body.get("name"), body.get("id")
        if model not in host.models:
            return _error(404, "invalid_target", f"unknown model {model!r}")
        if sid not in self.stored:
            return _error(404, "not_found", f"no stored adapter {sid}")
        self.loads[(model, name)] = sid
        host.effects["adapter_load"] += 1
        if host.models[model]:
            return httpx.Response(
                200, json={"model": model, "name": name, "loaded": False, "pending": "wake"}
            )
        return httpx.Response(200, json={"model": model, "name": name, "loaded": True})

    def _get_file(self, request: httpx.Request, sid: str, path: str) -> httpx.Response:
        entry = self.stored.get(sid)
        if entry is None:
            return _error(404, "not_found", f"no stored adapter {sid}")
        manifest, files = entry[0], entry[1]
        data = (
            json.dumps(manifest, indent=1, sort_keys=True).encode()
            if path == MANIFEST_NAME
            else files.get(path)
        )
        if data is None:
            return _error(404, "not_found", f"no file {path}")
        header = request.headers.get("range", "")
        start = int(header[6:].rstrip("-")) if header.startswith("bytes=") else 0
        status = 206 if header else 200
        cut = self.cut_get_after
        if cut is None or path == MANIFEST_NAME:
            return httpx.Response(status, content=data[start:])

        def broken():
            yield data[start : start + cut]
            raise httpx.ReadError("connection reset")

        return httpx.Response(status, content=broken())

    def _put_file(self, request: httpx.Request, sid: str, path: str) -> httpx.Response:
        self.puts += 1
        if self.cut_after_puts is not None and self.puts > self.cut_after_puts:
            raise httpx.ReadError("connection reset", request=request)
        if sid in self.stored:
            return _error(409, "already_stored", f"adapter {sid} is already stored here")
        data = request.content
        if len(data) > self.chunk_cap:
            return _error(413, "payload_too_large", "chunk over the cap")
        offset = int(request.url.params.get("offset", "-1"))
        held = self.incoming.setdefault(sid, {}).setdefault(path, bytearray())
        if offset != len(held):
            return _error(409, "offset_mismatch", f"holds {len(held)}", bytes=len(held))
        held += data
        return httpx.Response(200, json={"id": sid, "path": path, "bytes": len(held)})

    def _commit(self, sid: str, body: dict) -> httpx.Response:
        files = self.incoming.get(sid)
        if files is None:
            return _error(404, "not_found", f"no incoming copy of adapter {sid}")
        if MANIFEST_NAME not in files:
            return _error(409, "transfer_incomplete", f"{MANIFEST_NAME} has not been sent yet")
        try:
            manifest = manifest_parse(json.loads(bytes(files[MANIFEST_NAME])))
        except (ManifestInvalid, ValueError) as exc:
            del self.incoming[sid]
            return _error(422, "digest_mismatch", f"{MANIFEST_NAME}: {exc}")
        for f in manifest.files:
            got = bytes(files.get(f.path, b""))
            if len(got) < f.bytes:
                return _error(409, "transfer_incomplete", f"{f.path} is short")
            if hashlib.sha256(got).hexdigest() != f.sha256 or body.get("digest") != manifest.digest:
                del self.incoming[sid]
                return _error(422, "digest_mismatch", f"{f.path}: sha256 differs")
        del self.incoming[sid]
        self.stored[sid] = (
            manifest.as_json(),
            {f.path: bytes(files[f.path]) for f in manifest.files},
            "received",
            "",
        )
        return httpx.Response(
            200, json={"id": sid, "digest": manifest.digest, "bytes": manifest.bytes}
        )

    def probe_results(self, host: Any, body: dict) -> list[dict]:
        """The adapter results of a golden probe (`adapters: {model: [name]}`)."""
        out = []
        for model, names in (body.get("adapters") or {}).items():
            for name in names:
                sid = self.loads.get((model, name))
                awake = host.models.get(model) is False
                if name in self.silent and sid is not None:
                    out.append(
                        {
                            "model": model,
                            "adapter": name,
                            "ok": False,
                            "latencyMs": 4500,
                            "error": "timed out after 4500ms",
                        }
                    )
                    continue
                if sid is None or sid not in self.stored or not awake:
                    out.append(
                        {
                            "model": model,
                            "adapter": name,
                            "ok": False,
                            "latencyMs": 3,
                            "error": "adapter not loaded",
                        }
                    )
                    continue
                manifest = manifest_parse(self.stored[sid][0])
                e = next((e for e in manifest.eval if e.prompt == body.get("prompt")), None)
                answer = "unrelated" if e is None else e.answer
                if name in self.serves_base and e is not None:
                    answer = e.base_answer
                if name in self.wrong:
                    answer = "something else entirely"
                out.append(
                    {"model": model, "adapter": name, "ok": True, "latencyMs": 3, "answer": answer}
                )
        return out
