"""Kernel-state snapshots, the runner's side: when to take one (the cost-aware policy),
taking it, moving its blobs to and from an object store, and loading one back.

The kernel does the pickling (:mod:`spotbook.kernel.session`); this module asks it to,
with silent execute requests, and commits the manifest it returns.

Background snapshots: where the kernel can be forked safely, the snapshot after cell ``i``
is written by a copy-on-write fork of the kernel while the notebook goes on with the next
cells. The records of cell ``i`` and of every cell after it are held (not committed) until
that snapshot's manifest is committed, so the order the cell loop keeps — a snapshot
before the record of the cell it covers — holds as for a synchronous one; a kill while
the copy writes loses only the held records, whose cells then run again.

Where forking is unsafe (torch, polars, LightGBM, a GPU runtime, the notebook's own
threads) the snapshot is staged: pickled at the boundary with the large buffers that
changed copied into staging memory, then hashed and written by a thread of the kernel
while the notebook goes on; the same holding of records applies. Where staging fails too,
it is taken synchronously. The attempt record says which, and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import SnapshotIntegrityError, StorageError, Terminated
from .._models import (
    BACKGROUND_PAUSE_ESTIMATE,
    CHEAPEST_SNAPSHOT,
    SAVE_BUDGET,
    SnapshotMode,
)
from ..store.runstore import CellKey
from .commit_order import CommitOrder
from .kernel_ops import KernelError, KernelOps, storage_failure
from .run_files import RunFiles

if TYPE_CHECKING:
    from .context import Attempt
    from .executor import CellResult

log = logging.getLogger(__name__)
SNAPSHOT_FORMAT = 2  # manifests of other formats are not loaded (the cells are replayed)
# staged snapshots (no fork) for every kernel, not only those that must not fork: for a
# machine where a fork's copy-on-write memory is not to be risked, and for the tests
STAGED_ENV = "SPOTBOOK_SNAPSHOT_STAGED"
_STAGING_RATE = 1e9  # bytes per second a staged snapshot copies, before one is measured
WITH_CELL = "spotbook_snapshot"  # the user expression of a snapshot asked with its cell


def _begun(result_path: str) -> str:
    """The file the kernel makes as it starts a snapshot asked with a cell."""
    return f"{result_path}.begun"


def _gate(result_path: str) -> str:
    """Where the writer of a snapshot asked with a cell waits to be let go."""
    return f"{result_path}.go"


class CannotRebuild(Exception):
    """Internal: the kernel state cannot be rebuilt from the snapshot and replays."""


@dataclass
class WithCell:
    """A staged snapshot the kernel took in a cell's own execute request: where its writer
    leaves the manifest, and what the kernel answered (or the error it raised)."""

    path: str
    answer: dict[str, Any] | KernelError

    @property
    def pause(self) -> float:
        """What the kernel took for it, in the cell's request (0 when it failed)."""
        if isinstance(self.answer, KernelError):
            return 0.0
        return max(0.0, float(self.answer.get("pause") or 0.0))


@dataclass
class Pending:
    """A background snapshot being written (the records waiting for it are held by the
    attempt's :class:`CommitOrder`)."""

    index: int  # the cell it follows
    pid: int  # the kernel's copy that writes it
    result: str  # where the copy leaves its manifest (complete, or not at all)
    started: float  # monotonic
    pause: float  # what it stopped the notebook for
    # the run's files, staged at the boundary (the large ones being saved meanwhile)
    files: asyncio.Future[dict[str, Any]] | None = None
    # commits it (and the held records) the moment it is complete, even mid-cell
    task: asyncio.Task[None] | None = None
    # written by a thread of the kernel itself (staged: the kernel must not fork), so
    # ``pid`` is the kernel's, never to be killed for it
    staged: bool = False
    # of ``pause``, what the kernel took itself (the rest: the request, the run's files)
    kernel_pause: float = 0.0


def _alive(pid: int) -> bool:
    from .._models import alive

    return alive(pid)


