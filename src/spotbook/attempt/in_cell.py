"""Checkpoints inside a cell, the runner's side: what each cell's execute request asks of
its loops, committing the checkpoint a loop took, and going on from one on resume.

The kernel's side (:mod:`spotbook.kernel.loops`) takes the snapshot at a loop's iteration
boundary and waits; here its blobs and the run's files are put in the store and the
manifest committed, with the loop's position and the cell's outputs up to that boundary
(``state/loop/``), before the kernel is let go. A kill loses at most the iterations
since. The interval is the snapshots' own: ``--snapshot-interval`` when set, else the
Young/Daly interval for the run's hazard and the checkpoints' measured cost.

A resume whose first unfinished cell has a checkpoint restores it as the state before
that cell (so no cell before it is replayed), and runs the cell from the loop's next
iteration, its outputs going on from those saved.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from .._errors import StorageError
from .._models import BACKGROUND_PAUSE_ESTIMATE
from .._models import alive as _alive
from ..kernel.loops import POSITION, REQUEST_KEY
from ..notebook import document as nbs
from ..store.runstore import CellKey
from .kernel_ops import KernelOps

if TYPE_CHECKING:
    from .context import Attempt
    from .snapshots import Snapshots

log = logging.getLogger(__name__)
# ``SPOTBOOK_LOOP_CHECKPOINTS=0``: no checkpoints inside cells (each cell resumes from its
# first line, as before issue 57): for a notebook whose loops must not be rewritten, and
# for bench/bench_in_cell.py's comparison
OFF_ENV = "SPOTBOOK_LOOP_CHECKPOINTS"


class InCell:
    """One attempt's checkpoints inside cells."""

    def __init__(self, run: Attempt, snapshots: Snapshots) -> None:
        self.run = run
        self.snapshots = snapshots
        self.resumed: dict[str, Any] | None = None  # the checkpoint this attempt went on from
        self.cost: float | None = None  # what the last one stopped the cell for
        self.pauses: list[float] = []
        self._resume_cell: int | None = None  # the cell still to be resumed inside
        self._outputs_cell: int | None = None  # ... whose outputs are still to be given
        # why there are none in this attempt ("" while there may be)
        self.off = f"{OFF_ENV}=0" if os.environ.get(OFF_ENV) == "0" else ""
        self._finished: dict[int, list[dict[str, Any]]] = {}  # the loops each cell ran
        # a checkpoint a copy of the kernel writes, committed once it has
        self._pending: asyncio.Future[None] | None = None

    # -- going on from one ------------------------------------------------------------
    def find(self, start: int) -> dict[str, Any] | None:
        """The checkpoint inside cell ``start`` to go on from, if there is one (then the
        snapshot to restore, as the state before that cell)."""
        snaps = self.snapshots
        if self.off or not snaps.enabled or not self._python():
            return None
        doc = self.run.store.loop_checkpoint(start)
        if doc is None:
            return None
        from .snapshots import SNAPSHOT_FORMAT

        if doc.get("format") != SNAPSHOT_FORMAT or not self._has_point(start, doc["in_cell"]):
            return None
        self.resumed = dict(doc["in_cell"])
        self._resume_cell = self._outputs_cell = start
        return doc

    def _has_point(self, index: int, inside: dict[str, Any]) -> bool:
        """Whether cell ``index``, as the kernel will see it, has the loop (or the calling
        statement) the checkpoint names: else the cell goes on from its first line, from
        the snapshot before it (never a loop that is not there)."""
        import ast

        from .executor import python_transform

        try:
            body = ast.parse(python_transform(str(self.run.nb.cells[index].source))).body
        except (SyntaxError, ValueError, IndexError):
            return False
        if inside.get("function"):
            stmt = inside.get("stmt")
            simple = (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign)
            return (
                isinstance(stmt, int) and 0 <= stmt < len(body) and isinstance(body[stmt], simple)
            )
        loops = [s for s in body if isinstance(s, ast.For)]
        loop = inside.get("loop")
        return isinstance(loop, int) and 0 <= loop < len(loops)

    def restored(self, failed: dict[str, Any]) -> str:
        """'' when the loop's position came back with the state; else why not."""
        if self.resumed is None or POSITION not in failed:
            return ""
        return f"the position of the loop in cell {self.resumed['cell'] + 1} could not be loaded"

    def outputs(self, index: int) -> list[Any] | None:
        """What cell ``index`` had shown up to the checkpoint it goes on from."""
        if self.resumed is None or self._outputs_cell != index:
            return None
        self._outputs_cell = None
        return list(self.resumed.get("outputs") or [])

    def words(self) -> str:
        """Where this attempt went on from, in papermill's numbering of cells."""
        r = self.resumed
        if r is None:
            return ""
        of = f" of {r['total']}" if r.get("total") is not None else ""
        loop = f"loop {int(r['loop']) + 1}"
        if r.get("function"):
            loop += f" of function {str(r['function']).split(':', 1)[-1]}()"
        return f"cell {int(r['cell']) + 1}, iteration {int(r['iteration']) + 1}{of} of its {loop}"

    def loops_of(self, index: int) -> list[dict[str, Any]]:
        """The resumable loops cell ``index`` ran to their end: iterations and seconds
        (for its record: ``spotbook simulate`` cuts the cell at its iterations)."""
        return self._finished.pop(index, [])

    # -- asking for them --------------------------------------------------------------
    def _python(self) -> bool:
        return nbs.kernel_language(self.run.nb).lower() == "python"

    def interval(self) -> float:
        """Seconds of a loop between two checkpoints."""
        policy = self.run.spec.snapshot
        if policy.interval is not None:
            return policy.interval
        cost = self.cost if self.cost is not None else self.snapshots.cost
        return policy.gap(cost if cost is not None else BACKGROUND_PAUSE_ESTIMATE)

    def request(self, index: int) -> dict[str, Any] | None:
        """The execute request's metadata for cell ``index``: what its loops do."""
        if self.off or not self.snapshots.enabled or not self._python():
            return None
        asked: dict[str, Any] = {
            "cell": index,
            "blob_dir": self.snapshots.blob_dir(),
            "dir": self.run.tmp,
            "interval": self.interval(),
        }
        r = self.resumed
        if r is not None and self._resume_cell == index:
            asked["resume"] = {
                "loop": int(r["loop"]),
                "iteration": int(r["iteration"]),
                **{k: r[k] for k in ("function", "stmt") if k in r},
            }
            self._resume_cell = None
        return {REQUEST_KEY: asked}

    # -- taking one -------------------------------------------------------------------
    async def heard(self, index: int, said: dict[str, Any], outputs: list[Any]) -> None:
        """What a loop of cell ``index`` told the runner (``outputs``: the cell's so far)."""
        if "unresumable" in said:
            self._unresumable(index, said)
            return
        if "finished" in said:  # a loop ended: how its iterations went, for the record
            self._finished.setdefault(index, []).append(
                {
                    "loop": int(said["loop"]),
                    "iterations": int(said["finished"]) - int(said.get("from") or 0),
                    "seconds": round(float(said.get("seconds") or 0.0), 6),
                }
            )
            return
        if "error" in said:
            why = said["error"]
            self._stop(f"a checkpoint inside cell {index + 1} failed in the kernel ({why})")
            return
        gate = str(said.get("gate") or "")
        try:
            # one at a time: the one before is committed (or given up) first
            await self.settle()
            # the snapshot after the cell before, if still being written: committed first,
            # so the cell's record is there for a resume to reach this cell
            await self.snapshots.settle(wait=True)
            m0 = time.monotonic()
            if self.snapshots.files is not None and said.get("written"):
                # what the loop wrote outside the scanned folders: captured with the rest
                self.snapshots.files.note(said["written"])
            files = await self._stage_files()  # the run's files as they are at the boundary
        except (OSError, StorageError) as exc:
            self._stop(f"the checkpoint inside cell {index + 1} could not be saved ({exc})")
            if gate:
                KernelOps.release_writer(gate, go=True)
            return
        if "pid" in said:  # written by a copy of the kernel: the loop goes on meanwhile
            if gate:
                KernelOps.release_writer(gate, go=True)
            pause = float(said.get("kernel_seconds") or 0.0) + time.monotonic() - m0
            self._pending = asyncio.ensure_future(self._commit(index, said, outputs, files, pause))
            return
        try:
            pause = float(said.get("kernel_seconds") or 0.0)
            await self._commit(index, said, outputs, files, pause, m0)
        finally:
            if gate:
                KernelOps.release_writer(gate, go=True)

    async def settle(self, deadline: float | None = None) -> None:
        """Wait for the checkpoint a copy of the kernel is writing, and commit it; until
        ``deadline`` (monotonic) at most, when it is given up (the copy dies with its
        kernel: a resume goes on from the one before)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, _ = await asyncio.wait({pending}, timeout=timeout)
        if not done:
            pending.cancel()
            log.warning("the checkpoint inside the cell did not finish in time; not committed")

    async def _stage_files(self) -> Any:
        """The run's files at this boundary: the small changed ones saved now; the rest
        saved by what is returned (None where the run's files are not captured)."""
        snaps = self.snapshots
        if snaps.files is None:
            return None
        return await asyncio.to_thread(snaps.files.stage, snaps.blob_dir())

    async def _commit(
        self,
        index: int,
        said: dict[str, Any],
        outputs: list[Any],
        files: Any,
        pause: float,
        m0: float | None = None,
    ) -> None:
        """Commit the checkpoint the kernel took (once its copy has written it, where one
        did); one that cannot be saved turns them off for the attempt, the cell goes on.
        ``files``: the run's files staged at the boundary; ``m0``: when the runner began
        while the loop waited (all of it is then the pause)."""
        try:
            run, snaps, journal = self.run, self.snapshots, self.run.journal
            manifest = await _manifest(said)
            position = (manifest.get("vars") or {}).get(POSITION) or {}
            if position.get("kind") == "unserialisable":  # the loop's position cannot come back
                why = f"its position cannot be saved ({position.get('error')})"
                self._unresumable(index, {**said, "unresumable": why})
                return
            if files is not None:
                doc_files, written = await asyncio.to_thread(files)
                journal.blob_bytes += written
                manifest["files"] = doc_files
            await asyncio.to_thread(snaps.upload_needed, manifest)
            if m0 is not None:  # written while the loop waited: all of it was the pause
                pause += time.monotonic() - m0
            doc = snaps.manifest_doc(index - 1, manifest, cost=pause, written=pause)
            doc["in_cell"] = {
                "cell": index,
                "loop": int(said["loop"]),
                "iteration": int(said["iteration"]),
                "total": said.get("total"),
                "at": time.time(),
                "cell_seconds": round(float(said.get("cell_seconds") or 0.0), 6),
                # the most a kill after it loses: the interval to the next one, and an iteration
                "interval": round(self.interval(), 3),
                "outputs": outputs,
                **({"notice": True} if said.get("notice") else {}),
                # a loop of the notebook's function: which, and the cell's statement calling it
                **(
                    {"function": str(said["function"]), "stmt": int(said["stmt"])}
                    if said.get("function")
                    else {}
                ),
            }
            journal.fence()
            run.store.write_loop_checkpoint(CellKey(index, journal.attempt), doc)
            journal.blob_bytes += int(doc["bytes_written"])
            self.cost = pause
            self.pauses.append(pause)
            rec = journal.attempt_rec
            rec["loop_checkpoints"] = len(self.pauses)
            rec["loop_checkpoint_pause_max"] = round(max(self.pauses), 6)
            log.debug(
                "checkpoint inside cell %d, loop %s, after iteration %s: %.3f s",
                index,
                said["loop"],
                said["iteration"],
                pause,
            )
        except (OSError, StorageError, ValueError, KeyError) as exc:
            self._stop(f"the checkpoint inside cell {index + 1} could not be saved ({exc})")

    def _unresumable(self, index: int, said: dict[str, Any]) -> None:
        journal = self.run.journal
        named = dict(journal.attempt_rec.get("loops_not_resumable") or {})
        key = f"{index}:{said['loop']}"
        if key not in named:
            named[key] = str(said["unresumable"])
            if said.get("function"):
                fn = str(said["function"]).split(":", 1)[-1]
                named[key] = f"in function {fn}(): {named[key]}"
            # written now: the next attempt names it, should a kill come in this loop
            journal.note(loops_not_resumable=named)
            log.info(
                "loop %s of cell %d is not a resume point: %s; a kill inside it runs the cell "
                "again from its first line",
                int(said["loop"]) + 1,
                index + 1,
                said["unresumable"],
            )

    def _stop(self, why: str) -> None:
        self.off = why
        self.run.journal.attempt_rec["loop_checkpoints_off"] = why
        log.warning("checkpoints inside cells are off for this attempt: %s", why)


async def _manifest(said: dict[str, Any]) -> dict[str, Any]:
    """The manifest of the checkpoint the kernel said it took (once the kernel's copy has
    written it, where one does); ValueError where it has none."""
    path = str(said["manifest"])
    if "pid" in said:
        from .snapshots import _exited

        while not os.path.exists(path) and _alive(int(said["pid"])):
            await _exited(int(said["pid"]))
        if not os.path.exists(path):
            raise ValueError("the kernel's copy ended without writing the checkpoint")
    with open(path) as fh:
        manifest: dict[str, Any] = json.load(fh)
    with contextlib.suppress(OSError):
        os.unlink(path)
    if "error" in manifest:
        raise ValueError(manifest["error"])
    return manifest
