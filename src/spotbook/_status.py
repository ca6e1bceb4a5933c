"""Where a run stands, derived from its store alone (no process needs to be alive)."""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Callable
from typing import Any, NotRequired, TypedDict

from ._errors import StoreIntegrityError
from ._models import (
    INTERRUPTED_OUTCOMES,
    STATUS_ATTEMPT_FIELDS,
    AttemptRecord,
    CellStatus,
    Outcome,
    RunSpec,
    RunStatus,
    alive,
    epoch,
)
from .notebook import document as nbs
from .store.runstore import CANCELLED, JOB_RECORD, LOCAL_RUNS, RunStore


def _attempt_outcomes(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Attempts with 'running' resolved: a later attempt or a dead local pid means killed."""
    out = []
    here = socket.gethostname()
    # what came before the last --restart belongs to a discarded run
    cut = max((i for i, a in enumerate(attempts) if a.get("restart")), default=-1)
    real = [a for a in attempts[cut + 1 :] if a.get("outcome") != Outcome.RESTART]
    for i, rec in enumerate(real):
        rec = dict(rec)
        if rec.get("outcome") == Outcome.RUNNING.value:
            later = i < len(real) - 1
            dead = rec.get("host") == here and rec.get("pid") and not alive(int(rec["pid"]))
            if later or dead:
                rec["outcome"] = Outcome.KILLED.value
        out.append(rec)
    return out


ClusterView = Callable[[str, dict[str, Any]], dict[str, Any]]


class RunReport(TypedDict):
    """Where a run stands: ``spotbook status --json``, ``spotbook.run_status()``."""

    run_id: str
    run_dir: str
    status: str  # a RunStatus's value; for a submitted run also the Job's live state
    message: str
    source: str
    output: str | None
    parameters: dict[str, Any]
    kernel: str
    cells_done: int
    cells_total: int
    failing_cell: dict[str, Any] | None  # index, execution_count, ename, evalue
    attempts: list[AttemptRecord]  # the fields STATUS_ATTEMPT_FIELDS names
    preemptions: int
    downtime: dict[str, Any]  # what each preemption cost, and the totals (``downtime``)
    # the cell running now (its index in the notebook), while the run runs
    current_cell: NotRequired[int]
    # its store's folder name where that is not its id (`run --name`, `--run-dir`)
    name: NotRequired[str]
    cluster: NotRequired[dict[str, Any]]  # the Job and its pods (``kube.jobs.job_view``)
    # the run was moved to on-demand nodes: when and why (``ops.fallback``)
    fallback: NotRequired[dict[str, Any]]


def _done(executable: list[int], records: dict[int, dict[str, Any]]) -> list[int]:
    """The executable cells whose record says they finished."""
    finished = (CellStatus.COMPLETED, CellStatus.EXITED)
    return [i for i in executable if records.get(i, {}).get("status") in finished]


def _status_of(
    store: RunStore, run: dict[str, Any], attempts: list[dict[str, Any]]
) -> tuple[RunStatus, bool]:
    """The run's status, run.json's, where a running run whose last attempt was killed is
    interrupted; and whether it was cancelled (``spotbook cancel``: its status then says
    so, unless it succeeded)."""
    value = run.get("status", RunStatus.PENDING.value)
    try:
        status = RunStatus(value)
    except ValueError:  # (a field outside the seal: a writer of the store can set it)
        known = ", ".join(s.value for s in RunStatus)
        raise StoreIntegrityError(
            f"{store.url}/run.json: status {value!r} is not a run status ({known}); it was "
            "not used. Inspect the store, or start the run over with `spotbook run ... "
            "--restart`"
        ) from None
    if status is RunStatus.RUNNING and attempts and attempts[-1]["outcome"] == Outcome.KILLED:
        status = RunStatus.INTERRUPTED
    return status, status is not RunStatus.SUCCEEDED and store.exists(CANCELLED)


def interrupted_at(store: RunStore, run: dict[str, Any], nb: Any) -> tuple[int, int] | None:
    """(cells done, cells in all) where the run in ``store`` was interrupted, as
    ``describe`` would say, from its run.json (``run``, checked) and frozen notebook
    (``nb``) as a new attempt has already read them; None if it was not interrupted."""
    attempts = _attempt_outcomes(store.attempts())
    if not attempts:
        return None
    status, cancelled = _status_of(store, run, attempts)
    if cancelled or status is not RunStatus.INTERRUPTED:
        return None
    executable = [i for i, c in enumerate(nb.cells) if nbs.executable(c)]
    return len(_done(executable, store.cell_records())), len(executable)


def describe(store: RunStore, cluster: ClusterView | None = None) -> RunReport:
    """The status document behind ``spotbook status --json``.

    For a submitted run, ``cluster(run_id, job_record)`` gives the Job's view
    (``_jobs.job_view``, or ``{"error": ...}``); it goes into the document as
    ``cluster``, and its pods' scheduling times into the downtime report.
    """
    run = store.require_run()
    spec = RunSpec.from_json(run["spec"], f"{store.url}/run.json")
    raw = store.read("input.ipynb")
    try:
        cells = nbs.load_frozen(raw).cells if raw else []
    except (ValueError, TypeError, AttributeError) as exc:  # UnicodeDecodeError is one
        raise StoreIntegrityError(
            f"{store.url}/input.ipynb is not the notebook spotbook froze there ({exc}); it was "
            "not used. Inspect the store, or start the run over with `spotbook run ... --restart`"
        ) from None
    executable = [i for i, c in enumerate(cells) if nbs.executable(c)]
    records = store.cell_records()
    done = _done(executable, records)
    failing = next((r for r in records.values() if r.get("status") == CellStatus.FAILED), None)
    attempts = _attempt_outcomes(store.attempts())
    status, cancelled = _status_of(store, run, attempts)
    job = store.read_json(JOB_RECORD) or {}
    # the cluster is asked where the record's seal says (a changed record is refused)
    view = cluster(spec.run_id, store.job_record() or {}) if cluster is not None and job else {}
    pods = view.get("pods") or []
    scheduled = {p["name"]: p["scheduled"] for p in pods if p.get("scheduled")}
    doc = RunReport(
        run_id=spec.run_id,
        run_dir=store.url,
        status=(RunStatus.CANCELLED if cancelled else status).value,
        message=run.get("message", ""),
        source=spec.source,
        output=spec.output,
        parameters=spec.parameters,
        kernel=spec.kernel_name,
        cells_done=len(done),
        cells_total=len(executable),
        failing_cell=None,
        attempts=[
            {k: a[k] for k in STATUS_ATTEMPT_FIELDS if a.get(k) is not None}  # type: ignore[misc]
            for a in attempts
        ],
        preemptions=sum(1 for a in attempts if a.get("outcome") in INTERRUPTED_OUTCOMES),
        downtime=downtime(
            attempts, records, gpus=int(job.get("gpu_count") or 0), scheduled=scheduled
        ),
    )
    if status is RunStatus.RUNNING:
        doc["current_cell"] = next(
            (i for i in executable if i not in done), executable[-1] if executable else 0
        )
    if view:
        doc["cluster"] = view
    if job.get("fallback"):
        doc["fallback"] = job["fallback"]
    if failing is not None:
        doc["failing_cell"] = {
            "index": failing["index"],
            "execution_count": failing.get("execution_count"),
            **(failing.get("error") or {}),
        }
    return doc


def _r(x: float) -> float:
    return round(x, 3)


def downtime(
    attempts: list[dict[str, Any]],
    records: dict[int, dict[str, Any]],
    gpus: int = 0,
    scheduled: dict[str, str] | None = None,
) -> dict[str, Any]:
    """What each preemption cost, from the attempts and cell records, and the pods'
    scheduling times when known.

    For an interrupted attempt A and the attempt B after it, on one time line:
    ``last_progress`` (A's last committed cell), ``stopped`` (A ended; unknown when it was
    killed without notice, then taken as last_progress), ``next_scheduled`` (B's pod was
    bound to a node: from ``scheduled``, pod name to the PodScheduled condition's time;
    unknown for a local run or a pod already gone), ``next_started`` (B's process
    started), ``kernel_ready`` and ``running_new_cells`` (B restored its state and went on
    with cells never run). The gap between the first and the last is split into four
    stretches: until stopped; scheduling and node (to ``next_scheduled``, or to
    ``next_started`` when that is unknown, so then it includes the image pull); image and
    kernel start; state restore. ``redone_seconds`` is finished compute B ran again to
    rebuild state. Waiting for a node costs no GPU; the other three are wasted GPU time.
    """
    ends: dict[int, float] = {}
    for rec in records.values():
        n = int(rec.get("attempt") or 0)
        ends[n] = max(ends.get(n, 0.0), float(rec.get("end") or 0.0))
    real = [a for a in attempts if a.get("outcome") != Outcome.RESTART and a.get("started")]
    events: list[dict[str, Any]] = []
    for a, b in itertools.pairwise(real):
        if a.get("outcome") not in INTERRUPTED_OUTCOMES:
            continue
        t0 = max(ends.get(int(a["attempt"]), 0.0), float(a.get("resumed_at") or a["started"]))
        # B went on from a checkpoint A took inside a cell: A's last progress
        inside = b.get("resumed_in_cell") or {}
        if inside.get("attempt") != a["attempt"] or not all(
            k in inside for k in ("cell", "loop", "iteration", "total")
        ):
            inside = {}
        if isinstance(inside.get("at"), int | float):
            t0 = max(t0, float(inside["at"]))
        known = a.get("outcome") == Outcome.PREEMPTED and a.get("ended") is not None
        t1 = max(float(a["ended"]), t0) if known else t0
        t2 = max(float(b.get("process_started") or b["started"]), t1)
        t3 = max(float(b["started"]) + float(b.get("kernel_start_seconds") or 0.0), t2)
        t4 = max(float(b.get("resumed_at") or t3), t3)
        bound = epoch((scheduled or {}).get(str(b.get("pod") or "")))
        # the API server's clock and second resolution: keep it inside its stretch
        ts = None if bound is None else min(max(bound, t1), t2)
        events.append(
            {
                "attempt": a["attempt"],
                "next_attempt": b["attempt"],
                "how": a["outcome"],
                "node": a.get("node") or a.get("host"),
                "next_node": b.get("node") or b.get("host"),
                "last_progress_at": _r(t0),
                "stopped_at": _r(t1) if known else None,
                "next_scheduled_at": None if ts is None else _r(ts),
                "next_started_at": _r(t2),
                "kernel_ready_at": _r(t3),
                "running_new_cells_at": _r(t4),
                "gap_seconds": _r(t4 - t0),
                "split": {
                    "until_stopped": _r(t1 - t0),
                    "scheduling_and_node": _r((t2 if ts is None else ts) - t1),
                    "image_and_kernel_start": _r(t3 - (t2 if ts is None else ts)),
                    "state_restore": _r(t4 - t3),
                },
                "redone_seconds": _r(float(b.get("redone_seconds") or 0.0)),
                # resumed inside a cell: where, and the most a kill without notice lost
                # there (the checkpoint interval; the iteration it was in comes on top)
                **(
                    {
                        "resumed_inside": {
                            k: inside[k] for k in ("cell", "loop", "iteration", "total")
                        },
                        "lost_at_most_seconds": inside.get("interval"),
                    }
                    if inside
                    else {}
                ),
                "restored_bytes": b.get("restored_bytes", 0),
            }
        )
    compute = 0.0
    gpu_seconds = 0.0
    for a in real:
        end = a.get("ended") or max(ends.get(int(a["attempt"]), 0.0), float(a["started"]))
        span = max(float(end) - float(a.get("process_started") or a["started"]), 0.0)
        compute += span
        gpu_seconds += span * (len(a["gpus"]) if a.get("gpus") else gpus)
    wasted = sum(
        e["split"]["until_stopped"]
        + e["split"]["image_and_kernel_start"]
        + e["split"]["state_restore"]
        for e in events
    )
    return {
        "preemptions": events,
        "totals": {
            "preemptions": len(events),
            "attempt_seconds": _r(compute),
            "gpu_seconds": _r(gpu_seconds),
            "wasted_seconds": _r(wasted),
            "downtime_seconds": _r(sum(e["gap_seconds"] for e in events)),
        },
    }


def local_run_dirs(base: str = ".") -> list[str]:
    """The run stores under ``base/.spotbook/runs``, newest first (read by the caller,
    which names one it cannot read and goes on)."""
    root = os.path.join(base, LOCAL_RUNS)
    try:
        names = sorted(os.listdir(root), reverse=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [os.path.join(root, name) for name in names]
