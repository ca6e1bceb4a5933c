"""Where state is restored: the newest usable snapshot loaded into the new kernel, the
cells the resume plan says replayed around it, and the fidelity report of the result.
When the state cannot be rebuilt, the attempt falls back to a fresh run from cell 0
and says what that cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .._errors import ResumeRefusedError, SnapshotIntegrityError
from ..notebook import document as nbs
from .env_cells import env_cells
from .executor import KernelDied, python_transform
from .fidelity import FidelityReport
from .kernel_ops import KernelError
from .replay import NO_REPLAY_TAG, ResumePlan, plan_resume
from .snapshots import CannotRebuild, Snapshots

if TYPE_CHECKING:
    from .context import Attempt

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _blob_errors(doc: dict[str, Any]) -> Iterator[None]:
    """A snapshot's blob the kernel read that fails its hash is a changed store (exit 2,
    as the loader says it); one that is missing leaves the state unrebuildable (the
    fallback). Anything else the kernel raised is spotbook's own bug."""
    try:
        yield
    except KernelError as exc:
        if exc.ename == "IntegrityError":
            raise SnapshotIntegrityError(
                f"snapshot {doc['name']} was refused by the kernel: {exc.evalue}; the store "
                "was modified by someone without this run's key"
            ) from None
        if exc.ename in ("FileNotFoundError", "IsADirectoryError", "NotADirectoryError"):
            raise CannotRebuild(
                f"a blob of snapshot {doc['name']} cannot be read ({exc.evalue})"
            ) from None
        raise


class _ReplayFailed(CannotRebuild):
    """Internal: a replayed cell raised, or the kernel died replaying it."""


