"""The runner: one attempt at a run, from kernel start to exit.

It claims an attempt in the store, restores kernel state and replays what the
resume plan says, then runs the remaining cells one by one. After each cell it
commits a record (fenced: a superseded attempt stops instead of writing),
maybe takes a snapshot (cost-aware policy), and refreshes ``output.ipynb`` on
a throttle. Time limits and termination notices race each cell; a SIGTERM lets
the running cell finish within the grace budget, else interrupts it, and ends
the attempt as preempted.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import __version__
from .._errors import (
    CellExecutionError,
    CellTimeoutError,
    KernelDiedError,
    PreemptionBudgetError,
    ResumeRefusedError,
    RunTimeoutError,
    SnapshotIntegrityError,
    StorageError,
    SupersededError,
    Terminated,
    UsageError,
)
from .._models import EXIT_MARGIN, SAVE_BUDGET, Clock, Outcome, RunSpec, RunStatus, SnapshotMode
from ..notebook import document as nbs
from ..store.checkpoints import CheckpointDir
from ..store.integrity import make_private_dirs
from ..store.runstore import CellKey, RunStore
from .environment import nvidia_gpus, where
from .executor import (
    CellResult,
    KernelDied,
    KernelSession,
    check_kernel,
    kernel_env,
    python_transform,
)
from .fidelity import FidelityReport
from .progress import Progress
from .replay import ResumePlan, plan_resume

log = logging.getLogger(__name__)
T = TypeVar("T")
_KERNEL_MODULE = "__import__('spotbook.kernel.session', fromlist=['_'])"
_EXIT_OK = {"", "0", "None"}
SNAPSHOT_FORMAT = 2  # manifests of other formats are not loaded (the cells are replayed)
_TRANSFERS = 8  # object stores: concurrent blob transfers


@dataclass(frozen=True)
class RunnerOptions:
    """How the runner behaves, apart from what the run spec fixes."""

    output_refresh: float = 5.0
    on_output: Callable[[str, dict[str, Any]], None] | None = None
    progress: Progress | None = None  # the CLI's and the API's tqdm bar
    clock: Clock = time.time
    handle_signals: bool = True
    grace: float | None = None  # overrides the run's --grace for this attempt
    strict_resume: bool = False  # refuse to resume when the result could differ
    # Called from a watchdog thread when the process is still here EXIT_MARGIN after
    # the notice's deadline; it must end the process (the CLI exits with 75). None: no
    # watchdog (the Python API never ends its caller's process).
    on_overrun: Callable[[str], None] | None = None


@dataclass(frozen=True)
class RunResult:
    """How a finished attempt left the run."""

    run_id: str
    url: str
    status: RunStatus
    cells_done: int
    cells_total: int
    attempt: int
    replayed: tuple[int, ...] = ()


class _Notice:
    """The termination notice: set by a signal, visible to the kernel through a file."""

    def __init__(self, path: str) -> None:
        self.path = path
        # the kernel creates this when spotbook.preempted() first returns True
        self.seen_path = path + ".seen"
        self.event = asyncio.Event()
        # one future for the whole attempt: racing each cell against it costs nothing
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.signame = ""
        self.at = 0.0
        # what the work running at the notice did: "none" (nothing ran), "stopped" (it
        # saw spotbook.preempted() and returned), "finished" (within the grace),
        # "interrupted" (it outlived the grace)
        self.cell = "none"

    def fire(self, signame: str) -> None:
        if self.event.is_set():
            return
        self.signame = signame
        self.at = time.monotonic()
        log.info("received %s: finishing the current cell, then saving progress", signame)
        with contextlib.suppress(OSError), open(self.path, "w") as fh:
            fh.write(signame)
        self.event.set()
        self.future.set_result(None)


def start_index(nb: Any, records: dict[int, dict[str, Any]]) -> int:
    """First executable cell without a completed record (len(cells) when all done)."""
    for i, cell in enumerate(nb.cells):
        if nbs.executable(cell) and records.get(i, {}).get("status") != "completed":
            return i
    return len(nb.cells)


def exited_early(records: dict[int, dict[str, Any]]) -> bool:
    return any(r.get("status") == "exited" for r in records.values())


class Runner:
    """Runs (or resumes) the run in ``store`` as one attempt."""

    def __init__(self, store: RunStore, options: RunnerOptions | None = None) -> None:
        self.store = store
        self.opts = options or RunnerOptions()
        # Nothing from the store is used before its seal is checked (exit 2 if not).
        strict = self.opts.strict_resume or bool(
            (store.read_json("run.json") or {}).get("spec", {}).get("strict_resume")
        )
        self._run = store.unseal(strict=strict)
        self.spec = RunSpec.from_json(self._run["spec"])
        raw = store.read("input.ipynb")
        assert store.seal is not None
        if raw is None or not store.input_matches(self._run, raw):
            raise store.seal.refuse("input.ipynb", "does not match the hash sealed in run.json")
        self.nb = nbs.load_frozen(raw)
        self.records: dict[int, dict[str, Any]] = {}
        self.attempt = 0
        self.attempt_rec: dict[str, Any] = {}
        self.session: KernelSession | None = None
        self._snap_enabled = self.spec.snapshot.mode is not SnapshotMode.OFF
        self._snap_cost: float | None = None
        self._snap_rate = 250e6  # bytes of state a snapshot gets through per second
        self._snaps_taken = 0
        self._compute_since_snap = 0.0
        self._last_refresh = 0.0
        self._refresh_cost = 0.0
        self._deadline: float | None = None
        self._notice: _Notice | None = None
        self._blob_bytes = 0  # written by the kernel, reported in snapshot manifests
        self._grace = self.spec.limits.grace if self.opts.grace is None else self.opts.grace
        if self._grace < 0:
            raise UsageError("--grace must be zero or more seconds")
        self._files: CheckpointDir | None = None  # object stores: the synced checkpoint dir
        self._files_task: asyncio.Future[None] | None = None
        self._watchdog: threading.Timer | None = None
        self._early_sync: asyncio.Future[None] | None = None
        self._tmp = ""
        self._kernel_env: dict[str, str] = {}
        self._undone: list[str] = []  # files given back to the cell that runs again
        self._uploaded: set[str] = set()  # object stores: blobs known to be in the store
        self._snapshot_doc: dict[str, Any] | None = None  # checked before the kernel starts
        self._files_manifest: dict[str, Any] | None = None
        # cell -> the whole text of outputs cut to --max-output-bytes (its hash is sealed
        # in the cell's record)
        self._spilled: dict[int, dict[str, str]] = {}

    # -- entry ---------------------------------------------------------------
    def run(self) -> RunResult:
        return asyncio.run(self.arun())

    async def arun(self) -> RunResult:
        self.records, notes = self.store.records_and_notes()
        start = start_index(self.nb, self.records)
        executed = notes.get(start)
        if exited_early(self.records) or start >= len(self.nb.cells):
            return self._finish_already_done()
        self._preflight(start)
        self._check_budget()
        self._claim(start)
        if executed is not None and executed.get("undo"):
            self._undone = _undo_files(start, executed["undo"])
            self.attempt_rec["files_given_back"] = self._undone
        tmp = tempfile.mkdtemp(prefix="spotbook-")
        self._tmp = tmp
        self._notice = _Notice(os.path.join(tmp, "notice"))
        loop = asyncio.get_running_loop()
        installed = self._install_signals(loop)
        try:
            return await self._attempt(start, tmp)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            if self._watchdog is not None:
                self._watchdog.cancel()
            if self.opts.progress is not None:
                self.opts.progress.close()
            if self.session is not None:
                await self.session.shutdown()
            self.store.close()
            for path in (self._notice.path, self._notice.seen_path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            if self._files is not None:
                shutil.rmtree(self._files.local, ignore_errors=True)
            shutil.rmtree(os.path.join(tmp, "blobs"), ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(tmp)

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[signal.Signals]:
        if not self.opts.handle_signals:
            return []
        installed: list[signal.Signals] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._notice_fire, signal.Signals(sig).name)
                installed.append(sig)
            except (RuntimeError, ValueError):  # not the main thread
                break
        return installed

    def _notice_fire(self, signame: str) -> None:
        assert self._notice is not None
        first = not self._notice.event.is_set()
        self._notice.fire(signame)
        if first:
            # --grace plus the save budget bounds the time to exit: storage retries give
            # up (and say so) rather than sleep past it
            self.store.deadline = self._notice.at + self._grace + SAVE_BUDGET
            if self.opts.on_overrun is not None:
                self._watchdog = threading.Timer(
                    self._grace + SAVE_BUDGET + EXIT_MARGIN, self._overrun
                )
                self._watchdog.daemon = True
                self._watchdog.start()
        if first and self._files is not None:
            # Upload the checkpoint directory now, while the cell uses its grace: the
            # sync after the cell then only sends what the cell saved since.
            self._early_sync = asyncio.ensure_future(self._sync_files_quietly())

    def _overrun(self) -> None:
        """The watchdog's thread: the time to exit ran out while the loop is stuck."""
        assert self.opts.on_overrun is not None
        if self.session is not None:
            self.session.kill_now()
        done = len(self.records)
        self.opts.on_overrun(
            f"run {self.spec.run_id}: still saving {self._grace + SAVE_BUDGET + EXIT_MARGIN:.0f}"
            f" s after the {self._notice.signame if self._notice else 'notice'} (--grace "
            f"{self._grace:g} s + {SAVE_BUDGET:g} s to save): the store at {self.store.url} "
            "does not answer; stopping now. What was committed before stays "
            f"({done} cell records); `spotbook resume` continues from there"
        )

    def _preflight(self, start: int) -> None:
        """Check, before any kernel starts, what this attempt will take from the store."""
        assert self.store.seal is not None
        later = sorted(i for i in self.records if i > start)
        if later:
            raise self.store.seal.refuse(
                f"cells/ (cell {start})",
                f"has no record while later cells {later[:5]} have one: a record was removed",
            )
        check_kernel(self.spec.kernel_name)  # not an attempt: bad input (exit 2)
        self._snapshot_doc = self._usable_snapshot(start)
        self._files_manifest = None if self.store.local else self.store.files_manifest()

    # -- attempt bookkeeping ----------------------------------------------------
    def _check_budget(self) -> None:
        limit = self.spec.limits.max_preemptions
        if limit is None:
            return
        # Preempted attempts, and attempts still marked running: those were killed
        # without notice (node gone, SIGKILL), which costs the same.
        used = sum(1 for a in self.store.attempts() if a.get("outcome") in _INTERRUPTED)
        if used > limit:
            message = (
                f"run {self.spec.run_id} was interrupted {used} times, more than its budget "
                f"of {limit} (--max-preemptions); see `spotbook status {self.store.url}`, and "
                "resume with a larger --max-preemptions if the interruptions were not the "
                "notebook's fault"
            )
            self._set_status(RunStatus.FAILED, message)
            raise PreemptionBudgetError(message)

    def _claim(self, start: int) -> None:
        self.attempt_rec = {
            **where(),
            "started": self.opts.clock(),
            "resumed_from": start,
            "outcome": Outcome.RUNNING.value,
        }
        gpus = nvidia_gpus()
        if gpus is not None:
            self.attempt_rec["gpus"] = gpus
        self.attempt = self.store.claim_attempt(self.attempt_rec)
        self.attempt_rec["attempt"] = self.attempt
        removed = self.store.remove_partials()  # what a killed writer left half-made
        if removed:
            log.info("removed %d partial files a killed attempt left in the store", removed)
        self._set_status(RunStatus.RUNNING)
        log.info(
            "run %s attempt %d starting at cell %d (%s)",
            self.spec.run_id,
            self.attempt,
            start,
            self.store.url,
        )

    def _end_attempt(self, outcome: Outcome, **extra: Any) -> None:
        self.attempt_rec.update(
            outcome=outcome.value,
            ended=self.opts.clock(),
            store_bytes=self.store.bytes_written + self._blob_bytes,
            **extra,
        )
        # A superseded attempt still closes its own record (only it writes that file):
        # so it is not taken for a preemption, nor counted against the budget. It
        # writes nothing the newer attempt owns.
        if outcome is not Outcome.SUPERSEDED:
            self.store.update_attempt(self.attempt, self.attempt_rec)
            return
        with contextlib.suppress(Exception):  # best effort: the run is not ours any more
            self.store.update_attempt(self.attempt, self.attempt_rec)

    def _set_status(self, status: RunStatus, message: str = "") -> None:
        doc = {
            "spec": self.spec.to_json(),
            "status": status.value,
            "message": message,
            "attempt": self.attempt,
            "updated": self.opts.clock(),
        }
        if "seal" in self._run:  # the spec is unchanged, so its seal still holds
            doc["seal"] = self._run["seal"]
        self.store.write_json("run.json", doc)

    def _fence(self) -> None:
        if self.store.superseded(self.attempt):
            raise SupersededError(
                f"attempt {self.attempt} of run {self.spec.run_id} was superseded by a newer "
                "attempt (another runner took over this run); this one stopped without writing"
            )

    # -- the attempt ----------------------------------------------------------------
    async def _attempt(self, start: int, tmp: str) -> RunResult:
        assert self._notice is not None
        limits = self.spec.limits
        if limits.run_timeout is not None:
            budget = limits.run_timeout - self._elapsed_before()
            self._deadline = time.monotonic() + max(budget, 0.0)
        # Local stores hold the checkpoint directory itself, so it survives a kill;
        # object stores get a local directory that is synced (see _checkpoints).
        checkpoint = self.store.path("files") if self.store.local else os.path.join(tmp, "files")
        make_private_dirs(checkpoint)
        files_restored: asyncio.Future[int] | None = None
        if not self.store.local:
            self._files = CheckpointDir(self.store, checkpoint, self.attempt)
            # fetched while the kernel starts; the first cell waits for it
            files_restored = asyncio.ensure_future(
                asyncio.to_thread(self._files.restore, self._files_manifest)
            )
        env = kernel_env(
            {
                "SPOTBOOK_RUN_DIR": self.store.url,
                "SPOTBOOK_RUN_ID": self.spec.run_id,
                "SPOTBOOK_NOTICE_FILE": self._notice.path,
                "SPOTBOOK_CHECKPOINT_DIR": checkpoint,
                **({"PYTHONHASHSEED": self.spec.hash_seed} if self.spec.hash_seed else {}),
            }
        )
        self._kernel_env = env
        try:
            started = time.monotonic()
            await self._start_kernel(start)
            assert self.session is not None
            self.attempt_rec["kernel_start_seconds"] = round(time.monotonic() - started, 3)
            if files_restored is not None:
                self.attempt_rec["checkpoint_restored_bytes"] = await files_restored
                self.attempt_rec["checkpoint_ready_seconds"] = round(time.monotonic() - started, 3)
                self._files_task = asyncio.ensure_future(self._sync_files_periodically())
            self.nb.metadata["language_info"] = self.session.language_info
            _complete_kernelspec(self.nb, self.spec.kernel_name, self.session.language_info)
            for index, rec in self.records.items():
                self.session.seed_cell(
                    index, nbs.outputs_copy(rec["outputs"]), rec.get("display_ids") or {}
                )
            plan = None
            if self.records:
                async with self._kernel_may_die(start, "while restoring the state before cell"):
                    plan, start = await self._restore(start)
            if plan is None and self.attempt > 1:
                # a later attempt with nothing to restore: it is back on new cells now
                self.attempt_rec["resumed_at"] = self.opts.clock()
                self.store.update_attempt(self.attempt, self.attempt_rec)
            self._refresh(force=True, running=start)
            await self._run_cells(start)
        except Terminated:
            if self.store.superseded(self.attempt):
                # a newer attempt owns the run: leave it run.json, output.ipynb and OUTPUT
                self._end_attempt(Outcome.SUPERSEDED)
                raise SupersededError(
                    f"attempt {self.attempt} of run {self.spec.run_id} was stopped by "
                    f"{self._notice.signame} after a newer attempt had taken over; it wrote "
                    "nothing more"
                ) from None
            await self._final_files_sync()
            notice = self._notice
            self._end_attempt(
                Outcome.PREEMPTED,
                stopped_at=self._next_unfinished(),
                notice={
                    "signal": notice.signame,
                    "cell": notice.cell,
                    "seconds_to_stop": round(time.monotonic() - notice.at, 3),
                },
            )
            self._refresh(force=True, to_output=True)
            self._set_status(RunStatus.INTERRUPTED, f"stopped on {self._notice.signame}")
            raise
        except SupersededError:
            self._end_attempt(Outcome.SUPERSEDED)
            raise
        except ResumeRefusedError as exc:
            self._end_attempt(Outcome.RESUME_REFUSED, error=str(exc))
            self._set_status(RunStatus.RESUME_REFUSED, str(exc))
            raise
        except (CellExecutionError, KernelDiedError) as exc:
            await self._wrap_up(probe=isinstance(exc, CellExecutionError))
            self._end_attempt(Outcome.FAILED, error=str(exc))
            self._refresh(force=True, final=True)
            self._set_status(RunStatus.FAILED, str(exc))
            raise
        except (CellTimeoutError, RunTimeoutError) as exc:
            await self._wrap_up(probe=False)
            self._end_attempt(Outcome.TIMED_OUT, error=str(exc))
            self._refresh(force=True, final=True)
            self._set_status(RunStatus.FAILED, str(exc))
            raise
        except BaseException as exc:
            if self._files_task is not None:
                self._files_task.cancel()
            with contextlib.suppress(Exception):
                self._end_attempt(Outcome.STORAGE_ERROR, error=str(exc))
                self._set_status(RunStatus.INTERRUPTED, str(exc))
            raise
        await self._wrap_up(probe=True)
        self._end_attempt(Outcome.COMPLETED)
        self._refresh(force=True, final=True)
        self._set_status(RunStatus.SUCCEEDED)
        return self._result(plan.replay if plan else ())

    async def _wrap_up(self, *, probe: bool) -> None:
        """End of an attempt that was not stopped: what the kernel saw, last file sync."""
        if probe and self.session is not None:
            expr = f"{_KERNEL_MODULE}.accelerators()"
            with contextlib.suppress(Exception):
                found = json.loads(await asyncio.wait_for(self.session.evaluate(expr), 5.0))
                if found:
                    self.attempt_rec["frameworks"] = found
        await self._final_files_sync()

    # -- checkpoint directory (object stores) ------------------------------------------
    async def _sync_files(self) -> None:
        assert self._files is not None
        self._fence()
        result = await asyncio.to_thread(self._files.sync)
        rec = self.attempt_rec
        rec["checkpoint_syncs"] = rec.get("checkpoint_syncs", 0) + 1
        rec["checkpoint_uploaded_bytes"] = (
            rec.get("checkpoint_uploaded_bytes", 0) + result.uploaded_bytes
        )
        rec["checkpoint_files"] = result.files
        rec["checkpoint_last_sync_seconds"] = round(result.seconds, 3)

    async def _sync_files_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.spec.limits.checkpoint_interval)
            await self._sync_files_quietly()

    async def _sync_files_quietly(self) -> None:
        try:
            await self._sync_files()
        except SupersededError:
            pass  # the next commit stops the attempt
        except StorageError as exc:
            log.warning("checkpoint directory sync failed (%s); trying again later", exc)

    async def _final_files_sync(self) -> None:
        if self._files is None:
            return
        if self._files_task is not None:
            self._files_task.cancel()
            with contextlib.suppress(BaseException):
                await self._files_task
        if self._early_sync is not None:
            await self._early_sync
        try:
            await self._sync_files()
        except (SupersededError, StorageError) as exc:
            log.error("could not save the checkpoint directory: %s", exc)

    def _result(self, replayed: tuple[int, ...] = ()) -> RunResult:
        return RunResult(
            run_id=self.spec.run_id,
            url=self.store.url,
            status=RunStatus.SUCCEEDED,
            cells_done=len(self.records),
            cells_total=sum(1 for c in self.nb.cells if nbs.executable(c)),
            attempt=self.attempt,
            replayed=replayed,
        )

    def _elapsed_before(self) -> float:
        """Compute already spent on this run by earlier attempts (for --timeout)."""
        return sum(float(r.get("duration") or 0.0) for r in self.records.values())

    def _next_unfinished(self) -> int:
        return start_index(self.nb, self.records)

    async def _race(
        self, coro: Awaitable[T], *, grace: float, index: int, cell_timeout: float | None = None
    ) -> T:
        """Await ``coro`` against the time limits and the termination notice."""
        assert self._notice is not None
        task = asyncio.ensure_future(coro)
        notice: asyncio.Future[Any] = self._notice.future
        now = time.monotonic()
        cell_deadline = None if cell_timeout is None else now + cell_timeout
        deadlines = [d for d in (self._deadline, cell_deadline) if d is not None]
        deadline = min(deadlines) if deadlines else None
        try:
            timeout = None if deadline is None else max(0.0, deadline - now)
            racers: set[asyncio.Future[Any]] = {task, notice}
            done, _ = await asyncio.wait(
                racers, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if task in done:
                return task.result()
            if notice in done:
                left = max(0.0, grace - (time.monotonic() - self._notice.at))
                await asyncio.wait({task}, timeout=left)
                if task.done():
                    seen = os.path.exists(self._notice.seen_path)
                    self._notice.cell = "stopped" if seen else "finished"
                    return task.result()
                self._notice.cell = "interrupted"
                raise Terminated(self._notice.signame, self._resume_hint())
            if deadline == cell_deadline and cell_timeout is not None:
                raise CellTimeoutError(cell_index=index, timeout=cell_timeout)
            assert self.spec.limits.run_timeout is not None
            raise RunTimeoutError(cell_index=index, timeout=self.spec.limits.run_timeout)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    def _resume_hint(self) -> str:
        return f"continue with `spotbook resume {self.store.url}`"

    # -- cells -------------------------------------------------------------------
    async def _run_cells(self, start: int) -> None:
        assert self.session is not None and self._notice is not None
        limits = self.spec.limits
        runnable = [i for i, c in enumerate(self.nb.cells) if nbs.executable(c)]
        last = runnable[-1]
        bar = self.opts.progress
        if bar is not None:
            # papermill counts every cell, markdown too
            bar.begin(len(self.nb.cells), start)
        for index in range(start, len(self.nb.cells)):
            cell = self.nb.cells[index]
            if not nbs.executable(cell):
                continue
            if self._notice.event.is_set():
                async with self._kernel_may_die(index - 1, "while taking the snapshot after cell"):
                    await self._last_snapshot(index - 1)
                raise Terminated(self._notice.signame, self._resume_hint())
            if bar is not None:
                bar.cell(index, str(cell.source))
            t0 = self.opts.clock()
            m0 = time.monotonic()
            try:
                result = await self._race(
                    self.session.run_cell(cell, index),
                    grace=self._grace,
                    index=index,
                    cell_timeout=limits.execution_timeout,
                )
            except KernelDied:
                if self._notice.event.is_set():
                    # The node is going away: the runtime may kill the whole process
                    # group when the grace runs out. A preemption, not the cell's fault:
                    # nothing is recorded for the cell, which runs again on resume.
                    log.info("the kernel died after the notice, during cell %d", index)
                    self._notice.cell = "interrupted"
                    raise Terminated(self._notice.signame, self._resume_hint()) from None
                self._commit_failure(index, t0, "KernelDied", "the kernel process died")
                raise KernelDiedError(cell_index=index, execution_count=None) from None
            except CellTimeoutError:
                self._commit_failure(
                    index, t0, "CellTimeoutError", f"exceeded {limits.execution_timeout:g} s"
                )
                raise
            except RunTimeoutError:
                self._commit_failure(index, t0, "RunTimeoutError", "the run's --timeout")
                raise
            if self._notice.event.is_set() and os.path.exists(self._notice.seen_path):
                # The cell saw spotbook.preempted() and stopped early: it is not finished.
                # It runs again on resume, where it picks up from its checkpoint files.
                log.info("cell %d stopped on the notice; it continues on resume", index)
                raise Terminated(self._notice.signame, self._resume_hint())
            duration = time.monotonic() - m0
            status = "completed"
            if result.error and not result.allowed_error:
                exiting = result.error["ename"] == "SystemExit"
                status = "exited" if exiting and result.error["evalue"] in _EXIT_OK else "failed"
            record = self._record(index, result, t0, duration, status)
            undo = record.get("undo")
            snap_due = (
                status == "completed" and index != last and await self._snapshot_due(duration)
            )
            if undo and snap_due:
                # The cell wrote files, and the snapshot flushes them before the cell's
                # record is committed: should the run be killed in between, the cell
                # runs again, and this note lets the resume give it back those files
                # as they were before it first ran.
                self._fence()
                self.store.write_cell(
                    index,
                    self.attempt,
                    {"index": index, "attempt": self.attempt, "status": "executed", "undo": undo},
                )
            if snap_due:
                # Snapshot before the record: once a cell is committed, its effects are
                # in the store too (when the policy snapshots), so a kill after the
                # commit never makes a resume run it again. (Never after the last cell:
                # there is nothing left to resume.)
                try:
                    async with self._kernel_may_die(index, "while taking the snapshot after cell"):
                        await self._snapshot(index)
                except Terminated:
                    self._commit(index, record)
                    raise
            self._commit(index, record)
            self._recommit_updated_displays(index)
            if bar is not None:
                bar.advance(len(self.nb.cells) if index == last else index + 1)
            if status == "failed":
                assert result.error is not None
                raise CellExecutionError(
                    cell_index=index,
                    execution_count=result.execution_count,
                    ename=result.error["ename"],
                    evalue=result.error["evalue"],
                    source=str(self.nb.cells[index].source),
                    traceback=result.error.get("traceback"),
                )
            if status == "exited":
                log.info("cell %d called sys.exit(0): the run ends here, successfully", index)
                return
            self._refresh(running=index + 1)

    @contextlib.asynccontextmanager
    async def _kernel_may_die(self, index: int, during: str) -> AsyncIterator[None]:
        """The kernel dying outside a cell: a preemption after the notice (exit 75),
        else KernelDiedError saying when (exit 138), never an internal error."""
        try:
            yield
        except KernelDied:
            assert self._notice is not None
            if self._notice.event.is_set():
                log.info("the kernel died after the notice, %s %d", during, index)
                raise Terminated(self._notice.signame, self._resume_hint()) from None
            raise KernelDiedError(
                cell_index=max(index, 0), execution_count=None, during=f"{during} {index}"
            ) from None

    def _record(
        self, index: int, result: CellResult, t0: float, duration: float, status: str
    ) -> dict[str, Any]:
        outputs = self._cap(index, result.outputs)
        rec: dict[str, Any] = {
            "index": index,
            "attempt": self.attempt,
            "status": status,
            "execution_count": result.execution_count,
            "outputs": outputs,
            "metadata": result.metadata,
            "start": t0,
            "end": t0 + duration,
            "duration": round(duration, 6),
        }
        if result.error:
            # the traceback is in the cell's outputs already
            rec["error"] = {k: v for k, v in result.error.items() if k != "traceback"}
        if index in self._spilled:
            rec["spilled"] = self._spilled.pop(index)
        noted = _cell_effects(result.reply)
        for key in ("effects", "pre", "undo"):
            if noted.get(key):
                rec[key] = noted[key]
        assert self.session is not None
        display_ids = self.session.display_ids(index)
        if display_ids:
            rec["display_ids"] = display_ids
        return rec

    def _cap(self, index: int, outputs: list[Any]) -> list[Any]:
        """Outputs as recorded; over --max-output-bytes the full text goes to the store."""
        rel = f"outputs/{CellKey(index, self.attempt).name[:-5]}.txt"
        capped, full = _cap_outputs(outputs, self.spec.limits.max_output_bytes, rel)
        if full is not None:
            self._fence()
            data = full.encode("utf-8", "replace")
            self.store.write(rel, data)
            self._spilled[index] = {"path": rel, "sha256": hashlib.sha256(data).hexdigest()}
            log.warning(
                "cell %d printed %d characters; the notebook keeps the head and tail, "
                "the whole text is in %s/%s",
                index,
                len(full),
                self.store.url,
                rel,
            )
        return capped

    def _commit(self, index: int, record: dict[str, Any]) -> None:
        self._fence()
        self.store.write_cell(index, self.attempt, record)
        self.records[index] = record

    def _recommit_updated_displays(self, index: int) -> None:
        """A cell may update a display an earlier cell made (display_id): re-record it."""
        assert self.session is not None
        for earlier in sorted(self.session.take_touched(index)):
            rec = self.records.get(earlier)
            if rec is not None:
                outputs = list(self.nb.cells[earlier].get("outputs", []))
                updated = {**rec, "outputs": self._cap(earlier, outputs)}
                if earlier in self._spilled:
                    updated["spilled"] = self._spilled.pop(earlier)
                self._commit(earlier, updated)

    def _commit_failure(self, index: int, t0: float, ename: str, evalue: str) -> None:
        cell = self.nb.cells[index]
        outputs = list(cell.get("outputs", []))
        outputs.append(
            {
                "output_type": "error",
                "ename": ename,
                "evalue": evalue,
                "traceback": [f"spotbook: {ename}: {evalue}"],
            }
        )
        rec = {
            "index": index,
            "attempt": self.attempt,
            "status": "failed",
            "execution_count": cell.get("execution_count"),
            "outputs": self._cap(index, outputs),
            "metadata": {},
            "start": t0,
            "end": self.opts.clock(),
            "duration": round(self.opts.clock() - t0, 6),
            "error": {"ename": ename, "evalue": evalue},
        }
        with contextlib.suppress(SupersededError):
            self._commit(index, rec)

    # -- output --------------------------------------------------------------------
    def _run_meta(self, final: bool) -> dict[str, Any]:
        return {
            "run_id": self.spec.run_id,
            "run_dir": self.store.url,
            "parameters": self.spec.parameters,
            "attempt": self.attempt,
            "input_path": self.spec.source,
            "output_path": self.spec.output,
            "final": final,
            "version": __version__,
        }

    def _refresh(
        self,
        *,
        force: bool = False,
        final: bool = False,
        running: int | None = None,
        to_output: bool | None = None,
    ) -> int:
        """Write output.ipynb if due (and OUTPUT when the attempt ends); returns its size."""
        now = time.monotonic()
        due = now - self._last_refresh >= max(self.opts.output_refresh, 20 * self._refresh_cost)
        if not (force or due):
            return 0
        nb = nbs.assemble(self.nb, self.records, run_meta=self._run_meta(final), running=running)
        widgets = self.session.widget_state() if self.session is not None else None
        if widgets:  # as nbclient writes it: the widgets' state, for renderers
            nb.metadata["widgets"] = widgets
        data = nbs.dumps(nb).encode()
        self.store.write("output.ipynb", data)
        if (final if to_output is None else to_output) and self.spec.output:
            from ..store.runstore import write_url

            write_url(self.spec.output, data)
        self._last_refresh = time.monotonic()
        self._refresh_cost = self._last_refresh - now
        return len(data)

    def _finish_already_done(self) -> RunResult:
        log.info("run %s has already finished; writing its output again", self.spec.run_id)
        self.attempt = int(self._run.get("attempt", 0))
        self._refresh(force=True, final=True)
        if self._run.get("status") != RunStatus.SUCCEEDED.value:
            # every cell is done (or there are none): whatever run.json said (pending,
            # or running when a killed attempt committed the last cell), it succeeded
            self._set_status(RunStatus.SUCCEEDED)
        return self._result()

    # -- the kernel -------------------------------------------------------------------
    async def _start_kernel(self, index: int) -> None:
        """Start a kernel and spotbook's watchers in it, before any cell runs."""
        self.session = KernelSession(
            self.nb,
            kernel_name=self.spec.kernel_name,
            cwd=self.spec.cwd,
            start_timeout=self.spec.limits.start_timeout,
            env=self._kernel_env,
            on_output=self.opts.on_output,
        )
        await self._race(self.session.start(), grace=0.0, index=index)
        try:
            await self._race(
                self.session.evaluate(f"{_KERNEL_MODULE}.init()"), grace=0.0, index=index
            )
        except RuntimeError as exc:
            self._snap_enabled = False
            log.warning(
                "kernel-state snapshots are off for this run: the kernel cannot import "
                "spotbook (%s); a resume will replay the finished cells instead",
                exc,
            )
            return
        self.session.cell_expressions = {"spotbook": f"{_KERNEL_MODULE}.cell_effects()"}

    def _blob_dir(self) -> str:
        """Where the kernel reads and writes blobs: the store's own directory on a local
        disk, else a staging directory the runner uploads from and downloads into."""
        if self.store.local:
            return self.store.path("state/blobs")
        path = os.path.join(self._tmp, "blobs")
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    # -- snapshots ------------------------------------------------------------------
    async def _snapshot(self, index: int) -> None:
        assert self.session is not None
        m0 = time.monotonic()
        expr = f"{_KERNEL_MODULE}.snapshot({self._blob_dir()!r})"
        raw = None
        for attempt in range(2):  # a storage hiccup may pass; a second failure is kept
            try:
                raw = await self._race(self.session.evaluate(expr), grace=self._grace, index=index)
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
                        f"{self.store.url}`"
                    ) from None
                self._snap_enabled = False
                reason = f"the snapshot after cell {index} failed in the kernel ({exc})"
                self.attempt_rec["snapshots_off"] = reason
                log.warning(
                    "kernel-state snapshots are off for this run: %s; a resume will replay "
                    "the finished cells instead",
                    reason,
                )
                return
        assert raw is not None
        manifest = json.loads(raw)
        if not self.store.local:
            await self._race(
                asyncio.to_thread(self._upload, manifest["new_blobs"]),
                grace=self._grace,
                index=index,
            )
        doc = {
            "format": SNAPSHOT_FORMAT,
            "run_id": self.spec.run_id,
            "after": index,
            "attempt": self.attempt,
            "vars": manifest["vars"],
            "stream": manifest["stream"],
            "env": manifest["env"],
            "imports": manifest["imports"],
            "uncaptured": manifest["uncaptured"],
            "threads": manifest["threads"],
            "bytes_written": manifest["written"],
            "kernel_seconds": manifest["seconds"],
            "capture_seconds": manifest["capture_seconds"],
        }
        self._fence()
        self.store.write_snapshot(CellKey(index, self.attempt), doc)
        self._blob_bytes += int(manifest["written"])
        cost = time.monotonic() - m0
        # The first snapshot of an attempt also pays for warming the snapshot code in
        # the kernel; the policy wants what the next one will cost.
        self._snap_cost = cost if self._snaps_taken else manifest["seconds"]
        if manifest["seconds"] > 0 and manifest["state_bytes"] > 1 << 20:
            self._snap_rate = max(manifest["state_bytes"] / manifest["seconds"], 1e6)
        self._snaps_taken += 1
        self._compute_since_snap = 0.0
        log.debug("snapshot after cell %d: %.3f s, %d new bytes", index, cost, manifest["written"])

    def _upload(self, digests: list[str]) -> None:
        """Object stores: send the blobs the kernel staged that the store lacks."""
        todo = [d for d in dict.fromkeys(digests) if d not in self._uploaded]

        def one(digest: str) -> None:
            rel = self.store.blob_path(digest)
            if not self.store.exists(rel):
                self.store.put_file(os.path.join(self._blob_dir(), digest), rel)
            self._uploaded.add(digest)

        with ThreadPoolExecutor(_TRANSFERS) as pool:
            list(pool.map(one, todo))

    def _download(self, doc: dict[str, Any]) -> None:
        """Object stores: fetch a snapshot's blobs into the staging directory."""
        stream = doc["stream"]
        digests = list(dict.fromkeys([stream["stream"], *stream["buffers"], doc["imports"]]))
        staging = self._blob_dir()

        def one(digest: str) -> None:
            local = os.path.join(staging, digest)
            if not os.path.exists(local):
                self.store.get_file(self.store.blob_path(digest), local + ".part")
                os.replace(local + ".part", local)
            self._uploaded.add(digest)

        with ThreadPoolExecutor(_TRANSFERS) as pool:
            list(pool.map(one, digests))

    async def _snapshot_due(self, duration: float) -> bool:
        """Whether to snapshot after a cell that computed ``duration`` seconds."""
        self._compute_since_snap += duration
        policy = self.spec.snapshot
        if not self._snap_enabled or not policy.due(self._compute_since_snap, self._snap_cost):
            return False
        if policy.mode is not SnapshotMode.AUTO:
            return True
        # The last snapshot's cost says little when the state has grown since: predict
        # this one's from the state's size and the throughput the last one achieved
        # (before the first, a conservative 250 MB/s), and keep to the cost ratio.
        assert self.session is not None
        try:
            size = int(await self.session.evaluate(f"{_KERNEL_MODULE}.state_bytes()"))
        except RuntimeError:
            return True  # _snapshot reports why snapshots cannot work
        predicted = 0.003 + size / self._snap_rate
        if predicted > (self._snap_cost or 0.0):
            # remember it, so the next question waits until it could be worth asking
            self._snap_cost = predicted
        return policy.due(self._compute_since_snap, self._snap_cost)

    async def _last_snapshot(self, index: int) -> None:
        """On a notice between cells: one more snapshot, if it fits the save budget."""
        assert self._notice is not None
        if not self._snap_enabled or self._compute_since_snap <= 0 or index < 0:
            return
        left = SAVE_BUDGET - (time.monotonic() - self._notice.at)
        if self._snap_cost is not None and self._snap_cost * 2 < left:
            with contextlib.suppress(Terminated):
                await self._snapshot(index)

    # -- resume ---------------------------------------------------------------------
    def _usable_snapshot(self, start: int) -> dict[str, Any] | None:
        """The newest committed snapshot before ``start``, verified, or None."""
        keys = [k for i, k in self.store.snapshot_keys().items() if i < start]
        if not keys or not self._snap_enabled:
            return None
        key = max(keys, key=lambda k: k.index)
        doc = self.store.read_snapshot(key)  # refuses a manifest that fails its seal
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

    async def _kernel_call(self, code: str, index: int) -> Any:
        assert self.session is not None
        return await self._race(
            self.session.call(code, f"{_KERNEL_MODULE}.result()"), grace=0.0, index=index
        )

    async def _load_state(
        self, doc: dict[str, Any], index: int, keep: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        """Put a snapshot's variables and library options back (not the generators)."""
        assert self.session is not None
        blob_dir = self._blob_dir()
        manifest = json.dumps({"vars": doc["vars"], "stream": doc["stream"]})
        keeping = tuple(sorted(keep))
        await self._kernel_call(
            f"{_KERNEL_MODULE}.restore({blob_dir!r}, {manifest!r}, {keeping!r})", index
        )
        result: dict[str, Any] = json.loads(
            await self.session.evaluate(f"{_KERNEL_MODULE}.result()")
        )
        if "integrity" in result:
            raise SnapshotIntegrityError(
                f"snapshot {doc['name']} was refused by the kernel: {result['integrity']}; "
                "the store was modified: rerun with --restart"
            )
        if "missing" in result:
            raise _CannotRebuild(result["missing"])
        return result

    async def _restore(self, start: int) -> tuple[ResumePlan | None, int]:
        """Restore the newest usable snapshot and replay what the plan says.

        Returns the plan and the cell to go on from: ``start``, or 0 when the state
        could not be rebuilt and the attempt falls back to a fresh run.
        """
        assert self.session is not None
        m0 = time.monotonic()
        doc = self._snapshot_doc
        report = FidelityReport(snapshot=doc["name"] if doc else None, undone=self._undone)
        failed: dict[str, str] = {}
        kinds: dict[str, str] = {}
        try:
            if doc is not None:
                if not self.store.local:
                    await self._race(asyncio.to_thread(self._download, doc), grace=0.0, index=start)
                env_failed = json.loads(
                    await self.session.evaluate(
                        f"{_KERNEL_MODULE}.restore_env({json.dumps(doc['env'])!r})"
                    )
                )
                await self._kernel_call(
                    f"{_KERNEL_MODULE}.reimport({self._blob_dir()!r}, {doc['imports']!r})", start
                )
                loaded = await self._load_state(doc, start)
                failed = loaded["failed"]
                kinds = {n: str(v.get("type", "")) for n, v in doc["vars"].items()}
                report.restored(doc, failed, {**env_failed, **loaded["process_failed"]})
                self.attempt_rec["restored_bytes"] = loaded["bytes"]
                self.attempt_rec["load_seconds"] = round(loaded["seconds"], 4)
            plan = plan_resume(
                start=start,
                executable=[nbs.executable(c) for c in self.nb.cells],
                sources=nbs.cell_sources(self.nb),
                tags=nbs.cell_tags(self.nb),
                snapshot_after=doc["after"] if doc else None,
                unrestored={n: kinds.get(n, "") for n in failed},
                transform=python_transform,
                effects={i: r.get("effects") or {} for i, r in self.records.items()},
                undo={i: r["undo"] for i, r in self.records.items() if r.get("undo")},
                rng_known=frozenset(
                    i for i, r in self.records.items() if (r.get("pre") or {}).get("rng")
                ),
                stable=frozenset(
                    n
                    for n, v in (doc or {}).get("vars", {}).items()
                    if v.get("kind") == "module" or v.get("type") in ("function", "type")
                ),
            )
            report.planned(plan)
            if plan.unrebuildable:
                raise _CannotRebuild(
                    "; ".join(f"{n!r}: {why}" for n, why in sorted(plan.unrebuildable.items()))
                )
            self._refuse_if_strict(report)
            for index in plan.head:
                await self._set_pre(index, report)
                await self._replay(index)
            if doc is not None:
                if plan.head:
                    # what the chain changed in restored variables is undone; its own
                    # variables stay
                    await self.session.evaluate(
                        f"{_KERNEL_MODULE}.restore_env({json.dumps(doc['env'])!r})"
                    )
                    await self._load_state(doc, start, plan.keep)
                missing = [n for n in plan.chains if not await self._bound(n)]
                if missing:
                    raise _CannotRebuild(
                        f"replaying its chain did not bind {', '.join(map(repr, missing))}"
                    )
                report.process_problems(
                    json.loads(await self.session.evaluate(f"{_KERNEL_MODULE}.apply_last()"))
                )
            if plan.give_back:
                # the files the tail cells wrote, as they were before the first of them
                report.undone.extend(_undo_files(plan.tail[0], dict(plan.give_back)))
            for index in plan.tail:
                await self._replay(index)
        except (_CannotRebuild, _ReplayFailed) as exc:
            return None, await self._fall_back(str(exc), report)
        self._refuse_if_strict(report)
        last_count = max((r.get("execution_count") or 0 for r in self.records.values()), default=0)
        if last_count:
            with contextlib.suppress(RuntimeError):
                await self.session.evaluate(
                    f"{_KERNEL_MODULE}.set_execution_count({last_count + 1})"
                )
        redone = sum(float(self.records.get(i, {}).get("duration") or 0.0) for i in plan.replay)
        self.attempt_rec.update(
            restored_snapshot=doc["name"] if doc else None,
            unrestored=sorted(failed),
            replayed=list(plan.replay),
            restore_seconds=round(time.monotonic() - m0, 3),
            redone_seconds=round(redone, 3),
            fidelity=report.to_json(),
            resumed_at=self.opts.clock(),  # from here on, cells that were never run
        )
        self.store.update_attempt(self.attempt, self.attempt_rec)
        log.info(
            "restored %s; replayed cells %s (%s)",
            doc["name"] if doc else "no snapshot",
            list(plan.replay),
            "; ".join(f"{i}: {why}" for i, why in sorted(plan.reasons.items())) or "none",
        )
        for line in report.may_differ:
            log.warning("may differ from an uninterrupted run: %s", line)
        return plan, start

    async def _set_pre(self, index: int, report: FidelityReport) -> None:
        """Before a chain cell: the cwd, environment and generators it first started from."""
        assert self.session is not None
        pre: dict[str, Any] = {}
        for i in sorted((i for i in self.records if i <= index), reverse=True):
            env = (self.records[i].get("pre") or {}).get("env")
            if env is not None:
                pre["env"] = env
                break
        rng = (self.records.get(index, {}).get("pre") or {}).get("rng")
        if rng:
            pre["rng"] = rng
        if pre:
            expr = f"{_KERNEL_MODULE}.set_pre({json.dumps(pre)!r})"
            report.process_problems(json.loads(await self.session.evaluate(expr)))

    async def _bound(self, name: str) -> bool:
        assert self.session is not None
        return bool(await self.session.evaluate(f"{name!r} in get_ipython().user_ns"))

    def _refuse_if_strict(self, report: FidelityReport) -> None:
        if (self.spec.strict_resume or self.opts.strict_resume) and not report.exact:
            raise ResumeRefusedError(
                f"run {self.spec.run_id} was not resumed (--strict-resume): the resumed run "
                f"could differ from an uninterrupted one: {'; '.join(report.may_differ)}. "
                f"Resume without --strict-resume to accept that, or start over with "
                f"`spotbook run ... --restart`"
            )

    async def _fall_back(self, why: str, report: FidelityReport) -> int:
        """The state cannot be rebuilt: run the notebook again from its first cell in a
        fresh kernel, as this attempt, and say what it cost."""
        report.may_differ.append(f"the kernel state could not be rebuilt ({why})")
        self._refuse_if_strict(report)
        redone = sum(float(r.get("duration") or 0.0) for r in self.records.values())
        log.warning(
            "the kernel state could not be rebuilt (%s): running the notebook again from its "
            "first cell in a fresh kernel (%.1f s of finished cells run again)",
            why,
            redone,
        )
        assert self.session is not None
        await self.session.shutdown()
        self.records = {}
        self.attempt_rec.update(
            resumed_from=0,  # this attempt's records replace every earlier one's
            fallback={"reason": why, "redone_seconds": round(redone, 3)},
            replayed=[],
            redone_seconds=round(redone, 3),
            fidelity={**report.to_json(), "fallback": why},
            resumed_at=self.opts.clock(),
        )
        self.store.update_attempt(self.attempt, self.attempt_rec)
        await self._start_kernel(0)
        self.nb.metadata["language_info"] = self.session.language_info
        return 0

    async def _replay(self, index: int) -> None:
        assert self.session is not None
        try:
            count = self.records.get(index, {}).get("execution_count")
            result = await self._race(
                self.session.replay_cell(index, count), grace=0.0, index=index
            )
        except KernelDied:
            raise _ReplayFailed(f"the kernel died while replaying cell {index}") from None
        if result.error and not result.allowed_error:
            raise _ReplayFailed(
                f"replaying cell {index} raised {result.error['ename']}: {result.error['evalue']}"
            )


class _CannotRebuild(Exception):
    """Internal: the kernel state cannot be rebuilt from the snapshot and replays."""


class _ReplayFailed(_CannotRebuild):
    """Internal: a replayed cell raised, or the kernel died replaying it."""


_INTERRUPTED = {Outcome.PREEMPTED.value, Outcome.KILLED.value, Outcome.RUNNING.value}


def _undo_files(index: int, undo: dict[str, int | None]) -> list[str]:
    """Give cell ``index``, which finished but was killed before its record was
    committed, the files it wrote as they were before it first ran: it runs again."""
    done = []
    for path, size in sorted(undo.items()):
        try:
            if size is None:
                if os.path.isfile(path):
                    os.unlink(path)
                    done.append(f"removed {path}, which cell {index} created")
            elif os.path.getsize(path) > size:
                os.truncate(path, size)
                done.append(f"cut {path} back to the {size} bytes it had before cell {index}")
        except OSError as exc:
            done.append(f"could not restore {path} for cell {index} ({exc.strerror})")
    for line in done:
        log.info("cell %d runs again: %s", index, line)
    return done


def _cell_effects(reply: dict[str, Any]) -> dict[str, Any]:
    """What the kernel noted about a cell: its effects (files written, processes, random
    draws) and, where a replay needs them, the cwd, environment and generators it
    started from."""
    value = (reply.get("user_expressions") or {}).get("spotbook") or {}
    if value.get("status") != "ok":
        return {}
    try:
        found = json.loads(ast.literal_eval(value["data"]["text/plain"]))
    except (ValueError, SyntaxError, KeyError, TypeError):
        return {}
    return found if isinstance(found, dict) else {}


def _complete_kernelspec(nb: Any, name: str, language_info: dict[str, Any]) -> None:
    """Fill in a partial kernelspec (some notebooks have only a language) so the output
    notebook validates and reopens with the kernel that ran it."""
    spec = dict(nb.metadata.get("kernelspec") or {})
    if spec.get("name") and spec.get("display_name"):
        return
    spec.setdefault("name", name)
    spec.setdefault("display_name", name)
    if language_info.get("name"):
        spec.setdefault("language", language_info["name"])
    nb.metadata["kernelspec"] = spec


def _storage_failure(exc: RuntimeError) -> bool:
    """Whether the kernel's snapshot failed on I/O (an OSError: disk full, file too big,
    permissions), as opposed to state it could not pickle."""
    import builtins

    ename = str(exc).split(":", 1)[0].strip()
    cls = getattr(builtins, ename, None)
    return isinstance(cls, type) and issubclass(cls, OSError)


def _cap_outputs(outputs: list[Any], limit: int, where: str) -> tuple[list[Any], str | None]:
    """Keep a cell's stream text under ``limit`` characters: head and tail, with a note.

    Returns the outputs to record and, when something was cut, the full text.
    """
    streams = [o for o in outputs if o.get("output_type") == "stream"]
    total = sum(len(o.get("text", "")) for o in streams)
    if total <= limit:
        return [dict(o) for o in outputs], None
    full = "".join(o.get("text", "") for o in streams)
    out = []
    for o in outputs:
        o = dict(o)
        if o.get("output_type") == "stream":
            text = o["text"]
            share = max(2, limit * len(text) // total)
            if len(text) > share:
                head, tail = text[: share // 2], text[-(share // 2) :]
                omitted = len(text) - len(head) - len(tail)
                o["text"] = (
                    f"{head}\n[spotbook: {omitted} characters omitted: the cell printed "
                    f"{total} characters, over the --max-output-bytes limit of {limit}; the "
                    f"whole text is in the run store at {where}]\n{tail}"
                )
        out.append(o)
    return out, full
