"""Kernel-state snapshots, the runner's side: when to take one (the cost-aware policy),
taking it, moving its blobs to and from an object store, and loading one back.

The kernel does the pickling (:mod:`spotbook.kernel.session`); this module asks it to,
with silent execute requests, and commits the manifest it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .._errors import SnapshotIntegrityError, StorageError, Terminated
from .._models import SAVE_BUDGET, SnapshotMode
from ..store.runstore import CellKey

if TYPE_CHECKING:
    from .context import Attempt

log = logging.getLogger(__name__)
KERNEL_MODULE = "__import__('spotbook.kernel.session', fromlist=['_'])"
SNAPSHOT_FORMAT = 2  # manifests of other formats are not loaded (the cells are replayed)
_TRANSFERS = 8  # object stores: concurrent blob transfers


class CannotRebuild(Exception):
    """Internal: the kernel state cannot be rebuilt from the snapshot and replays."""


class Snapshots:
    """One attempt's snapshots: the policy's measurements, and the blobs moved."""

    def __init__(self, runner: Attempt) -> None:
        self.run = runner
        self.enabled = runner.spec.snapshot.mode is not SnapshotMode.OFF
        self.cost: float | None = None  # what the next snapshot is expected to cost
        self._rate = 250e6  # bytes of state a snapshot gets through per second
        self._taken = 0
        self.compute_since = 0.0  # cell compute since the last snapshot
        self._uploaded: set[str] = set()  # object stores: blobs known to be in the store
        self.usable: dict[str, Any] | None = None  # checked before the kernel starts

    def seed(self, doc: dict[str, Any]) -> None:
        """Take the restored snapshot's measured cost as the policy's first estimate, so a
        resumed attempt does not wait as long as a new run for its first snapshot."""
        seconds = float(doc.get("kernel_seconds") or 0.0)
        size = int(doc.get("state_bytes") or 0)
        if seconds > 0:
            self.cost = seconds
            if size > 1 << 20:
                self._rate = max(size / seconds, 1e6)

    def off(self, reason: str) -> None:
        self.enabled = False
        log.warning(
            "kernel-state snapshots are off for this run: %s; a resume will replay the "
            "finished cells instead",
            reason,
        )

    def blob_dir(self) -> str:
        """Where the kernel reads and writes blobs: the store's own directory on a local
        disk, else a staging directory the runner uploads from and downloads into."""
        store = self.run.store
        if store.local:
            return store.path("state/blobs")
        path = os.path.join(self.run.tmp, "blobs")
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    # -- taking one ------------------------------------------------------------------
    async def due(self, duration: float) -> bool:
        """Whether to snapshot after a cell that computed ``duration`` seconds."""
        self.compute_since += duration
        policy = self.run.spec.snapshot
        if not self.enabled or not policy.due(self.compute_since, self.cost):
            return False
        if policy.mode is not SnapshotMode.AUTO:
            return True
        # The last snapshot's cost says little when the state has grown since: predict
        # this one's from the state's size and the throughput the last one achieved
        # (before the first, a conservative 250 MB/s), and keep to the cost ratio.
        session = self.run.session
        assert session is not None
        try:
            size = int(await session.evaluate(f"{KERNEL_MODULE}.state_bytes()"))
        except RuntimeError:
            return True  # take() reports why snapshots cannot work
        predicted = 0.003 + size / self._rate
        if predicted > (self.cost or 0.0):
            # remember it, so the next question waits until it could be worth asking
            self.cost = predicted
        return policy.due(self.compute_since, self.cost)

    async def take(self, index: int) -> None:
        """Snapshot the kernel's state after cell ``index`` and commit its manifest."""
        run, journal = self.run, self.run.journal
        assert run.session is not None
        m0 = time.monotonic()
        expr = f"{KERNEL_MODULE}.snapshot({self.blob_dir()!r})"
        raw = None
        for attempt in range(2):  # a storage hiccup may pass; a second failure is kept
            try:
                raw = await run.race(run.session.evaluate(expr), grace=run.grace, index=index)
                break
            except RuntimeError as exc:
                if _storage_failure(exc) and attempt == 0:
                    log.warning("the snapshot after cell %d failed (%s); retrying", index, exc)
                    continue
                if _storage_failure(exc):
                    # the disk is full or the store is gone: saying so and stopping keeps
                    # every committed cell; going on would silently lose the safety net
                    raise StorageError(
                        f"the snapshot after cell {index} could not be written ({exc}); "
                        f"progress up to cell {index - 1} is saved. Free space in (or "
                        "restore access to) the run store, then `spotbook resume "
                        f"{run.store.url}`"
                    ) from None
                reason = f"the snapshot after cell {index} failed in the kernel ({exc})"
                journal.attempt_rec["snapshots_off"] = reason
                self.off(reason)
                return
        assert raw is not None
        manifest = json.loads(raw)
        if not run.store.local:
            await run.race(
                asyncio.to_thread(self._upload, manifest["new_blobs"]),
                grace=run.grace,
                index=index,
            )
        doc = {
            "format": SNAPSHOT_FORMAT,
            "run_id": run.spec.run_id,
            "after": index,
            "attempt": journal.attempt,
            **{k: manifest[k] for k in ("vars", "stream", "env", "imports", "uncaptured")},
            "threads": manifest["threads"],
            "bytes_written": manifest["written"],
            "kernel_seconds": manifest["seconds"],
            "capture_seconds": manifest["capture_seconds"],
            "state_bytes": manifest["state_bytes"],
        }
        journal.fence()
        run.store.write_snapshot(CellKey(index, journal.attempt), doc)
        journal.blob_bytes += int(manifest["written"])
        cost = time.monotonic() - m0
        # The first snapshot of an attempt also pays for warming the snapshot code in
        # the kernel; the policy wants what the next one will cost.
        self.cost = cost if self._taken else manifest["seconds"]
        if manifest["seconds"] > 0 and manifest["state_bytes"] > 1 << 20:
            self._rate = max(manifest["state_bytes"] / manifest["seconds"], 1e6)
        self._taken += 1
        self.compute_since = 0.0
        log.debug("snapshot after cell %d: %.3f s, %d new bytes", index, cost, manifest["written"])

    async def last(self, index: int) -> None:
        """On a notice between cells: one more snapshot, if it fits the save budget."""
        notice = self.run.notice
        assert notice is not None
        if not self.enabled or self.compute_since <= 0 or index < 0:
            return
        left = SAVE_BUDGET - (time.monotonic() - notice.at)
        if self.cost is not None and self.cost * 2 < left:
            with contextlib.suppress(Terminated):
                await self.take(index)

    def _upload(self, digests: list[str]) -> None:
        """Object stores: send the blobs the kernel staged that the store lacks."""
        store = self.run.store
        todo = [d for d in dict.fromkeys(digests) if d not in self._uploaded]

        def one(digest: str) -> None:
            rel = store.blob_path(digest)
            if not store.exists(rel):
                store.put_file(os.path.join(self.blob_dir(), digest), rel)
            self._uploaded.add(digest)

        with ThreadPoolExecutor(_TRANSFERS) as pool:
            list(pool.map(one, todo))

    # -- loading one ------------------------------------------------------------------
    def find_usable(self, start: int) -> dict[str, Any] | None:
        """The newest committed snapshot before ``start``, verified, or None."""
        store = self.run.store
        keys = [k for i, k in store.snapshot_keys().items() if i < start]
        if not keys or not self.enabled:
            return None
        key = max(keys, key=lambda k: k.index)
        doc = store.read_snapshot(key)  # refuses a manifest that fails its seal
        if doc is None:
            return None
        if doc.get("format") != SNAPSHOT_FORMAT:
            log.warning(
                "snapshot %s was written by another version of spotbook; the finished "
                "cells are replayed instead",
                key.name,
            )
            return None
        doc["name"] = key.name
        return doc

    def download(self, doc: dict[str, Any]) -> None:
        """Object stores: fetch a snapshot's blobs into the staging directory."""
        store = self.run.store
        stream = doc["stream"]
        digests = list(dict.fromkeys([stream["stream"], *stream["buffers"], doc["imports"]]))
        staging = self.blob_dir()

        def one(digest: str) -> None:
            local = os.path.join(staging, digest)
            if not os.path.exists(local):
                store.get_file(store.blob_path(digest), local + ".part")
                os.replace(local + ".part", local)
            self._uploaded.add(digest)

        with ThreadPoolExecutor(_TRANSFERS) as pool:
            list(pool.map(one, digests))

    async def kernel_call(self, code: str, index: int) -> Any:
        session = self.run.session
        assert session is not None
        return await self.run.race(
            session.call(code, f"{KERNEL_MODULE}.result()"), grace=0.0, index=index
        )

    async def load(
        self, doc: dict[str, Any], index: int, keep: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        """Put a snapshot's variables and library options back (not the generators)."""
        session = self.run.session
        assert session is not None
        manifest = json.dumps({"vars": doc["vars"], "stream": doc["stream"]})
        keeping = tuple(sorted(keep))
        await self.kernel_call(
            f"{KERNEL_MODULE}.restore({self.blob_dir()!r}, {manifest!r}, {keeping!r})", index
        )
        result: dict[str, Any] = json.loads(await session.evaluate(f"{KERNEL_MODULE}.result()"))
        if "integrity" in result:
            raise SnapshotIntegrityError(
                f"snapshot {doc['name']} was refused by the kernel: {result['integrity']}; "
                "the store was modified: rerun with --restart"
            )
        if "missing" in result:
            raise CannotRebuild(result["missing"])
        return result


def _storage_failure(exc: RuntimeError) -> bool:
    """Whether the kernel's snapshot failed on I/O (an OSError: disk full, file too big,
    permissions), as opposed to state it could not pickle."""
    import builtins

    ename = str(exc).split(":", 1)[0].strip()
    cls = getattr(builtins, ename, None)
    return isinstance(cls, type) and issubclass(cls, OSError)
