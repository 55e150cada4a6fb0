"""The adapter store: LoRA adapters this host holds, checked file by file against their manifest.

Layout under `<state dir>/adapters/`: `<id>/` one complete adapter (its files, its manifest and
`.haru-store.json`, where it came from), `.incoming/<id>/` a copy in transfer from another
supervisor, `.import-<id>/` a checkpoint being imported. `id` is `store_id(digest)`. A directory
under `<id>/` exists only once every file matched the manifest: an import or a transfer is
checked in its side directory and renamed into place, so nothing half-copied is ever listed.

Sources: a training slot's completed checkpoints (a directory holding `haru-adapter.json`,
docs/adapters.md "The trainer contract"), imported when the store is listed; and copies pushed
over HTTP by `PUT .../files/{path}?offset=N` then `POST .../commit`. The manifest of a pushed
copy may come in any order with the other files: the commit reads it, and refuses a copy that
does not match it (the copy is deleted: nothing trusts a file that did not match).

Every method here does blocking file I/O: callers run them off the event loop
(`asyncio.to_thread`), which serves the failover path too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.adapter_manifest import (
    _FILE,
    MANIFEST_NAME,
    MAX_FILES,
    MAX_MANIFEST_BYTES,
    Manifest,
    ManifestInvalid,
    files_verify,
    manifest_read,
)

log = logging.getLogger(__name__)

INCOMING = ".incoming"
IMPORTING = ".import-"
STORE_META = ".haru-store.json"
# Bounds of one listing: the newest adapters, the checkpoints refused, the transfers open.
MAX_LISTED = 64
MAX_REJECTED = 16
MAX_INCOMING = 16
# Checkpoints looked at per training slot's directory per listing (newest first).
MAX_CHECKPOINTS_SCANNED = 64
_ID = re.compile(r"^[0-9a-f]{32}\Z")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}\Z")


class AdapterRefused(Exception):
    """A store operation refused, with the HTTP status and code the API answers."""

    def __init__(
        self, status: int, code: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.details = details


def check_id(adapter_id: str) -> str:
    if not _ID.match(adapter_id):
        raise AdapterRefused(400, "invalid_request", "id: must be 32 lower-case hex digits")
    return adapter_id


def check_file_name(path: str) -> str:
    """A name a manifest may list, or the manifest's own; anything else (a `/`, a dot-name)
    never reaches the file system."""
    if path != MANIFEST_NAME and not _FILE.match(path):
        raise AdapterRefused(
            400, "invalid_request", "path: must be a plain file name (no '/', no leading dot)"
        )
    return path


@dataclass(frozen=True)
class Stored:
    id: str
    manifest: Manifest
    origin: str  # "trained" | "received"
    checkpoint: str | None
    stored_at: str

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "digest": self.manifest.digest,
            "bytes": self.manifest.bytes,
            "origin": self.origin,
            "checkpoint": self.checkpoint,
            "storedAt": self.stored_at,
            "manifest": self.manifest.as_json(),
        }


class AdapterStore:
    """One host's adapters under `root`; thread-safe (calls arrive through to_thread)."""

    def __init__(
        self,
        root: Path,
        *,
        checkpoint_dirs: Sequence[Path],
        max_store_bytes: int,
        max_adapter_bytes: int,
        now: Any,
    ) -> None:
        self.root = root
        self.checkpoint_dirs = tuple(checkpoint_dirs)
        self.max_store_bytes = max_store_bytes
        self.max_adapter_bytes = max_adapter_bytes
        self._now = now  # () -> ISO 8601 UTC text
        self._lock = threading.Lock()
        # What each checkpoint came to, by (path, manifest mtime_ns, size): an import is hashed
        # once, not at every listing. A stored adapter's files never change, so its manifest is
        # cached by id.
        self._seen: dict[tuple[str, int, int], str | None] = {}
        self._rejected: dict[str, str] = {}
        self._stored: dict[str, Stored] = {}

    # -- reading ----------------------------------------------------------------------------

    def listing(self) -> dict[str, Any]:
        """Import the completed checkpoints, then list the store (newest first), the transfers
        in progress and the checkpoints refused."""
        with self._lock:
            self._import_checkpoints()
            stored = sorted(self._all_stored(), key=lambda s: s.stored_at, reverse=True)
            return {
                "adapters": [s.as_json() for s in stored[:MAX_LISTED]],
                "incoming": self._incoming()[:MAX_INCOMING],
                "rejected": [
                    {"checkpoint": c, "why": w}
                    for c, w in list(self._rejected.items())[-MAX_REJECTED:]
                ],
            }

    def get(self, adapter_id: str) -> Stored | None:
        with self._lock:
            return self._read_stored(check_id(adapter_id))

    def file_path(self, adapter_id: str, path: str) -> Path:
        """A stored adapter's file, for GET; 404 when there is none."""
        check_id(adapter_id)
        check_file_name(path)
        with self._lock:
            stored = self._read_stored(adapter_id)
        target = self.root / adapter_id / path
        if stored is None or not target.is_file():
            raise AdapterRefused(404, "not_found", f"no file {path} in stored adapter {adapter_id}")
        return target

    def directory(self, adapter_id: str) -> Path:
        """A stored adapter's directory (what an engine loads); 404 when not stored."""
        if self.get(adapter_id) is None:
            raise AdapterRefused(404, "not_found", f"no stored adapter {adapter_id}")
        return self.root / adapter_id

    def store_bytes(self) -> int:
        return sum(s.manifest.bytes for s in self._all_stored())

    # -- transfers --------------------------------------------------------------------------

    def incoming_size(self, adapter_id: str, path: str) -> int:
        """How many bytes of `path` the incoming copy holds (0: none)."""
        try:
            return (self.root / INCOMING / adapter_id / path).stat().st_size
        except FileNotFoundError:
            return 0

    def begin_chunk(self, adapter_id: str, path: str, offset: int, declared: int | None) -> Path:
        """Check a PUT before any of its body is read; the file to append to."""
        check_id(adapter_id)
        check_file_name(path)
        with self._lock:
            if self._read_stored(adapter_id) is not None:
                raise AdapterRefused(
                    409, "already_stored", f"adapter {adapter_id} is already stored here"
                )
        folder = self.root / INCOMING / adapter_id
        held = self.incoming_size(adapter_id, path)
        if offset != held:
            raise AdapterRefused(
                409,
                "offset_mismatch",
                f"{path}: offset {offset}, but the incoming copy holds {held} bytes",
                details={"bytes": held},
            )
        if declared is not None:
            self.check_room(adapter_id, path, declared)
        folder.mkdir(parents=True, exist_ok=True)
        names = {p.name for p in folder.iterdir()} | {path}
        if len(names) > MAX_FILES + 1:
            raise AdapterRefused(
                400,
                "invalid_request",
                f"an adapter holds at most {MAX_FILES} files and its manifest",
            )
        return folder / path

    def check_room(self, adapter_id: str, path: str, adding: int) -> None:
        """413 when `adding` more bytes would take the incoming copy past the adapter cap (or
        the manifest past its own)."""
        folder = self.root / INCOMING / adapter_id
        total = 0
        if folder.is_dir():
            total = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        if total + adding > self.max_adapter_bytes:
            raise AdapterRefused(
                413,
                "payload_too_large",
                f"the adapter would exceed HARU_SUPERVISOR_ADAPTER_MAX_BYTES "
                f"({self.max_adapter_bytes} bytes)",
            )
        if path == MANIFEST_NAME and self.incoming_size(adapter_id, path) + adding > (
            MAX_MANIFEST_BYTES
        ):
            raise AdapterRefused(
                413, "payload_too_large", f"{MANIFEST_NAME} is at most {MAX_MANIFEST_BYTES} bytes"
            )

    def commit(self, adapter_id: str, digest: str) -> Stored:
        """Check the incoming copy against its manifest and the digest the sender names, and
        move it into the store; 422 `digest_mismatch` (the copy deleted) when anything differs,
        409 `transfer_incomplete` (kept, to resume) while a file is still short."""
        check_id(adapter_id)
        if not _DIGEST.match(digest):
            raise AdapterRefused(400, "invalid_request", "digest: must be sha256:<64 hex digits>")
        with self._lock:
            existing = self._read_stored(adapter_id)
            folder = self.root / INCOMING / adapter_id
            if existing is not None:
                shutil.rmtree(folder, ignore_errors=True)
                if existing.manifest.digest != digest:
                    raise AdapterRefused(
                        422, "digest_mismatch", f"stored adapter {adapter_id} has another digest"
                    )
                return existing
            if not folder.is_dir():
                raise AdapterRefused(404, "not_found", f"no incoming copy of adapter {adapter_id}")
            if not (folder / MANIFEST_NAME).is_file():
                raise AdapterRefused(
                    409, "transfer_incomplete", f"{MANIFEST_NAME} has not been sent yet"
                )
            try:
                manifest = manifest_read(folder)
            except (ManifestInvalid, OSError) as exc:
                self._discard(folder)
                raise AdapterRefused(422, "digest_mismatch", f"{MANIFEST_NAME}: {exc}") from None
            if manifest.digest != digest or manifest.store_id != adapter_id:
                self._discard(folder)
                raise AdapterRefused(
                    422,
                    "digest_mismatch",
                    f"the manifest's digest {manifest.digest} is not {digest} (id {adapter_id})",
                )
            short = [
                f.path for f in manifest.files if self.incoming_size(adapter_id, f.path) < f.bytes
            ]
            if short:
                raise AdapterRefused(
                    409,
                    "transfer_incomplete",
                    f"still short: {', '.join(short)}",
                    details={"files": self._incoming_files(folder)},
                )
            extra = (
                {p.name for p in folder.iterdir()}
                - {f.path for f in manifest.files}
                - {MANIFEST_NAME}
            )
            why = files_verify(folder, manifest) or (
                f"files the manifest does not name: {', '.join(sorted(extra))}" if extra else None
            )
            if why is not None:
                self._discard(folder)
                raise AdapterRefused(422, "digest_mismatch", why)
            self._check_store_room(manifest)
            return self._place(folder, manifest, origin="received", checkpoint=None)

    def delete(self, adapter_id: str, loaded: Iterable[str]) -> None:
        check_id(adapter_id)
        if adapter_id in set(loaded):
            raise AdapterRefused(
                409, "adapter_loaded", f"adapter {adapter_id} is loaded; unload it first"
            )
        with self._lock:
            if self._read_stored(adapter_id) is None:
                raise AdapterRefused(404, "not_found", f"no stored adapter {adapter_id}")
            self._stored.pop(adapter_id, None)
            # Renamed aside first: a crash midway never leaves a half-deleted adapter listed.
            aside = self.root / f"{IMPORTING}deleted-{adapter_id}"
            os.replace(self.root / adapter_id, aside)
            shutil.rmtree(aside, ignore_errors=True)

    # -- internals --------------------------------------------------------------------------

    def _discard(self, folder: Path) -> None:
        log.warning("adapter copy %s did not match its manifest: deleted", folder.name)
        shutil.rmtree(folder, ignore_errors=True)

    def _check_store_room(self, manifest: Manifest) -> None:
        used = self.store_bytes()
        if used + manifest.bytes > self.max_store_bytes:
            raise AdapterRefused(
                507,
                "store_full",
                f"storing {manifest.bytes} bytes would take the store past "
                f"HARU_SUPERVISOR_ADAPTER_STORE_BYTES ({self.max_store_bytes} bytes; "
                f"{used} in use): delete an adapter first",
            )

    def _place(
        self, folder: Path, manifest: Manifest, *, origin: str, checkpoint: str | None
    ) -> Stored:
        stored = Stored(manifest.store_id, manifest, origin, checkpoint, self._now())
        meta = {"origin": origin, "checkpoint": checkpoint, "storedAt": stored.stored_at}
        (folder / STORE_META).write_text(json.dumps(meta), encoding="utf-8")
        os.replace(folder, self.root / stored.id)
        self._stored[stored.id] = stored
        log.info("adapter %s (%s) stored from %s", stored.id, manifest.name, checkpoint or origin)
        return stored

    def _read_stored(self, adapter_id: str) -> Stored | None:
        cached = self._stored.get(adapter_id)
        folder = self.root / adapter_id
        if cached is not None and folder.is_dir():
            return cached
        if not (folder / STORE_META).is_file():
            return None
        try:
            manifest = manifest_read(folder)
            meta = json.loads((folder / STORE_META).read_text(encoding="utf-8"))
        except (ManifestInvalid, OSError, ValueError) as exc:
            log.error("stored adapter %s is unreadable (%s): not listed", adapter_id, exc)
            return None
        stored = Stored(
            adapter_id,
            manifest,
            str(meta.get("origin", "received")),
            meta.get("checkpoint"),
            str(meta.get("storedAt", "")),
        )
        self._stored[adapter_id] = stored
        return stored

    def _all_stored(self) -> list[Stored]:
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            if _ID.match(entry.name):
                stored = self._read_stored(entry.name)
                if stored is not None:
                    found.append(stored)
        return found

    def _incoming_files(self, folder: Path) -> dict[str, int]:
        return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}

    def _incoming(self) -> list[dict[str, Any]]:
        base = self.root / INCOMING
        if not base.is_dir():
            return []
        return [
            {"id": d.name, "files": self._incoming_files(d)}
            for d in sorted(base.iterdir())
            if d.is_dir() and _ID.match(d.name)
        ]

    def _import_checkpoints(self) -> None:
        for directory in self.checkpoint_dirs:
            try:
                entries = [e for e in directory.iterdir() if e.is_dir()]
            except OSError:
                continue
            entries.sort(key=lambda e: e.stat().st_mtime_ns, reverse=True)
            for entry in entries[:MAX_CHECKPOINTS_SCANNED]:
                self._import_one(entry)

    def _import_one(self, checkpoint: Path) -> None:
        try:
            st = (checkpoint / MANIFEST_NAME).stat()
        except OSError:
            return  # no marker: a checkpoint in progress or a resume point, never an adapter
        key = (str(checkpoint), st.st_mtime_ns, st.st_size)
        if key in self._seen:
            return
        why = self._try_import(checkpoint)
        self._seen[key] = why
        name = str(checkpoint)
        self._rejected.pop(name, None)
        if why is not None:
            log.warning("checkpoint %s not imported: %s", checkpoint, why)
            self._rejected[name] = why
            while len(self._rejected) > MAX_REJECTED:
                self._rejected.pop(next(iter(self._rejected)))

    def _try_import(self, checkpoint: Path) -> str | None:
        """Import one completed checkpoint; why not, or None when it is stored (or was)."""
        try:
            manifest = manifest_read(checkpoint)
        except (ManifestInvalid, OSError) as exc:
            return f"{MANIFEST_NAME}: {exc}"
        if self._read_stored(manifest.store_id) is not None:
            return None
        if manifest.bytes > self.max_adapter_bytes:
            return (
                f"{manifest.bytes} bytes, over HARU_SUPERVISOR_ADAPTER_MAX_BYTES "
                f"({self.max_adapter_bytes})"
            )
        try:
            self._check_store_room(manifest)
        except AdapterRefused as exc:
            return str(exc)
        side = self.root / f"{IMPORTING}{manifest.store_id}"
        shutil.rmtree(side, ignore_errors=True)
        try:
            side.mkdir(parents=True)
            for name in [*(f.path for f in manifest.files), MANIFEST_NAME]:
                _link_or_copy(checkpoint / name, side / name)
        except OSError as exc:
            shutil.rmtree(side, ignore_errors=True)
            return f"copying: {exc.strerror or exc}"
        # Checked on the copy, not the source: the trainer may still be writing the source.
        why = files_verify(side, manifest)
        if why is not None:
            shutil.rmtree(side, ignore_errors=True)
            return why
        self._place(side, manifest, origin="trained", checkpoint=checkpoint.name)
        return None


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link when both are on one file system (no bytes copied), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        shutil.copyfile(source, target)
