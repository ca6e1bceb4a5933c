"""The attempt's journal: what it writes to the run store about itself and its cells.

One owner for the run's records: the attempt record (claimed exclusively, closed with
its outcome), run.json's status, each cell's committed record (fenced: a superseded
attempt stops instead of writing), output text over ``--max-output-bytes``, and the
output notebook refreshed on a throttle.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from typing import Any, Unpack

from .._errors import PreemptionBudgetError, StorageError, SupersededError
from .._models import (
    INTERRUPTED_OUTCOMES,
    AttemptRecord,
    CellStatus,
    Outcome,
    RunSpec,
    RunStatus,
    __version__,
)
from ..notebook import document as nbs
from ..store.runstore import CellKey, RunStore
from .environment import machine, nvidia_gpus, where
from .executor import CellResult, KernelSession

log = logging.getLogger(__name__)

# outcomes that count against --max-preemptions: preempted, and attempts still marked
# running (killed without notice: node gone, SIGKILL), which cost the same
_INTERRUPTED = {*INTERRUPTED_OUTCOMES, Outcome.RUNNING}


def start_index(nb: Any, records: dict[int, dict[str, Any]]) -> int:
    """First executable cell without a completed record (len(cells) when all done)."""
    for i, cell in enumerate(nb.cells):
        if nbs.executable(cell) and records.get(i, {}).get("status") != CellStatus.COMPLETED:
            return i
    return len(nb.cells)


def exited_early(records: dict[int, dict[str, Any]]) -> bool:
    """Whether a cell of these records ended the kernel on purpose (``exit()``)."""
    return any(r.get("status") == CellStatus.EXITED for r in records.values())


class Journal:
    """The attempt's records in the store, and the output notebook made from them."""

    def __init__(
        self,
        store: RunStore,
        run: dict[str, Any],
        spec: RunSpec,
        nb: Any,
        output_refresh: float,
    ) -> None:
        self.store = store
        self.spec = spec
        self.nb = nb
        self._run = run  # run.json as unsealed
        self.records: dict[int, dict[str, Any]] = {}
        self.attempt = 0
        self.attempt_rec: AttemptRecord = {}
        self.blob_bytes = 0  # written by the kernel, reported in the attempt record
        self._output_refresh = output_refresh
        self._last_refresh = 0.0
        self._refresh_cost = 0.0
        self._deferred: asyncio.TimerHandle | None = None
        self._output_failed = False
        self._writer = nbs.CompactWriter()
        # cell -> the whole text of outputs cut to --max-output-bytes (its hash is sealed
        # in the cell's record)
        self._spilled: dict[int, dict[str, str]] = {}

    # -- the attempt record ------------------------------------------------------------
    def check_budget(self) -> None:
        limit = self.spec.limits.max_preemptions
        if limit is None:
            return
        used = sum(1 for a in self.store.attempts() if a.get("outcome") in _INTERRUPTED)
        if used > limit:
            message = (
                f"run {self.spec.run_id} was interrupted {used} times, more than its budget "
                f"of {limit} (--max-preemptions); see `spotbook status {self.store.url}`, and "
                "resume with a larger --max-preemptions if the interruptions were not the "
                "notebook's fault"
            )
            self.set_status(RunStatus.FAILED, message)
            raise PreemptionBudgetError(message)

    def claim(self, start: int) -> None:
        self.attempt_rec = {
            **where(),
            "started": time.time(),
            "resumed_from": start,
            "outcome": Outcome.RUNNING.value,
        }
        gpus = nvidia_gpus()
        if gpus is not None:
            self.attempt_rec["gpus"] = gpus
        found = machine()
        if found:
            self.attempt_rec["machine"] = found
        self.attempt = self.store.claim_attempt(self.attempt_rec)
        self.attempt_rec["attempt"] = self.attempt
        removed = self.store.remove_partials()  # what a killed writer left half-made
        if removed:
            log.info("removed %d partial files a killed attempt left in the store", removed)
        self.set_status(RunStatus.RUNNING)
        log.info(  # cells as papermill numbers them, from 1
            "run %s attempt %d starting at cell %d of %d (%s)",
            self.spec.run_id,
            self.attempt,
            start + 1,
            len(self.nb.cells),
            self.store.url,
        )

    def note(self, **fields: Unpack[AttemptRecord]) -> None:
        """Add to the attempt record and write it (the attempt owns that file)."""
        self.attempt_rec.update(fields)
        self.store.update_attempt(self.attempt, self.attempt_rec)

    def end(self, outcome: Outcome, /, **extra: Unpack[AttemptRecord]) -> None:
        if self._deferred is not None:  # the attempt's own last write follows, or none
            self._deferred.cancel()
            self._deferred = None
        self.attempt_rec.update(extra)
        self.attempt_rec["outcome"] = outcome.value
        self.attempt_rec["ended"] = time.time()
        self.attempt_rec["store_bytes"] = self.store.bytes_written + self.blob_bytes
        # A superseded attempt still closes its own record (only it writes that file):
        # so it is not taken for a preemption, nor counted against the budget. It
        # writes nothing the newer attempt owns.
        if outcome is not Outcome.SUPERSEDED:
            self.store.update_attempt(self.attempt, self.attempt_rec)
            return
        with contextlib.suppress(Exception):  # best effort: the run is not ours any more
            self.store.update_attempt(self.attempt, self.attempt_rec)

    def set_status(self, status: RunStatus, message: str = "") -> None:
        doc = {
            "spec": self.spec.to_json(),
            "status": status.value,
            "message": message,
            "attempt": self.attempt,
            "updated": time.time(),
        }
        if "seal" in self._run:  # the spec is unchanged, so its seal still holds
            doc["seal"] = self._run["seal"]
        self.store.write_json("run.json", doc)

    def fence(self) -> None:
        if self.store.superseded(self.attempt):
            raise SupersededError(
                f"attempt {self.attempt} of run {self.spec.run_id} was superseded by a newer "
                "attempt (another runner took over this run); this one stopped without writing"
            )

    def elapsed_before(self) -> float:
        """Compute already spent on this run by earlier attempts (for --timeout)."""
        return sum(float(r.get("duration") or 0.0) for r in self.records.values())

    def next_unfinished(self) -> int:
        return start_index(self.nb, self.records)

    # -- cell records --------------------------------------------------------------
    def record(
        self,
        index: int,
        result: CellResult,
        t0: float,
        duration: float,
        status: CellStatus,
        session: KernelSession,
    ) -> dict[str, Any]:
        """The record of a cell that ran (not yet committed)."""
        rec: dict[str, Any] = {
            "index": index,
            "attempt": self.attempt,
            "status": status.value,
            "execution_count": result.execution_count,
            "outputs": self.cap(index, result.outputs),
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
        noted = cell_effects(result)
        for key in ("effects", "pre", "undo", "written", "checkpoint"):
            if noted.get(key):
                rec[key] = noted[key]
        display_ids = session.display_ids(index)
        if display_ids:
            rec["display_ids"] = display_ids
        return rec

    def cap(self, index: int, outputs: list[Any]) -> list[Any]:
        """Outputs as recorded; over --max-output-bytes the full text goes to the store."""
        rel = f"outputs/{CellKey(index, self.attempt).name[:-5]}.txt"
        capped, full = cap_outputs(outputs, self.spec.limits.max_output_bytes, rel)
        if full is not None:
            self.fence()
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

    def note_executed(self, index: int, undo: dict[str, Any]) -> None:
        """A cell finished and wrote files, and a snapshot comes before its record: should
        the run be killed in between, the cell runs again, and this note lets the resume
        give it back those files as they were before it first ran."""
        self.fence()
        self.store.write_cell(
            index,
            self.attempt,
            {
                "index": index,
                "attempt": self.attempt,
                "status": CellStatus.EXECUTED.value,
                "undo": undo,
            },
        )

    def commit(self, index: int, record: dict[str, Any]) -> None:
        self.fence()
        self.store.write_cell(index, self.attempt, record)
        self.records[index] = record

    def recommit_updated_displays(
        self, index: int, session: KernelSession, held: dict[int, dict[str, Any]]
    ) -> None:
        """A cell may update a display an earlier cell made (display_id): re-record it.
        ``held``: records not yet committed (behind a snapshot in the background); those
        are updated where they wait, and committed as they now are."""
        for earlier in sorted(session.take_touched(index)):
            waiting = held.get(earlier)
            rec = waiting if waiting is not None else self.records.get(earlier)
            if rec is None:
                continue
            outputs = list(self.nb.cells[earlier].get("outputs", []))
            updated = {**rec, "outputs": self.cap(earlier, outputs)}
            if earlier in self._spilled:
                updated["spilled"] = self._spilled.pop(earlier)
            if waiting is not None:
                waiting.clear()
                waiting.update(updated)
            else:
                self.commit(earlier, updated)

    def commit_failure(self, index: int, t0: float, ename: str, evalue: str) -> None:
        """A cell that did not end by itself (kernel death, a time limit): its outputs so
        far, and the reason as its error."""
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
            "status": CellStatus.FAILED.value,
            "execution_count": cell.get("execution_count"),
            "outputs": self.cap(index, outputs),
            "metadata": {},
            "start": t0,
            "end": time.time(),
            "duration": round(time.time() - t0, 6),
            "error": {"ename": ename, "evalue": evalue},
        }
        with contextlib.suppress(SupersededError):
            self.commit(index, rec)

    # -- the output notebook ------------------------------------------------------------
    def run_meta(self, final: bool) -> dict[str, Any]:
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

    def refresh(
        self,
        session: KernelSession | None,
        *,
        force: bool = False,
        final: bool = False,
        running: int | None = None,
        to_output: bool | None = None,
    ) -> int:
        """Write output.ipynb and OUTPUT if due (OUTPUT pretty when the attempt ends,
        compact while it runs, as papermill keeps it current); returns the size. Due means
        ``output_refresh`` seconds since the last, and never more often than 20 times what
        the last write cost; a refresh that is not due is made once it is, from the event
        loop while the next cell runs, so OUTPUT never lags a long cell behind."""
        now = time.monotonic()
        wait = max(self._output_refresh, 20 * self._refresh_cost) - (now - self._last_refresh)
        if not force and wait > 0:
            if self._deferred is None and not final:
                with contextlib.suppress(RuntimeError):  # no event loop: nothing runs on
                    self._deferred = asyncio.get_running_loop().call_later(
                        wait, self._refresh_later, session, running
                    )
            return 0
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        widgets = session.widget_state() if session is not None else None
        to_output = final if to_output is None else to_output
        meta = self.run_meta(final)
        live = self._live(session)
        if live is not None:  # a cell runs: OUTPUT shows what it printed so far
            running = live[0]
        outs = None if live is None else live[1]
        if to_output or final:
            # what a user opens is indented as nbformat writes it
            nb = nbs.assemble(self.nb, self.records, run_meta=meta, running=running, live=outs)
            if widgets:  # as nbclient writes it: the widgets' state, for renderers
                nb.metadata["widgets"] = widgets
            data = nbs.dumps(nb, pretty=True).encode()
        else:
            # refreshes are compact, and encode only the cells that changed since the last
            data = self._writer.dumps(
                self.nb, self.records, run_meta=meta, running=running, widgets=widgets, live=outs
            ).encode()
        self.store.write("output.ipynb", data)
        if self.spec.output:
            self._write_output(data, final=bool(to_output))
        self._last_refresh = time.monotonic()
        self._refresh_cost = self._last_refresh - now
        return len(data)

    def _live(self, session: KernelSession | None) -> tuple[int, list[Any]] | None:
        """The running cell and its outputs so far, unless they are over --max-output-bytes
        (then its record, cut to that, shows them when it ends)."""
        live = session.live_outputs() if session is not None else None
        if live is not None and len(json.dumps(live[1])) > self.spec.limits.max_output_bytes:
            return live[0], []
        return live

    def output_arrived(self, session: KernelSession) -> None:
        """The running cell printed or displayed something: OUTPUT shows it within
        ``output_refresh`` seconds (never more often than 20 times a write's cost)."""
        if self._deferred is not None or session.running is None:
            return
        since = time.monotonic() - self._last_refresh
        wait = max(0.0, max(self._output_refresh, 20 * self._refresh_cost) - since)
        with contextlib.suppress(RuntimeError):  # no event loop: nothing runs on
            self._deferred = asyncio.get_running_loop().call_later(
                wait, self._refresh_later, session, session.running
            )

    def _refresh_later(self, session: KernelSession | None, running: int | None) -> None:
        self._deferred = None
        try:
            # not fenced by a commit as the others are: a newer attempt may own the run
            if not self.store.superseded(self.attempt):
                self.refresh(session, running=running)
        except Exception as exc:  # the next commit's own write says what is wrong
            log.warning("could not refresh the output while a cell runs: %s", exc)

    def _write_output(self, data: bytes, final: bool) -> None:
        """OUTPUT: the attempt's last write must land (its error ends the run, the store
        keeps the notebook); one while cells run may fail, said once, and is retried."""
        from ..store.runstore import write_url

        assert self.spec.output is not None
        if final:
            write_url(self.spec.output, data)
            return
        try:
            write_url(self.spec.output, data)
        except StorageError as exc:
            if not self._output_failed:
                log.warning("%s; the run goes on, and tries again after the next cell", exc)
            self._output_failed = True
        else:
            self._output_failed = False

    def finish_already_done(self) -> None:
        """Every cell has a record: write the output again and say the run succeeded."""
        log.info("run %s has already finished; writing its output again", self.spec.run_id)
        self.attempt = int(self._run.get("attempt", 0))
        self.refresh(None, force=True, final=True)
        if self._run.get("status") != RunStatus.SUCCEEDED.value:
            # every cell is done (or there are none): whatever run.json said (pending,
            # or running when a killed attempt committed the last cell), it succeeded
            self.set_status(RunStatus.SUCCEEDED)


def cell_effects(result: CellResult) -> dict[str, Any]:
    """What the kernel noted about a cell: its effects (files written, processes, random
    draws) and, where a replay needs them, the cwd, environment and generators it
    started from. It comes in the reply's metadata, or (kernels whose replies cannot
    carry it) as the user expression asked for with the cell."""
    import ast

    found: Any = result.reply_metadata.get("spotbook")
    if found is None:
        value = (result.reply.get("user_expressions") or {}).get("spotbook") or {}
        if value.get("status") != "ok":
            return {}
        try:
            text = value["data"]["text/plain"]
            if text == "'{}'":  # most cells: nothing noted
                return {}
            found = json.loads(ast.literal_eval(text))
        except (ValueError, SyntaxError, KeyError, TypeError):
            return {}
    return found if isinstance(found, dict) else {}


def cap_outputs(outputs: list[Any], limit: int, stored_at: str) -> tuple[list[Any], str | None]:
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
                    f"whole text is in the run store at {stored_at}]\n{tail}"
                )
        out.append(o)
    return out, full