async def _exited(pid: int) -> None:
    """Return once process ``pid`` (not ours: the kernel's copy) has ended, or soon after:
    woken by its pidfd where Linux has one, else after a short sleep. (The copy stays a
    zombie until the kernel reaps it, so its pid is not reused meanwhile.)"""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        await asyncio.sleep(0.02)
        return
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ended
    finally:
        loop.remove_reader(fd)
        os.close(fd)


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
        policy = runner.spec.snapshot
        self.background = self.enabled and policy.background
        self.pending: Pending | None = None
        # every finished cell's record commits through it, after the snapshot covering it
        self.order = CommitOrder(runner.journal.commit)
        self.pauses: list[float] = []  # what each background snapshot stopped the notebook for
        self._last_task: asyncio.Task[None] | None = None  # the latest, until settled
        # why this kernel will never fork (a module it loaded): staged without asking
        self._never_forks = ""
        # the cost measured last was a background snapshot's (it does not grow with the
        # state as a synchronous one's does)
        self._background_cost = False
        # the run's files, captured with each snapshot (set by the runner once it knows
        # where the kernel works)
        self.files: RunFiles | None = None
        # whether the kernel can take a snapshot in a cell's own request (it says at start)
        self.can_ask_with_cell = False
        # the snapshot asked for with the running cell: (the cell, its manifest's path)
        self._asked_with_cell: tuple[int, str] | None = None
        self._held: str | None = None  # a snapshot taken with its cell, its writer waiting

    def seed(self, doc: dict[str, Any]) -> None:
        """Take the restored snapshot's measured cost as the policy's first estimate, so a
        resumed attempt does not wait as long as a new run for its first snapshot."""
        cost = float(
            doc.get("cost_seconds") or doc.get("pause_seconds") or doc.get("kernel_seconds") or 0.0
        )
        size = int(doc.get("state_bytes") or 0)
        if cost > 0:
            self.cost = cost
        if doc.get("pause_seconds") is not None:
            self._background_cost = True
        elif float(doc.get("kernel_seconds") or 0.0) > 0 and size > 1 << 20:
            self._rate = max(size / float(doc["kernel_seconds"]), 1e6)

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
        return self.run.store.blob_dir(os.path.join(self.run.tmp, "blobs"))

    # -- taking one ------------------------------------------------------------------
    async def due(self, duration: float) -> bool:
        """Whether to snapshot after a cell that computed ``duration`` seconds."""
        self.compute_since += duration
        policy = self.run.spec.snapshot
        if not self.enabled:
            return False
        if policy.mode is not SnapshotMode.AUTO:
            return policy.due(self.compute_since, self.cost)
        if self.pending is not None:
            # One at a time, and under auto the cells never wait for one: the next is
            # asked for at the first boundary after this one has landed (the compute
            # since keeps counting). (every-cell keeps its promise of one at every
            # boundary: it waits.)
            return False
        # not due even if it cost next to nothing, or than it did last time: no question
        if not policy.due(self.compute_since, self.cost or CHEAPEST_SNAPSHOT):
            return False
        if self.cost is not None and self._background_cost:
            return True  # a background snapshot's cost does not grow with the state
        # Before the first one, or after synchronous ones (whose cost grows with the
        # state): predict this one's from the state's size and the throughput the last
        # one achieved (before the first, a conservative 250 MB/s), or a fork's pause
        # where the copy can write it in the background.
        try:
            found = await self.run.ops.snapshot_estimate()
        except (RuntimeError, ValueError):
            return True  # take() reports why snapshots cannot work
        if self.background and not found["unsafe"]:
            predicted = BACKGROUND_PAUSE_ESTIMATE
        elif self.background:  # staged: the pause is a copy of the state, at most
            predicted = BACKGROUND_PAUSE_ESTIMATE + int(found["bytes"]) / _STAGING_RATE
        else:
            predicted = CHEAPEST_SNAPSHOT + int(found["bytes"]) / self._rate
        if predicted > (self.cost or 0.0):
            # remember it, so the next question waits until it could be worth asking
            self.cost = predicted
        return policy.due(self.compute_since, self.cost)

    def note_files(self, record: dict[str, Any]) -> None:
        """The paths a finished cell opened for writing, for the next capture."""
        if self.files is not None and record.get("written"):
            self.files.note(record["written"])

    async def _capture_files(self, index: int) -> asyncio.Future[dict[str, Any]] | None:
        """The run's files as they are at this cell boundary: scanned, the small changed
        ones saved now (before the next cell can change them); the large ones saved by
        the returned task, beside the next cell (the manifest waits for it)."""
        if self.files is None:
            return None
        try:
            rest = await asyncio.to_thread(self.files.stage, self.blob_dir())
        except OSError as exc:
            raise self._unwritable(index + 1, exc) from None

        async def finish() -> dict[str, Any]:
            try:
                doc, written = await asyncio.to_thread(rest)
            except OSError as exc:
                raise self._unwritable(index + 1, exc) from None
            self.run.journal.blob_bytes += written
            return doc

        return asyncio.ensure_future(finish())

    async def take(self, index: int) -> None:
        """Snapshot the kernel's state after cell ``index`` and commit its manifest."""
        run, journal = self.run, self.run.journal
        m0 = time.monotonic()
        kernel = run.ops
        manifest = None
        for attempt in range(2):  # a storage hiccup may pass; a second failure is kept
            try:
                manifest = await run.race(
                    kernel.snapshot(self.blob_dir()), grace=run.grace, index=index
                )
                break
            except RuntimeError as exc:
                if storage_failure(exc) and attempt == 0:
                    log.warning("the snapshot after cell %d failed (%s); retrying", index, exc)
                    continue
                if storage_failure(exc):
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
        assert manifest is not None
        # the run's files after the kernel's snapshot, which flushed the notebook's open
        # files (what a handle's position says is on disk), and before the next cell
        files = await self._capture_files(index)
        if files is not None:
            manifest["files"] = await files
        await run.race(
            asyncio.to_thread(self._upload, self._needed(manifest)),
            grace=run.grace,
            index=index,
        )
        cost = time.monotonic() - m0
        # The first snapshot of an attempt also pays for warming the snapshot code in
        # the kernel; the policy wants what the next one will cost.
        self.cost = cost if self._taken else manifest["seconds"]
        self._background_cost = False
        self._commit(index, self.manifest_doc(index, manifest, cost=self.cost, written=cost))
        if manifest["seconds"] > 0 and manifest["state_bytes"] > 1 << 20:
            self._rate = max(manifest["state_bytes"] / manifest["seconds"], 1e6)
        self._taken += 1
        self.compute_since = 0.0
        log.debug("snapshot after cell %d: %.3f s, %d new bytes", index, cost, manifest["written"])

    def _commit(self, index: int, doc: dict[str, Any]) -> None:
        """Commit a snapshot's document (:meth:`manifest_doc`), its blobs all in the store."""
        journal = self.run.journal
        journal.fence()
        self.run.store.write_snapshot(CellKey(index, journal.attempt), doc)
        journal.blob_bytes += int(doc["bytes_written"])

    def manifest_doc(
        self,
        index: int,
        manifest: dict[str, Any],
        *,
        cost: float,
        written: float,
        pause: float | None = None,
    ) -> dict[str, Any]:
        """The document a snapshot's manifest is committed as (the state after cell
        ``index``). ``cost``: what the policy counts it as having cost the notebook;
        ``written``: from its start until every blob was in the store; ``pause``: it was
        written in the background, stopping the notebook this long."""
        run, journal = self.run, self.run.journal
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
            "cost_seconds": round(cost, 6),
            "written_seconds": round(written, 6),
        }
        if manifest.get("files") is not None:
            doc["files"] = manifest["files"]
        for key in ("staged_bytes", "reused_bytes"):  # a staged one: copied, and not
            if key in manifest:
                doc[key] = int(manifest[key])
        if pause is not None:
            doc["pause_seconds"] = round(pause, 6)
            doc["kernel_pause_seconds"] = round(float(manifest.get("kernel_pause") or 0.0), 6)
            if "cpu_seconds" in manifest:
                doc["copy_cpu_seconds"] = round(float(manifest["cpu_seconds"]), 6)
        return doc

    # -- in the background ----------------------------------------------------------------
    def _staged_only(self) -> str:
        """Why every snapshot of this kernel is staged without asking ("" if it may fork)."""
        return f"{STAGED_ENV}=1" if os.environ.get(STAGED_ENV) == "1" else self._never_forks

    def _result_path(self, index: int) -> str:
        return os.path.join(self.run.tmp, f"snapshot-{index}-{time.monotonic_ns()}.json")

    def ask_with_cell(self, index: int, *, last: bool) -> dict[str, str] | None:
        """The user expression that takes the snapshot after cell ``index`` in the cell's
        own execute request (a round trip less in its pause), or None: asked for after
        the cell, if due, as before. Only where the snapshot is known before the cell to
        be due if the cell succeeds, and staged (a kernel that will never fork):
        ``every-cell``, or a policy due already before the cell's compute is added (a
        background snapshot's cost known). Not with a cell time limit: the snapshot's
        pause would count against the cell."""
        self._asked_with_cell = None
        run = self.run
        if (
            last
            or not self.can_ask_with_cell
            or not self.background
            or not self._staged_only()
            or run.spec.limits.execution_timeout is not None
        ):
            return None
        policy = run.spec.snapshot
        if policy.mode is SnapshotMode.AUTO and (
            self.pending is not None or self.cost is None or not self._background_cost
        ):
            return None
        if not (self.enabled and policy.due(self.compute_since, self.cost)):
            return None
        path = self._result_path(index)
        self._asked_with_cell = (index, path)
        begun, gate = _begun(path), _gate(path)
        return {WITH_CELL: KernelOps.snapshot_after_cell(self.blob_dir(), path, begun, gate)}

    def died_in_snapshot(self, index: int) -> bool:
        """Whether the kernel, dead during cell ``index``, died in the snapshot asked with
        it (the cell's code had ended), not in the cell."""
        asked = self._asked_with_cell
        return asked is not None and asked[0] == index and os.path.exists(_begun(asked[1]))

    def taken_with_cell(self, index: int, result: CellResult) -> WithCell | None:
        """The snapshot the kernel took in cell ``index``'s own request, if it did (not
        when the cell raised: the expression is then not evaluated)."""
        asked, self._asked_with_cell = self._asked_with_cell, None
        if asked is None or asked[0] != index:
            return None
        value = (result.reply.get("user_expressions") or {}).get(WITH_CELL)
        answer = KernelOps.expression_answer(value)
        if answer is None:
            return None
        if not isinstance(answer, KernelError):
            self._held = asked[1]  # its writer waits for start() (or drop_held())
        return WithCell(asked[1], answer)

    def drop_held(self) -> None:
        """Drop the snapshot the kernel took with the last cell, if :meth:`start` did not
        take it up (the one before it failed, and snapshots are off): its writer, waiting,
        would hold the staged copy of the state until the next snapshot."""
        if self._held is not None:
            KernelOps.release_writer(_gate(self._held), go=False)
            self._held = None

    async def start(self, index: int, taken: WithCell | None = None) -> bool:
        """Start the snapshot after cell ``index`` in a fork of the kernel (or staged);
        False when it must be taken synchronously (why goes into the attempt record).
        ``taken``: the kernel staged it already, in the cell's own request."""
        run = self.run
        assert self.pending is None
        m0 = time.monotonic()
        path = self._result_path(index)
        answer: dict[str, Any] | None
        if taken is not None:  # the kernel's part of the pause was in the cell's request
            if self._held == taken.path:
                # What the cell wrote is noted in the store by now (cells.py notes it
                # before it starts the snapshot): only now may the first blob be written.
                # Killed while they are, the run gives the cell those files back.
                KernelOps.release_writer(_gate(taken.path), go=True)
                self._held = None
            m0 -= taken.pause
            path = taken.path
            answer = {"unsafe": self._staged_only(), "taken": taken.answer}
        elif self._staged_only():  # not asked again: a round trip less in every pause
            answer = {"unsafe": self._staged_only()}
        else:
            fork = run.ops.snapshot_fork(self.blob_dir(), path)
            try:
                answer = await run.race(fork, grace=run.grace, index=index)
            except RuntimeError as exc:
                self._synchronous(f"the kernel could not fork ({exc})")
                return False
            if answer.get("lasting"):
                self._never_forks = str(answer["unsafe"])
        assert answer is not None
        staged = "unsafe" in answer
        if staged:
            answer = await self._staged(index, path, answer["unsafe"], answer.get("taken"))
            if answer is None:
                return False
        # the kernel flushed the notebook's open files before it forked, and waits for
        # the next cell: the files as they are now are the snapshot's
        files = await self._capture_files(index)
        pause = time.monotonic() - m0
        p = self.pending = Pending(
            index,
            int(answer["pid"]),
            path,
            m0,
            pause,
            files,
            staged=staged,
            kernel_pause=float(answer.get("pause") or 0.0),
        )
        self.order.writing(index)
        p.task = self._last_task = asyncio.ensure_future(self._complete(p))
        self.pauses.append(pause)
        self.compute_since = 0.0
        rec = run.journal.attempt_rec
        rec["background_snapshots"] = len(self.pauses)
        rec["snapshot_pause_max"] = round(max(self.pauses), 6)
        return True

    async def _staged(
        self,
        index: int,
        path: str,
        unsafe: str,
        taken: dict[str, Any] | KernelError | None = None,
    ) -> dict[str, Any] | None:
        """The kernel must not fork (``unsafe``): the snapshot is staged instead (pickled
        and its changed buffers copied now, written by a thread of the kernel); None when
        that failed too, and it is to be taken synchronously. ``taken``: what the kernel
        answered when asked with the cell (nothing is asked then)."""
        run = self.run
        try:
            if isinstance(taken, KernelError):
                raise taken
            if taken is not None:
                answer = taken
            else:
                staged = run.ops.snapshot_staged(self.blob_dir(), path)
                answer = await run.race(staged, grace=run.grace, index=index)
        except RuntimeError as exc:
            if storage_failure(exc):
                raise self._unwritable(index, exc) from None
            self._synchronous(f"{unsafe}, and staging the snapshot failed ({exc})")
            return None
        rec = run.journal.attempt_rec
        if rec.get("snapshots_staged") != unsafe:
            log.info("snapshots are staged (copied, then written by a thread): %s", unsafe)
            rec["snapshots_staged"] = unsafe
        if answer.get("fallback"):
            rec["snapshots_staging_fallback"] = answer["fallback"]
        return answer

    def _synchronous(self, why: str) -> None:
        rec = self.run.journal.attempt_rec
        if rec.get("snapshots_sync") != why:
            log.info("this snapshot is taken synchronously: %s", why)
            rec["snapshots_sync"] = why

    def _finished(self, p: Pending) -> dict[str, Any] | None:
        """The copy's manifest (or ``{"error"}``), or None while it still writes."""
        for _ in range(2):
            try:
                with open(p.result) as fh:
                    found: dict[str, Any] = json.load(fh)
                return found
            except FileNotFoundError:
                pass
            if _alive(p.pid):
                return None
            # it ended: look once more (it may have renamed its file in between)
        if p.staged:
            return {"error": "the kernel ended while its thread wrote the snapshot"}
        return {"error": "the snapshot process ended without writing the snapshot"}

    async def _complete(self, p: Pending) -> None:
        """Wait for the copy, upload its blobs (object stores), commit its manifest and
        the records held behind it. Runs beside the cells."""
        while (found := self._finished(p)) is None:
            if p.staged:  # a thread of the kernel: nothing to wait on but its file
                await asyncio.sleep(0.01)
            else:
                await _exited(p.pid)
        try:
            if "error" in found:
                raise RuntimeError(found["error"])
            if "stale" in found:
                # not committed: the held records are, and a resume replays from the
                # snapshot before (as after one given up at a deadline)
                log.warning("the snapshot after cell %d was dropped: %s", p.index, found["stale"])
                rec = self.run.journal.attempt_rec
                rec["snapshots_dropped"] = rec.get("snapshots_dropped", 0) + 1
                self._release(p)
                return
            if p.files is not None:
                found["files"] = await p.files
            await asyncio.to_thread(self._upload, self._needed(found))
            # what the notebook paid: the pause, and the copy's share of the CPUs it
            # took from the machine while the cells went on
            cost = p.pause + float(found.get("cpu_seconds") or 0.0) / max(
                int(found.get("cpus") or 1), 1
            )
            written = time.monotonic() - p.started
            found["kernel_pause"] = p.kernel_pause
            doc = self.manifest_doc(p.index, found, cost=cost, written=written, pause=p.pause)
            self._commit(p.index, doc)
        except (OSError, StorageError) as exc:
            self._lose(p)  # the held records are not committed: their cells rerun
            raise self._unwritable(p.index, exc) from None
        except RuntimeError as exc:
            if storage_failure(exc):
                self._lose(p)
                raise self._unwritable(p.index, exc) from None
            reason = f"the snapshot after cell {p.index} failed in the kernel ({exc})"
            self.run.journal.attempt_rec["snapshots_off"] = reason
            self.off(reason)
        else:
            self.cost = cost
            self._background_cost = True
            self._taken += 1
            log.debug(
                "background snapshot after cell %d: paused %.4f s, written in %.3f s",
                p.index,
                p.pause,
                time.monotonic() - p.started,
            )
        self._release(p)

    def _unwritable(self, index: int, exc: BaseException) -> StorageError:
        return StorageError(
            f"the snapshot after cell {index} could not be written ({exc}); progress up to "
            f"cell {index - 1} is saved. Free space in (or restore access to) the run store, "
            f"then `spotbook resume {self.run.store.url}`"
        )

    async def settle(self, *, wait: bool, deadline: float | None = None) -> None:
        """Raise what the background snapshot met, once it has finished. ``wait``: until
        it has, or until ``deadline`` (monotonic), when it is given up (the copy killed)
        and the held records are committed without it, as a synchronous snapshot cut
        short by the notice leaves them."""
        p = self.pending
        task = p.task if p is not None else self._last_task
        if task is None:
            return
        if not task.done() and wait:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait({task}, timeout=timeout)
        if not task.done():
            if wait and p is not None:
                task.cancel()
                self._give_up(p)
                self._release(p)
                self._last_task = None
            return
        self._last_task = None
        task.result()  # what it met: a StorageError stops the run

    def _release(self, p: Pending) -> None:
        if self.pending is p:
            self.pending = None
            self.order.written()

    def _lose(self, p: Pending) -> None:
        if self.pending is p:
            self.pending = None
            self.order.lost()

    def _give_up(self, p: Pending) -> None:
        if not p.staged:  # (a staged one's writer is a thread of the kernel: left be)
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGKILL)
        log.warning(
            "the snapshot after cell %d did not finish in time; a resume replays from the "
            "one before",
            p.index,
        )

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

    def _needed(self, manifest: dict[str, Any]) -> list[str]:
        """The blobs a manifest needs in the store: the kernel's new ones, and every
        captured file's (those already sent are skipped in ``_upload``)."""
        files = manifest.get("files") or {}
        digests = [
            e["sha256"] for e in (files.get("entries") or {}).values() if e.get("kind") == "file"
        ]
        # every buffer, not only the new ones: a staged snapshot reuses an unchanged
        # buffer's blob from one that may never have been committed (nor sent)
        stream = manifest["stream"]
        return [*manifest["new_blobs"], stream["stream"], *stream["buffers"], *digests]

    def upload_needed(self, manifest: dict[str, Any]) -> None:
        """Send the blobs ``manifest`` needs that the store lacks (none on a local store)."""
        self._upload(self._needed(manifest))

    def _upload(self, digests: list[str]) -> None:
        """Send the blobs the kernel staged that the store lacks (none on a local store)."""
        self.run.store.send_blobs(self.blob_dir(), digests, self._uploaded)

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
        """Fetch a snapshot's blobs where the kernel reads them (nothing to do on a local
        store)."""
        stream = doc["stream"]
        digests = [stream["stream"], *stream["buffers"], doc["imports"]]
        self.run.store.fetch_blobs(self.blob_dir(), digests, self._uploaded)

    async def load(
        self, doc: dict[str, Any], index: int, keep: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        """Put a snapshot's variables and library options back (not the generators)."""
        manifest = {"vars": doc["vars"], "stream": doc["stream"]}
        restore = self.run.ops.restore(self.blob_dir(), manifest, tuple(sorted(keep)))
        result = await self.run.race(restore, grace=0.0, index=index)
        if "integrity" in result:
            raise SnapshotIntegrityError(
                f"snapshot {doc['name']} was refused by the kernel: {result['integrity']}; "
                "the store was modified: rerun with --restart"
            )
        if "missing" in result:
            raise CannotRebuild(result["missing"])
        return result