class Restorer:
    """Rebuilds the kernel's state for an attempt that resumes a run."""

    def __init__(self, runner: Attempt, snapshots: Snapshots, undone: list[str]) -> None:
        self.run = runner
        self.snapshots = snapshots
        self.undone = undone  # files given back to the cell that runs again

    async def restore(self, start: int) -> tuple[ResumePlan | None, int]:
        """Restore the newest usable snapshot and replay what the plan says.

        Returns the plan and the cell to go on from: ``start``, or 0 when the state
        could not be rebuilt and the attempt falls back to a fresh run.
        """
        run, journal, snaps = self.run, self.run.journal, self.snapshots
        kernel = run.ops
        records = journal.records
        m0 = time.monotonic()
        doc = snaps.usable
        report = FidelityReport(
            snapshot=doc["name"] if doc else None,
            snapshot_after=int(doc["after"]) if doc and isinstance(doc.get("after"), int) else None,
            undone=self.undone,
            inside=run.in_cell.words(),
        )
        rebuild_files: set[int] = set()
        if run.in_cell.resumed is None:
            report.may_differ.extend(self._cell_rerun(start))
        if doc is not None:
            never = frozenset(
                i for i, tags in enumerate(nbs.cell_tags(run.nb)) if NO_REPLAY_TAG in tags
            )
            rebuild_files = report.files_checked(
                doc,
                journal.attempt_rec.get("files_restored"),
                records,
                self.snapshots.files,
                never,
            )
        failed: dict[str, str] = {}
        kinds: dict[str, str] = {}
        try:
            if doc is not None:
                await run.race(asyncio.to_thread(snaps.download, doc), grace=0.0, index=start)
                env_failed = await kernel.restore_env(doc["env"])
                with _blob_errors(doc):  # the imports' blob, read in the kernel
                    await self._environment(doc, report)
                    await run.race(
                        kernel.reimport(snaps.blob_dir(), doc["imports"]), grace=0.0, index=start
                    )
                loaded = await snaps.load(doc, start)
                failed = loaded["failed"]
                lost = run.in_cell.restored(failed)
                if lost:
                    raise CannotRebuild(lost)
                kinds = {n: str(v.get("type", "")) for n, v in doc["vars"].items()}
                report.restored(doc, failed, {**env_failed, **loaded["process_failed"]})
                journal.attempt_rec["restored_bytes"] = loaded["bytes"]
                journal.attempt_rec["load_seconds"] = round(loaded["seconds"], 4)
                snaps.seed(doc)
            plan = plan_resume(
                start=start,
                executable=[nbs.executable(c) for c in run.nb.cells],
                sources=nbs.cell_sources(run.nb),
                tags=nbs.cell_tags(run.nb),
                snapshot_after=doc["after"] if doc else None,
                unrestored={n: kinds.get(n, "") for n in failed},
                transform=python_transform,
                effects={i: r.get("effects") or {} for i, r in records.items()},
                undo={i: r["undo"] for i, r in records.items() if r.get("undo")},
                rng_known=frozenset(
                    i for i, r in records.items() if (r.get("pre") or {}).get("rng")
                ),
                stable=frozenset(
                    n
                    for n, v in (doc or {}).get("vars", {}).items()
                    if v.get("kind") == "module" or v.get("type") in ("function", "type")
                ),
            )
            report.planned(plan)
            if plan.unrebuildable:
                raise CannotRebuild(
                    "; ".join(f"{n!r}: {why}" for n, why in sorted(plan.unrebuildable.items()))
                )
            self.refuse_if_strict(report)
            # the chains, and the cells that wrote the files a new node lacks that were
            # not saved (their variables are loaded again after, as a chain's are)
            head = sorted(set(plan.head) | rebuild_files)
            for index in head:
                await self._set_pre(index, report)
                await self._replay(index)
            if head:
                report.replayed.update(
                    {
                        i: "rebuilds a file that was not saved"
                        for i in rebuild_files - set(plan.head)
                    }
                )
            if doc is not None:
                if head:
                    # what the chain changed in restored variables is undone; its own
                    # variables stay
                    await kernel.restore_env(doc["env"])
                    await snaps.load(doc, start, plan.keep)
                missing = [n for n in plan.chains if not await self._bound(n)]
                if missing:
                    raise CannotRebuild(
                        f"replaying its chain did not bind {', '.join(map(repr, missing))}"
                    )
                report.process_problems(await kernel.apply_last())
            if plan.give_back:
                # the files the tail cells wrote, as they were before the first of them
                report.undone.extend(undo_files(plan.tail[0], dict(plan.give_back)))
            for index in plan.tail:
                await self._replay(index)
        except CannotRebuild as exc:
            return None, await self._fall_back(str(exc), report)
        self.refuse_if_strict(report)
        last_count = max((r.get("execution_count") or 0 for r in records.values()), default=0)
        if last_count:
            with contextlib.suppress(RuntimeError):
                await kernel.set_execution_count(last_count + 1)
        replayed = sorted(set(plan.replay) | rebuild_files)
        redone = sum(float(records.get(i, {}).get("duration") or 0.0) for i in replayed)
        # what was replayed is at stake again until the next snapshot: a kill now would
        # make the next attempt replay it once more
        snaps.compute_since = redone
        journal.note(
            restored_snapshot=doc["name"] if doc else None,
            unrestored=sorted(failed),
            replayed=replayed,
            restore_seconds=round(time.monotonic() - m0, 3),
            redone_seconds=round(redone, 3),
            fidelity=report.to_json(),
            resumed_at=time.time(),  # from here on, cells that were never run
        )
        if run.in_cell.resumed is not None and doc is not None:
            r = run.in_cell.resumed
            journal.note(
                resumed_in_cell={
                    **{
                        k: r[k]
                        for k in ("cell", "loop", "iteration", "total", "at", "interval")
                        if k in r
                    },
                    "attempt": int(doc["attempt"]),
                    "cell_seconds": float(r.get("cell_seconds") or 0.0),
                }
            )
        log.info(
            "%s",
            _restored_words(doc, replayed, report, len(self.run.nb.cells), run.in_cell.words()),
        )
        for line in report.may_differ:
            log.warning("may differ from an uninterrupted run: %s", line)
        return plan, start

    def _cell_rerun(self, start: int) -> list[str]:
        """The loops of cell ``start`` that an earlier attempt found could not be resumed
        from inside, when that cell now runs again from its first line: named, so that
        ``--strict-resume`` refuses it and the report says why the cell's work was lost."""
        said = []
        for a in self.run.store.attempts():
            for key, why in sorted((a.get("loops_not_resumable") or {}).items()):
                cell, _, loop = str(key).partition(":")
                if cell == str(start) and loop.isdigit():
                    line = (
                        f"cell {start + 1} runs again from its first line: its loop "
                        f"{int(loop) + 1} is not a resume point ({why})"
                    )
                    if line not in said:
                        said.append(line)
        return said

    async def _environment(self, doc: dict[str, Any], report: FidelityReport) -> None:
        """Replay the cells that changed the environment where their effect is gone (a new
        node has the image's environment), before anything is unpickled; then name the
        modules the state needs that still cannot be imported."""
        run, snaps = self.run, self.snapshots
        cells = env_cells(nbs.cell_sources(run.nb), nbs.cell_tags(run.nb), int(doc["after"]))
        kernel = run.ops
        missing = await kernel.missing_modules(snaps.blob_dir(), doc["imports"])
        lost_files = bool((run.journal.attempt_rec.get("files_restored") or {}).get("files"))
        todo = []
        for cell in cells:
            if cell.checkable:
                if await kernel.not_installed(list(cell.packages)):
                    todo.append(cell.index)
            elif lost_files or missing:
                todo.append(cell.index)  # no name to check: replayed where the node is new
        for index in todo:
            await self._replay(index)
        if todo:
            run.journal.attempt_rec["environment_replayed"] = todo
            report.environment = list(todo)
            missing = await kernel.missing_modules(snaps.blob_dir(), doc["imports"])
        if missing:
            report.may_differ.append(
                f"module{'s' if len(missing) > 1 else ''} {', '.join(missing)}, which the "
                "state needs, cannot be imported on this node"
                + (
                    f" (even after replaying cell{'s' if len(todo) > 1 else ''} "
                    f"{', '.join(map(str, todo))})"
                    if todo
                    else " and no cell installs them: install them in the image"
                )
            )

    async def _set_pre(self, index: int, report: FidelityReport) -> None:
        """Before a chain cell: the cwd, environment and generators it first started from."""
        records = self.run.journal.records
        pre: dict[str, Any] = {}
        for i in sorted((i for i in records if i <= index), reverse=True):
            env = (records[i].get("pre") or {}).get("env")
            if env is not None:
                pre["env"] = env
                break
        rng = (records.get(index, {}).get("pre") or {}).get("rng")
        if rng:
            pre["rng"] = rng
        owned = (records.get(index, {}).get("pre") or {}).get("owned_rng")
        if owned:
            pre["owned_rng"] = owned  # the notebook's own generators, as the cell found them
        if pre:
            report.process_problems(await self.run.ops.set_pre(pre))

    async def _bound(self, name: str) -> bool:
        return await self.run.ops.is_bound(name)

    def refuse_if_strict(self, report: FidelityReport) -> None:
        run = self.run
        if (run.spec.strict_resume or run.opts.strict_resume) and not report.exact:
            raise ResumeRefusedError(
                f"run {run.spec.run_id} was not resumed (--strict-resume): the resumed run "
                f"could differ from an uninterrupted one: {'; '.join(report.may_differ)}. "
                f"Resume without --strict-resume to accept that, or start over with "
                f"`spotbook run ... --restart`"
            )

    async def _fall_back(self, why: str, report: FidelityReport) -> int:
        """The state cannot be rebuilt: run the notebook again from its first cell in a
        fresh kernel, as this attempt, and say what it cost."""
        run, journal = self.run, self.run.journal
        report.may_differ.append(f"the kernel state could not be rebuilt ({why})")
        self.refuse_if_strict(report)
        redone = sum(float(r.get("duration") or 0.0) for r in journal.records.values())
        log.warning(
            "the kernel state could not be rebuilt (%s): running the notebook again from its "
            "first cell in a fresh kernel (%.1f s of finished cells run again)",
            why,
            redone,
        )
        await run.kernel.shutdown()
        if self.snapshots.files is not None:
            # a fresh run starts from its inputs, not from the files it made last time
            removed = self.snapshots.files.remove_created()
            if removed:
                log.info("removed %d files the run had made, before it runs again", len(removed))
        journal.records = {}
        journal.note(
            resumed_from=0,  # this attempt's records replace every earlier one's
            fallback={"reason": why, "redone_seconds": round(redone, 3)},
            replayed=[],
            redone_seconds=round(redone, 3),
            fidelity={**report.to_json(), "fallback": why},
            resumed_at=time.time(),
        )
        await run.start_kernel(0)
        run.nb.metadata["language_info"] = run.kernel.language_info
        return 0

    async def _replay(self, index: int) -> None:
        try:
            count = self.run.journal.records.get(index, {}).get("execution_count")
            replay = self.run.kernel.replay_cell(index, count)
            result = await self.run.race(replay, grace=0.0, index=index)
        except KernelDied:
            raise _ReplayFailed(f"the kernel died while replaying cell {index}") from None
        if result.error and not result.allowed_error:
            raise _ReplayFailed(
                f"replaying cell {index} raised {result.error['ename']}: {result.error['evalue']}"
            )


