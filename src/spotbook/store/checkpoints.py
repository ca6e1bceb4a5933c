"""The notebook's checkpoint directory, kept in the run store.

The kernel writes to a private local directory and the runner syncs it: before the run
continues (download), after a cell that wrote into it (before its record), every
``--checkpoint-interval`` seconds while cells run, and after a termination notice
(upload). A local store is kept the same way as an object store: a folder of plain files
in the store could be changed by whoever can write the store, between two attempts, and
nothing would notice.

A sync uploads each changed file once, content-addressed (``state/blobs/SHA256``,
shared with kernel-state blobs), then writes a manifest
``files/aMMMM-SSSSSS.json`` mapping relative paths to blobs. The newest manifest
wins, so a kill in the middle of a sync leaves the previous sync whole, and an attempt
that was superseded while it uploaded writes no manifest. A file that
changes while it is uploaded is left for the next sync (write checkpoints to a
temporary name and ``os.replace`` them into place, and a sync never sees half a
file).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .._errors import StoreIntegrityError, SupersededError
from .integrity import inside, make_private_dirs
from .runstore import RunStore

log = logging.getLogger(__name__)
_CHUNK = 1 << 20


def file_digest(path: str) -> str:
    """The sha256 of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


@dataclass
class SyncResult:
    """What one sync of the checkpoint directory did."""

    files: int = 0
    uploaded_files: int = 0
    uploaded_bytes: int = 0
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)


class CheckpointDir:
    """Keeps ``local`` and the run store's checkpoint manifests in step."""

    def __init__(self, store: RunStore, local: str, attempt: int) -> None:
        self.store = store
        self.local = local
        self.attempt = attempt
        self._seq = 0
        # path -> (stamp, digest) of what the store already holds
        self._known: dict[str, tuple[tuple[int, int, int], str]] = {}
        self._blobs: set[str] = set()
        self._last_manifest: dict[str, Any] | None = None
        self._lock = threading.Lock()  # a periodic sync may still run in its thread
        # every byte this attempt uploaded, counted where it lands: a sync whose caller
        # stopped waiting (cancelled on a notice) still finishes its uploads in its thread
        self.uploaded_bytes = 0

    # -- download --------------------------------------------------------------
    def restore(self, manifest: dict[str, Any] | None) -> int:
        """Fill the local directory from ``manifest`` (the store's newest, checked by
        ``RunStore.files_manifest``: sealed, paths inside); returns bytes fetched."""
        if manifest is None:
            return 0
        fetched = 0
        for rel, entry in sorted(manifest["files"].items()):
            target = os.path.join(self.local, *rel.split("/"))
            make_private_dirs(os.path.dirname(target))
            target = inside(self.local, rel)  # no link placed on the way leads out
            tmp = f"{target}.spotbook-part"
            self.store.get_file(self.store.blob_path(entry["sha256"]), tmp)
            if file_digest(tmp) != entry["sha256"]:
                os.unlink(tmp)
                raise StoreIntegrityError(
                    f"{self.store.url}/{self.store.blob_path(entry['sha256'])} (checkpoint "
                    f"file {rel!r}) does not match its hash; it was not restored. The store "
                    "was modified; inspect it, or start over with --restart"
                )
            os.replace(tmp, target)
            if entry.get("mtime_ns"):
                os.utime(target, ns=(entry["mtime_ns"], entry["mtime_ns"]))
            self._known[rel] = (_stamp(os.stat(target)), entry["sha256"])
            self._blobs.add(entry["sha256"])
            fetched += entry["size"]
        self._last_manifest = manifest["files"]
        log.info("restored %d checkpoint files (%d bytes)", len(manifest["files"]), fetched)
        return fetched

    # -- upload ----------------------------------------------------------------
    def _walk(self) -> list[str]:
        out = []
        for root, _dirs, files in os.walk(self.local):
            for name in files:
                if name.endswith(".spotbook-part"):
                    continue
                full = os.path.join(root, name)
                out.append(os.path.relpath(full, self.local).replace(os.sep, "/"))
        return sorted(out)

    def sync(self) -> SyncResult:
        """Upload what changed since the last sync and write a new manifest."""
        with self._lock:
            return self._sync()

    def _sync(self) -> SyncResult:
        t0 = time.monotonic()
        result = SyncResult()
        files: dict[str, Any] = {}
        for rel in self._walk():
            full = os.path.join(self.local, *rel.split("/"))
            try:
                before = _stamp(os.stat(full))
                known = self._known.get(rel)
                if known and known[0] == before:
                    digest = known[1]
                else:
                    digest = file_digest(full)
                    if digest not in self._blobs and not self.store.exists(
                        self.store.blob_path(digest)
                    ):
                        size = self.store.put_file(full, self.store.blob_path(digest))
                        result.uploaded_bytes += size
                        self.uploaded_bytes += size
                        result.uploaded_files += 1
                    if _stamp(os.stat(full)) != before:
                        raise _Changed
                    self._blobs.add(digest)
                    self._known[rel] = (before, digest)
            except (_Changed, FileNotFoundError):
                result.skipped.append(rel)
                old = (self._last_manifest or {}).get(rel)
                if old is not None:  # keep the last good copy of a file being rewritten
                    files[rel] = old
                continue
            files[rel] = {"sha256": digest, "size": before[0], "mtime_ns": before[1]}
        result.files = len(files)
        if files != self._last_manifest:
            # the runner fenced before the sync began; uploads can take long enough for
            # a new attempt to start meanwhile, and then its manifests must win alone
            if self.store.superseded(self.attempt):
                raise SupersededError(
                    f"attempt {self.attempt} was superseded during a checkpoint sync; "
                    "its manifest was not written"
                )
            self._seq += 1
            self.store.write_files_manifest(
                self.attempt,
                self._seq,
                {"attempt": self.attempt, "written": time.time(), "files": files},
            )
            self._last_manifest = files
        result.seconds = time.monotonic() - t0
        if result.skipped:
            log.info(
                "checkpoint files changing during sync, kept for next time: %s", result.skipped
            )
        return result


class _Changed(Exception):
    """A file changed while it was being uploaded."""
