"""The cell loop of an attempt: each remaining cell raced against its time limit and
the notice, recorded, maybe followed by a snapshot, then committed.

The order is the guarantee: a snapshot that covers a cell is committed before the
cell's record, so a committed cell never runs again on resume. Every record goes through
the attempt's :class:`~spotbook.attempt.commit_order.CommitOrder`, which holds it while a
snapshot written in the background covers it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .._errors import (
    CellExecutionError,
    CellTimeoutError,
    KernelDiedError,
    RunTimeoutError,
    Terminated,
)
from .._models import SAVE_BUDGET, CellStatus, NoticeCell
from ..notebook import document as nbs
from .executor import KernelDied

if TYPE_CHECKING:
    from .context import Attempt
    from .snapshots import Snapshots

log = logging.getLogger(__name__)

# what on_output hears besides the kernel's outputs: a cell begins, a cell has replied
# (content {"index": i}, the index in the notebook's cells as papermill counts them)
CELL_START = "spotbook.cell_start"
CELL_END = "spotbook.cell_end"
_EXIT_OK = {"", "0", "None"}  # SystemExit values that end a run successfully


class CellLoop:
    """Runs the cells of one attempt, from ``start`` to the end."""

    def __init__(self, runner: Attempt, snapshots: Snapshots) -> None:
        self.run = runner
        self.snapshots = snapshots

    async def run_cells(self, start: int) -> None:
        try:
            await self._run_cells(start)
        finally:
            # a background snapshot still being written: wait for it (after a notice,
            # only as long as the save budget allows), then commit what it holds; and the
            # same for a checkpoint inside the last cell
            await self.run.in_cell.settle(deadline=self._save_deadline())
            await self.snapshots.settle(wait=True, deadline=self._save_deadline())

    def _save_deadline(self) -> float | None:
        notice = self.run.notice
        if notice is None or not notice.given:
            return None
        return notice.at + SAVE_BUDGET

    async def _run_cells(self, start: int) -> None:
        run = self.run
        notice, journal, snaps = run.notice, run.journal, self.snapshots
        order = snaps.order
        assert notice is not None
        limits = run.spec.limits
        runnable = [i for i, c in enumerate(run.nb.cells) if nbs.executable(c)]
        last = runnable[-1]
        bar = run.opts.progress
        if bar is not None:
            # papermill counts every cell, markdown too
            bar.begin(len(run.nb.cells), start)
        for index in range(start, len(run.nb.cells)):
            cell = run.nb.cells[index]
            if not nbs.executable(cell):
                continue
            if notice.given:
                async with run.kernel_may_die(index - 1, "while taking the snapshot after cell"):
                    await snaps.settle(wait=True, deadline=self._save_deadline())
                    await snaps.last(index - 1)
                raise Terminated(notice.signame, run.resume_hint())
            if bar is not None:
                bar.cell(index, str(cell.source))
            if run.opts.on_output is not None:  # papermill's --log-output separators
                run.opts.on_output(CELL_START, {"index": index})
            # in a kernel that will never fork, the snapshot after this cell, when it is
            # sure to be due, is asked for with the cell itself (taken if it succeeds)
            with_cell = snaps.ask_with_cell(index, last=index == last)
            t0 = time.time()
            m0 = time.monotonic()
            try:
                result = await run.race(
                    run.kernel.run_cell(
                        cell,
                        index,
                        expressions=with_cell,
                        request=run.in_cell.request(index),
                        outputs=run.in_cell.outputs(index),
                    ),
                    grace=run.grace,
                    index=index,
                    cell_timeout=limits.execution_timeout,
                )
            except KernelDied:
                await run.in_cell.settle(deadline=self._save_deadline())
                await snaps.settle(wait=True, deadline=self._save_deadline())
                if notice.given:
                    # The node is going away: the runtime may kill the whole process
                    # group when the grace runs out. A preemption, not the cell's fault:
                    # nothing is recorded for the cell, which runs again on resume.
                    log.info("the kernel died after the notice, during cell %d", index)
                    notice.cell = NoticeCell.INTERRUPTED
                    raise Terminated(notice.signame, run.resume_hint()) from None
                if snaps.died_in_snapshot(index):  # the cell's code had ended: not its fault
                    during = f"while taking the snapshot after cell {index}"
                    raise KernelDiedError(
                        cell_index=index, execution_count=None, during=during
                    ) from None
                journal.commit_failure(index, t0, "KernelDied", "the kernel process died")
                raise KernelDiedError(cell_index=index, execution_count=None) from None
            except CellTimeoutError:
                await snaps.settle(wait=True, deadline=self._save_deadline())
                journal.commit_failure(
                    index, t0, "CellTimeoutError", f"exceeded {limits.execution_timeout:g} s"
                )
                raise
            except RunTimeoutError:
                await snaps.settle(wait=True, deadline=self._save_deadline())
                journal.commit_failure(index, t0, "RunTimeoutError", "the run's --timeout")
                raise
            await run.in_cell.settle(deadline=self._save_deadline())
            if notice.given and notice.seen_by_cell():
                # The cell saw spotbook.preempted() and stopped early: it is not finished.
                # It runs again on resume, where it picks up from its checkpoint files.
                # (cells as papermill numbers them, from 1)
                log.info("cell %d stopped on the notice; it continues on resume", index + 1)
                raise Terminated(notice.signame, run.resume_hint())
            duration = time.monotonic() - m0
            taken = snaps.taken_with_cell(index, result)
            if taken is not None:  # the snapshot's part is the pause's, not the cell's
                duration = max(0.0, duration - taken.pause)
            if run.opts.on_output is not None:
                run.opts.on_output(CELL_END, {"index": index})
            status = CellStatus.COMPLETED
            if result.error and not result.allowed_error:
                exiting = result.error["ename"] == "SystemExit"
                ok = exiting and result.error["evalue"] in _EXIT_OK
                status = CellStatus.EXITED if ok else CellStatus.FAILED
            record = journal.record(index, result, t0, duration, status, run.kernel)
            loops = run.in_cell.loops_of(index)
            if loops:  # where the cell can be resumed from inside, and how often
                record["loops"] = loops
            snaps.note_files(record)
            if record.pop("checkpoint", False):
                # what the cell saved in checkpoint_dir() is in the store before its record
                await run.save_checkpoint_dir(index)
            undo = record.get("undo")
            await snaps.settle(wait=False)  # the one in the background, if it is done
            snap_due = (
                status is CellStatus.COMPLETED and index != last and await snaps.due(duration)
            )
            if undo and (snap_due or snaps.pending):
                journal.note_executed(index, undo)
            background = False
            if snap_due and snaps.background:
                async with run.kernel_may_die(index, "while starting the snapshot after cell"):
                    # one at a time; after a notice, only within the save budget
                    await snaps.settle(wait=True, deadline=self._save_deadline())
                    # the one before may have failed in the kernel: snapshots are off
                    snap_due = snaps.enabled
                    try:
                        background = snap_due and await snaps.start(index, taken)
                    except Terminated:
                        order.record(index, record)  # as a synchronous one cut short
                        raise
            if snap_due and not background:
                # Snapshot before the record: once a cell is committed, its effects are
                # in the store too (when the policy snapshots), so a kill after the
                # commit never makes a resume run it again. (Never after the last cell:
                # there is nothing left to resume.)
                try:
                    async with run.kernel_may_die(index, "while taking the snapshot after cell"):
                        await snaps.take(index)
                except Terminated:
                    order.record(index, record)
                    raise
            snaps.drop_held()  # taken with the cell, but not started: never written
            # now, or once the snapshot being written in the background is committed
            order.record(index, record)
            journal.recommit_updated_displays(index, run.kernel, order.held())
            if bar is not None:
                bar.advance(len(run.nb.cells) if index == last else index + 1)
            if status is CellStatus.FAILED:
                assert result.error is not None
                raise CellExecutionError(
                    cell_index=index,
                    execution_count=result.execution_count,
                    ename=result.error["ename"],
                    evalue=result.error["evalue"],
                    source=str(run.nb.cells[index].source),
                    traceback=result.error.get("traceback"),
                )
            if status is CellStatus.EXITED:
                log.info("cell %d called sys.exit(0): the run ends here, successfully", index)
                return
            journal.refresh(run.kernel, running=index + 1)