def _restored_words(
    doc: dict[str, Any] | None,
    replayed: list[int],
    report: FidelityReport,
    total: int,
    inside: str = "",
) -> str:
    """What the resume did, in a person's words and papermill's numbering of cells (from 1,
    every cell counted): "restored the state after cell 6 of 10; replayed cell 2 (why)";
    ``inside``: the checkpoint inside a cell it went on from ("cell 7, iteration 15 of 20
    of its loop 1")."""
    if doc and inside:
        head = f"restored the kernel's state inside {inside} (of {total} cells)"
    elif doc:
        head = f"restored the kernel's state after cell {int(doc['after']) + 1} of {total}"
    else:
        head = "no snapshot to restore: the cells before are replayed"
    if not replayed:
        return f"{head}; no cell replayed"
    why = dict(report.replayed)
    cells = ", ".join(f"{i + 1}" + (f" ({why[i]})" if why.get(i) else "") for i in sorted(replayed))
    return f"{head}; replayed cell{'s' if len(replayed) > 1 else ''} {cells}"


def _cut(path: str, size: int) -> bool:
    """Cut the plain file at ``path`` back to ``size`` bytes; never through a symbolic link
    (one planted there since would have the truncation land on the file it points at)."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size <= size:
            return False
        os.ftruncate(fd, size)
        return True
    finally:
        os.close(fd)


def undo_files(index: int, undo: dict[str, int | None]) -> list[str]:
    """Give cell ``index``, which finished but was killed before its record was
    committed, the files it wrote as they were before it first ran: it runs again."""
    done = []
    for path, size in sorted(undo.items()):
        try:
            if size is None:
                if os.path.isfile(path) or os.path.islink(path):  # a link goes, not its target
                    os.unlink(path)
                    done.append(f"removed {path}, which cell {index} created")
            elif _cut(path, size):
                done.append(f"cut {path} back to the {size} bytes it had before cell {index}")
        except OSError as exc:
            done.append(f"could not restore {path} for cell {index} ({exc.strerror})")
    for line in done:
        log.info("cell %d runs again: %s", index, line)
    return done
