"""The runner: one attempt at a run, from kernel start to exit.

It claims an attempt in the store, restores kernel state and replays what the
resume plan says, then runs the remaining cells one by one. After each cell it
commits a record (fenced: a superseded attempt stops instead of writing),
maybe takes a snapshot (cost-aware policy), and refreshes ``output.ipynb`` on
a throttle. Time limits and termination notices race each cell; a SIGTERM lets
the running cell finish within the grace budget, else interrupts it, and ends
the attempt as preempted.

The runner owns the cell loop and the attempt's outcome; each other concern has an
owner of its own, which the runner holds:

- :class:`.journal.Journal` — attempt and cell records, run status, the output notebook
- :class:`.snapshots.Snapshots` — the snapshot policy, taking and loading snapshots
- :class:`.restore.Restorer` — rebuilding the state of a resumed run
- :class:`.notice.Notice` — the termination notice, signals and the exit watchdog
- :class:`.files_sync.FilesSync` — the checkpoint directory, synced to the store
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from .._errors import (
    CellExecutionError,
    CellTimeoutError,
    KernelDiedError,
    ResumeRefusedError,
    RunTimeoutError,
    StorageError,
    SupersededError,
    Terminated,
    UsageError,
)
from .._models import (
    EXIT_MARGIN,
    SAVE_BUDGET,
    NoticeCell,
    Outcome,
    RunSpec,
    RunStatus,
    runner_mark,
)
from ..notebook import document as nbs
from ..store.checkpoints import CheckpointDir
from ..store.integrity import make_private_dirs
from ..store.runstore import RunStore
from .cells import CellLoop
from .context import RunnerOptions
from .executor import KernelDied, KernelSession, check_kernel, kernel_env
from .files_sync import FilesSync
from .in_cell import InCell
from .journal import Journal, exited_early, start_index
from .kernel_ops import CELL_EFFECTS, KernelOps
from .notice import Notice
from .replay import ResumePlan
from .restore import Restorer, undo_files
from .run_files import FilesIntegrityError, FilesPolicy, RunFiles, fetch_blob
from .run_files import restore as restore_files
from .snapshots import Snapshots

log = logging.getLogger(__name__)
T = TypeVar("T")


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
    output: str | None = None  # OUTPUT as given (the store's output.ipynb is always there)

    @property
    def notebook(self) -> str:
        """Where the output notebook is: OUTPUT, else the run store's copy."""
        return self.output or f"{self.url}/output.ipynb"


class Runner:
    """Runs (or resumes) the run in ``store`` as one attempt."""

    @classmethod
    def open(
        cls,
        store: RunStore,
        options: RunnerOptions | None = None,
        *,
        run: dict[str, Any] | None = None,
    ) -> Runner:
        """The runner of the run in ``store``, its seal and frozen notebook checked (exit 2
        if not): nothing from the store is used before. ``run``: run.json as the caller
        has just read it (``require_run_of``, to refuse another run's store): its seal is
        checked here, and it is not read again; a store this process prepared
        (``prepare``) was checked and sealed there, and is not checked twice."""
        opts = options or RunnerOptions()
        checked, store.checked_run = store.checked_run, None
        if checked is None or store.seal is None or store.seal.legacy:
            read = store.require_run() if run is None else run
            strict = opts.strict_resume or bool(read["spec"].get("strict_resume"))
            run = store.unseal(strict=strict, run=read)
        else:
            run = checked
            store.refuse_links()  # as unseal does: nothing is read through a link
        spec = RunSpec.from_json(run["spec"], f"{store.url}/run.json")
        raw = store.read("input.ipynb")
        assert store.seal is not None
        if raw is None or not store.input_matches(run, raw):
            raise store.seal.refuse("input.ipynb", "does not match the hash sealed in run.json")
        return cls(store, opts, run, spec, nbs.load_frozen(raw))

    def __init__(
        self, store: RunStore, options: RunnerOptions, run: dict[str, Any], spec: RunSpec, nb: Any
    ) -> None:
        """A runner of what :meth:`open` read and checked (``run``: run.json; ``nb``: the
        frozen notebook); it reads nothing itself."""
        self.store = store
        self.opts = options
        self.run_doc = run  # run.json, its seal checked
        self.spec = spec
        self.nb = nb
        self.grace = self.spec.limits.grace if self.opts.grace is None else self.opts.grace
        if self.grace < 0:
            raise UsageError("--grace must be zero or more seconds")
        self.journal = Journal(store, run, spec, nb, self.opts.output_refresh)
        self.snapshots = Snapshots(self)
        self.in_cell = InCell(self, self.snapshots)
        self.session: KernelSession | None = None
        self.notice: Notice | None = None
        self.tmp = ""  # the attempt's private directory: notice file, staged blobs
        self._mark = -1  # the open file that says this process runs the attempt
        self._deadline: float | None = None  # --timeout, on the monotonic clock
        self._files: FilesSync | None = None  # the synced checkpoint dir
        self._files_manifest: dict[str, Any] | None = None
        self._kernel_env: dict[str, str] = {}
        self._undone: list[str] = []  # files given back to the cell that runs again
        self._run_tmp_dir: str | None = None  # the kernel's TMPDIR, the same every attempt

    @property
    def kernel(self) -> KernelSession:
        """The kernel that runs now (asked for before one started: a bug, not a None)."""
        if self.session is None:
            raise RuntimeError("spotbook asked for the kernel before it started")
        return self.session

    @property
    def ops(self) -> KernelOps:
        """What the runner may ask of the kernel that runs now (the typed seam)."""
        return KernelOps(self.kernel)

    # -- entry ---------------------------------------------------------------
    def run(self) -> RunResult:
        return asyncio.run(self.arun())

    async def arun(self) -> RunResult:
        journal = self.journal
        journal.records, notes = self.store.records_and_notes()
        start = start_index(self.nb, journal.records)
        executed = notes.get(start)
        if exited_early(journal.records) or start >= len(self.nb.cells):
            journal.finish_already_done()
            return self._result()
        self._preflight(start)
        journal.check_budget()
        journal.claim(start)
        if executed is not None and executed.get("undo"):
            self._undone = undo_files(start, executed["undo"])
            journal.attempt_rec["files_given_back"] = self._undone
        self.tmp = tempfile.mkdtemp(prefix="spotbook-")
        # held open until the attempt ends: `cancel` and `drill` check it before a signal
        mark = os.path.join(self.tmp, runner_mark(self.spec.run_id))
        self._mark = os.open(mark, os.O_CREAT | os.O_RDONLY | os.O_CLOEXEC, 0o600)
        self.notice = Notice(os.path.join(self.tmp, "notice"))
        if self.opts.handle_signals:
            self.notice.install(self._on_notice, at_once=self._bound_exit)
        try:
            return await self._attempt(start)
        finally:
            self.notice.close()
            if self.opts.progress is not None:
                self.opts.progress.close()
            if self.session is not None:
                await self.session.shutdown()
            self.store.close()
            if self._files is not None:
                shutil.rmtree(self._files.files.local, ignore_errors=True)
            shutil.rmtree(os.path.join(self.tmp, "blobs"), ignore_errors=True)
            os.close(self._mark)
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.tmp, runner_mark(self.spec.run_id)))
            with contextlib.suppress(OSError):
                os.rmdir(self.tmp)

    def _bound_exit(self, signame: str) -> None:
        """From the signal handler, before the event loop sees the notice (it may be stuck
        in a store request that never returns): --grace plus the save budget bounds the
        time to exit. Storage retries give up (and say so) rather than sleep past it, and
        the watchdog ends the process if a request never returns."""
        at = time.monotonic()
        self.store.deadline = at + self.grace + SAVE_BUDGET
        if self.opts.on_overrun is not None:
            assert self.notice is not None
            self.notice.arm_watchdog(
                self.grace + SAVE_BUDGET + EXIT_MARGIN, lambda: self._overrun(signame)
            )

    def _on_notice(self, signame: str) -> None:
        assert self.notice is not None
        if not self.notice.fire(signame):
            return
        if self._files is not None:
            self._files.on_notice()

    def _overrun(self, signame: str) -> None:
        """The watchdog's thread: the time to exit ran out while the loop is stuck."""
        assert self.opts.on_overrun is not None
        if self.session is not None:
            self.session.kill_now()
        done = len(self.journal.records)
        self.opts.on_overrun(
            f"run {self.spec.run_id}: still saving {self.grace + SAVE_BUDGET + EXIT_MARGIN:.0f}"
            f" s after the {signame} (--grace "
            f"{self.grace:g} s + {SAVE_BUDGET:g} s to save): the store at {self.store.url} "
            "does not answer; stopping now. What was committed before stays "
            f"({done} cell records); `spotbook resume` continues from there"
        )

    def _preflight(self, start: int) -> None:
        """Check, before any kernel starts, what this attempt will take from the store."""
        assert self.store.seal is not None
        later = sorted(i for i in self.journal.records if i > start)
        if later:
            raise self.store.seal.refuse(
                f"cells/ (cell {start})",
                f"has no record while later cells {later[:5]} have one: a record was removed",
            )
        check_kernel(self.spec.kernel_name)  # not an attempt: bad input (exit 2)
        for rec in self.journal.records.values():
            if rec.get("spilled"):  # a cut output the run goes on with: its hash is sealed
                self.store.spilled_text(rec)
        self.snapshots.usable = self.snapshots.find_usable(start)
        inside = self.in_cell.find(start)  # a checkpoint inside the cell to go on from
        if inside is not None:
            self.snapshots.usable = inside
        self._files_manifest = self.store.files_manifest()

    def _run_tmp(self) -> str | None:
        """The run's own temporary directory, at the same path in every attempt (so a
        path a cell kept in a variable still works after a resume), given to the kernel
        as TMPDIR; None where another user's directory is in the way."""
        base = os.environ.get("SPOTBOOK_RUN_TMP") or tempfile.gettempdir()
        path = os.path.join(base, f"spotbook-run-{self.spec.run_id}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            log.warning("%s is not this user's private directory: the kernel keeps TMPDIR", path)
            return None
        return path

    def _stable_checkpoint_dir(self) -> str:
        base = os.environ.get("SPOTBOOK_RUN_TMP") or tempfile.gettempdir()
        path = os.path.join(base, f"spotbook-checkpoint-{self.spec.run_id}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            log.warning("%s is not this user's private directory: using a new one", path)
            return os.path.join(self.tmp, "files")
        for entry in os.listdir(path):  # what an earlier attempt here left: the store's wins
            full = os.path.join(path, entry)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
        return path

    def _prepare_files(self, checkpoint: str, run_tmp: str | None) -> None:
        """The run's files: put back what the restored snapshot lists and this node lacks
        (before the kernel starts: a module a cell wrote must import), and watch the rest."""
        if not self.snapshots.enabled:
            return
        spec = self.spec
        # never the runner's own files: its private directory (staged blobs, the notice),
        # the checkpoint directory, OUTPUT, a local store
        skip = [self.tmp, checkpoint, os.path.abspath(spec.output) if spec.output else ""]
        skip.append(self.store.local_root() or "")
        workdir = os.path.abspath(spec.cwd or os.getcwd())
        files = RunFiles(
            [workdir, *([run_tmp] if run_tmp else [])],
            skip=skip,
            policy=FilesPolicy(spec.snapshot.files_budget, tuple(spec.snapshot.files_exclude)),
        )
        doc = (self.snapshots.usable or {}).get("files")
        if doc:
            try:
                done = restore_files(doc, fetch_blob(self.store))
            except FilesIntegrityError as exc:
                assert self.store.seal is not None and self.snapshots.usable is not None
                where = f"state/snap/{self.snapshots.usable['name']}"
                raise self.store.seal.refuse(where, str(exc)) from None
            self.journal.attempt_rec["files_restored"] = {
                "files": done.files,
                "bytes": done.bytes,
                "seconds": round(done.seconds, 3),
                **({"failed": done.failed} if done.failed else {}),
            }
            if done.files:
                log.info(
                    "this node lacked %d of the run's files: restored them (%d bytes, %.2f s)",
                    done.files,
                    done.bytes,
                    done.seconds,
                )
        files.begin(doc)
        self.snapshots.files = files

    # -- the attempt ----------------------------------------------------------------
    async def _attempt(self, start: int) -> RunResult:
        notice, journal = self.notice, self.journal
        assert notice is not None
        limits = self.spec.limits
        if limits.run_timeout is not None:
            budget = limits.run_timeout - journal.elapsed_before()
            self._deadline = time.monotonic() + max(budget, 0.0)
        run_tmp = self._run_tmp_dir = self._run_tmp()
        # the checkpoint directory: a private local directory at the same path in every
        # attempt (a path a cell kept still works), emptied and filled from the store's
        # newest sealed manifest, and synced back (files_sync). A local store is no
        # exception: a folder of plain files in the store could be changed by its writer
        # between two attempts, unseen (issue 31)
        checkpoint = self._stable_checkpoint_dir()
        make_private_dirs(checkpoint)
        await asyncio.to_thread(self._prepare_files, checkpoint, run_tmp)
        files = CheckpointDir(self.store, checkpoint, journal.attempt)
        self._files = FilesSync(files, journal, limits.checkpoint_interval)
        # fetched while the kernel starts; the first cell waits for it
        files_restored = asyncio.ensure_future(self._files.restore(self._files_manifest))
        self._kernel_env = kernel_env(
            {
                "SPOTBOOK_RUN_DIR": self.store.url,
                "SPOTBOOK_RUN_ID": self.spec.run_id,
                "SPOTBOOK_NOTICE_FILE": notice.path,
                "SPOTBOOK_CHECKPOINT_DIR": checkpoint,
                **({"TMPDIR": run_tmp} if run_tmp else {}),
                **({"PYTHONHASHSEED": self.spec.hash_seed} if self.spec.hash_seed else {}),
            }
        )
        plan: ResumePlan | None = None
        try:
            started = time.monotonic()
            await self.start_kernel(start)
            kernel = self.kernel
            journal.attempt_rec["kernel_start_seconds"] = round(time.monotonic() - started, 3)
            if self._files is not None:
                journal.attempt_rec["checkpoint_restored_bytes"] = await files_restored
                journal.attempt_rec["checkpoint_ready_seconds"] = round(
                    time.monotonic() - started, 3
                )
                self._files.start()
            self.nb.metadata["language_info"] = kernel.language_info
            _complete_kernelspec(self.nb, self.spec.kernel_name, kernel.language_info)
            for index, rec in journal.records.items():
                kernel.seed_cell(
                    index, nbs.outputs_copy(rec["outputs"]), rec.get("display_ids") or {}
                )
            if journal.records:
                async with self.kernel_may_die(start, "while restoring the state before cell"):
                    plan, start = await Restorer(self, self.snapshots, self._undone).restore(start)
            if plan is None and journal.attempt > 1:
                # a later attempt with nothing to restore: it is back on new cells now
                journal.note(resumed_at=time.time())
            journal.refresh(self.session, force=True, running=start)
            await CellLoop(self, self.snapshots).run_cells(start)
        except Terminated:
            if self.store.superseded(journal.attempt):
                # a newer attempt owns the run: leave it run.json, output.ipynb and OUTPUT
                journal.end(Outcome.SUPERSEDED)
                raise SupersededError(
                    f"attempt {journal.attempt} of run {self.spec.run_id} was stopped by "
                    f"{notice.signame} after a newer attempt had taken over; it wrote "
                    "nothing more"
                ) from None
            await self._final_files_sync()
            # Ctrl-C (SIGINT) is the user's stop; SIGTERM is the node's notice (kubelet,
            # a spot reclaim, a drain) and counts as a preemption
            by_user = notice.signame == "SIGINT"
            journal.end(
                Outcome.STOPPED if by_user else Outcome.PREEMPTED,
                stopped_at=journal.next_unfinished(),
                notice={
                    "signal": notice.signame,
                    "cell": notice.cell.value,
                    "seconds_to_stop": round(time.monotonic() - notice.at, 3),
                },
            )
            journal.refresh(self.session, force=True, to_output=True)
            journal.set_status(
                RunStatus.INTERRUPTED,
                "stopped by you (Ctrl-C)" if by_user else f"stopped on {notice.signame}",
            )
            raise
        except SupersededError:
            journal.end(Outcome.SUPERSEDED)
            raise
        except ResumeRefusedError as exc:
            journal.end(Outcome.RESUME_REFUSED, error=str(exc))
            journal.set_status(RunStatus.RESUME_REFUSED, str(exc))
            raise
        except (CellExecutionError, KernelDiedError, CellTimeoutError, RunTimeoutError) as exc:
            timed_out = isinstance(exc, CellTimeoutError | RunTimeoutError)
            await self._finish(
                Outcome.TIMED_OUT if timed_out else Outcome.FAILED,
                RunStatus.FAILED,
                probe=isinstance(exc, CellExecutionError),
                error=str(exc),
            )
            raise
        except BaseException as exc:
            # the store failed, or something no branch above expected: the attempt is
            # recorded as ended by it, the run as interrupted (a resume may pass)
            if self._files is not None:
                self._files.cancel()
            outcome = Outcome.STORAGE_ERROR if isinstance(exc, StorageError) else Outcome.ERROR
            with contextlib.suppress(Exception):
                journal.end(outcome, error=str(exc) or type(exc).__name__)
                journal.set_status(RunStatus.INTERRUPTED, str(exc))
            raise
        await self._finish(Outcome.COMPLETED, RunStatus.SUCCEEDED, probe=True)
        return self._result(plan.replay if plan else ())

    async def _finish(
        self, outcome: Outcome, status: RunStatus, *, probe: bool, error: str | None = None
    ) -> None:
        """End an attempt that was not stopped: what the kernel saw, the last file sync,
        the attempt's outcome, the final notebook and the run's status."""
        if probe and self.session is not None:
            with contextlib.suppress(Exception):
                found = await self.ops.accelerators(timeout=5.0)
                if found:
                    self.journal.attempt_rec["frameworks"] = found
        await self._final_files_sync()
        if error is None:
            self.journal.end(outcome)
        else:
            self.journal.end(outcome, error=error)
        self.journal.refresh(self.session, force=True, final=True)
        self.journal.set_status(status, error or "")
        if status is RunStatus.SUCCEEDED and self._run_tmp_dir:
            # nothing resumes a finished run: its temporary files go, as a kernel's would
            shutil.rmtree(self._run_tmp_dir, ignore_errors=True)

    async def _final_files_sync(self) -> None:
        if self._files is not None:
            await self._files.final()

    def _result(self, replayed: tuple[int, ...] = ()) -> RunResult:
        return RunResult(
            run_id=self.spec.run_id,
            url=self.store.url,
            status=RunStatus.SUCCEEDED,
            cells_done=len(self.journal.records),
            cells_total=sum(1 for c in self.nb.cells if nbs.executable(c)),
            attempt=self.journal.attempt,
            replayed=replayed,
            output=self.spec.output,
        )

    async def race(
        self, coro: Awaitable[T], *, grace: float, index: int, cell_timeout: float | None = None
    ) -> T:
        """Await ``coro`` against the time limits and the termination notice."""
        notice = self.notice
        assert notice is not None
        task = asyncio.ensure_future(coro)
        now = time.monotonic()
        cell_deadline = None if cell_timeout is None else now + cell_timeout
        deadlines = [d for d in (self._deadline, cell_deadline) if d is not None]
        deadline = min(deadlines) if deadlines else None
        try:
            timeout = None if deadline is None else max(0.0, deadline - now)
            racers: set[asyncio.Future[Any]] = {task, notice.future}
            done, _ = await asyncio.wait(
                racers, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if task in done:
                return task.result()
            if notice.future in done:
                left = max(0.0, grace - (time.monotonic() - notice.at))
                await asyncio.wait({task}, timeout=left)
                if task.done():
                    seen = notice.seen_by_cell()
                    notice.cell = NoticeCell.STOPPED if seen else NoticeCell.FINISHED
                    return task.result()
                notice.cell = NoticeCell.INTERRUPTED
                raise Terminated(notice.signame, self.resume_hint())
            if deadline == cell_deadline and cell_timeout is not None:
                raise CellTimeoutError(cell_index=index, timeout=cell_timeout)
            assert self.spec.limits.run_timeout is not None
            raise RunTimeoutError(cell_index=index, timeout=self.spec.limits.run_timeout)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def save_checkpoint_dir(self, index: int) -> None:
        if self._files is not None:
            await self.race(self._files.now(), grace=self.grace, index=index)

    def resume_hint(self) -> str:
        return f"continue with `spotbook resume {self.store.url}`"

    @contextlib.asynccontextmanager
    async def kernel_may_die(self, index: int, during: str) -> AsyncIterator[None]:
        """The kernel dying outside a cell: a preemption after the notice (exit 75),
        else KernelDiedError saying when (exit 138), never an internal error."""
        try:
            yield
        except KernelDied:
            assert self.notice is not None
            if self.notice.given:
                log.info("the kernel died after the notice, %s %d", during, index)
                raise Terminated(self.notice.signame, self.resume_hint()) from None
            raise KernelDiedError(
                cell_index=max(index, 0), execution_count=None, during=f"{during} {index}"
            ) from None

    # -- the kernel -------------------------------------------------------------------
    def _on_output(self, kind: str, content: dict[str, Any]) -> None:
        """Each output the kernel sends: to --log-output and the stream files, and OUTPUT
        refreshed soon to show the running cell's output so far."""
        if self.opts.on_output is not None:
            self.opts.on_output(kind, content)
        if self.session is not None:
            self.journal.output_arrived(self.session)

    async def start_kernel(self, index: int) -> None:
        """Start a kernel and spotbook's watchers in it, before any cell runs."""
        self.session = (self.opts.kernel_factory or KernelSession)(
            self.nb,
            kernel_name=self.spec.kernel_name,
            cwd=self.spec.cwd,
            start_timeout=self.spec.limits.start_timeout,
            env=self._kernel_env,
            on_output=self._on_output,
            allow_errors=self.spec.allow_errors,
            nbclient=self.spec.nbclient,
        )
        await self.race(self.session.start(), grace=0.0, index=index)
        self.session.on_loop = self.in_cell.heard
        try:
            started = await self.race(self.ops.init(), grace=0.0, index=index)
        except RuntimeError as exc:
            self.snapshots.off(f"the kernel cannot import spotbook ({exc})")
            return
        # the kernel's streams tell a snapshot's prints from the cell's (ipykernel 7)
        self.snapshots.can_ask_with_cell = bool(started.get("snapshot_with_cell"))
        if not started.get("reply_metadata"):
            # a kernel whose replies cannot carry the cell's note: ask for it with each cell
            self.session.cell_expressions = {"spotbook": CELL_EFFECTS}


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
