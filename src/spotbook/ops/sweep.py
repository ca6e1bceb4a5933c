"""Sweeps: one notebook over a grid of parameters (``spotbook sweep``).

Each point is an ordinary run with its own run store under ``URL/points/<index>``, so
every command works on a point (``status``, ``resume``, ``drill``). ``URL/sweep.json``
lists the points; it is written after every point's store, so a sweep that exists is
complete, and it is only read to find the points: each point's notebook and parameters
come from its own sealed store, never from ``sweep.json``.

Locally the points run as ``spotbook resume`` processes, ``parallel`` at a time, each
with its own kernel; a stop (SIGINT, SIGTERM) reaches every one of them, each saves its
progress, and ``resume_sweep`` continues every unfinished point. On Kubernetes the
sweep is one Indexed Job whose pod ``i`` runs point ``i`` (``submit_sweep``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import InputChangedError, RunNotFoundError, StoreIntegrityError, UsageError
from .._models import (
    EXIT_CELL_ERROR,
    EXIT_OK,
    EXIT_STOPPED,
    EXIT_STORAGE,
    Limits,
    RunRequest,
    RunStatus,
    SnapshotPolicy,
)
from .._status import describe
from ..kernel.helpers import recorded
from ..kube.manifest import JobOptions
from ..notebook.grid import varying
from ..store.integrity import Key
from ..store.runstore import (
    SWEEP_FILE,
    RunStore,
    SweepPoint,
    is_url,
    new_run_id,
    point_url,
    resolve_run,
)
from .submit import Submitted

log = logging.getLogger(__name__)

GIB = 1024**3

Say = Callable[[str], None]


@dataclass(frozen=True)
class PointRow:
    """One point of a sweep, as ``sweep status`` shows it."""

    index: int
    parameters: dict[str, Any]
    status: str
    cells_done: int
    cells_total: int
    attempts: int
    preemptions: int
    results: dict[str, Any]
    duration: float | None  # seconds in attempts (None before the first)
    url: str
    message: str = ""
    refused: bool = False  # its results failed their check: left out (``sweep results`` exits 2)


@dataclass(frozen=True)
class SweepTable:
    """Every point of a sweep: parameters, status, progress and recorded results."""

    url: str
    rows: list[PointRow]
    varying: list[str] = field(default_factory=list)  # parameters that differ by point

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def result_names(self) -> list[str]:
        names: dict[str, None] = {}
        for r in self.rows:
            names.update(dict.fromkeys(r.results))
        return list(names)

    def records(self) -> list[dict[str, Any]]:
        """One flat dict per point: index, the varying parameters, status, progress,
        then every recorded result (None where a point recorded none)."""
        names = self.result_names()
        out = []
        for r in self.rows:
            row: dict[str, Any] = {"point": r.index}
            row.update({k: r.parameters.get(k) for k in self.varying})
            row.update(
                status=r.status,
                cells_done=r.cells_done,
                cells_total=r.cells_total,
                attempts=r.attempts,
                preemptions=r.preemptions,
                duration=r.duration,
            )
            row.update({n: r.results.get(n) for n in names})
            out.append(row)
        return out

    def exit_code(self) -> int:
        """The sweep's exit code: 0 every point succeeded, 1 a point failed (the others
        ran on), 75 points are unfinished (stopped: ``sweep resume``), 3 otherwise."""
        statuses = {r.status for r in self.rows}
        if statuses <= {RunStatus.SUCCEEDED}:
            return EXIT_OK
        known = [s for s in map(RunStatus.of, statuses) if s is not None]
        if any(s.unsettled for s in known):
            return EXIT_STOPPED
        if any(s.unsuccessful for s in known):
            return EXIT_CELL_ERROR
        return EXIT_STORAGE


def default_parallel() -> int:
    """Points at once by default: one per core, and no more than one per GiB of memory
    available (a kernel with a small notebook takes ~100 MB; real work more)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    avail = None
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    by_memory = max(1, avail // GIB) if avail else cores or 1
    return max(1, min(cores or 1, by_memory))


def prepare_sweep(
    request: RunRequest,
    url: str,
    points: Sequence[Mapping[str, Any]],
    *,
    key: Key | None = None,
    here: bool = True,
) -> str:
    """Freeze ``request``'s notebook with each point's parameters into ``URL/points/<i>``
    (or reopen them: the same sweep again continues it) and write ``sweep.json``; returns
    the sweep's id. Every point is ``request`` with its own parameters and store
    (``request.output`` may be a template: ``out_{lr}.ipynb``)."""
    from .._api import prepare

    restart = request.restart
    if not points:
        raise UsageError("the sweep has no points: give -p NAME V1,V2,... or a YAML grid")
    url = url.rstrip("/")
    root = RunStore(url)
    if root.exists("run.json"):
        raise UsageError(f"{url} holds a run, not a sweep; give the sweep its own --run-dir")
    plain = [json.loads(json.dumps(dict(p))) for p in points]
    listed = None if restart else root.sweep_points()  # --restart writes it anew, as it is
    if listed is not None and [p.parameters for p in listed] != plain:
        raise InputChangedError(
            f"{url} holds a sweep over other points ({len(listed)} points); give "
            "another --run-dir, or --restart to discard it and start this sweep there"
        )
    old = root.read_json(SWEEP_FILE) if listed is not None else None
    notebook = request.notebook
    if isinstance(notebook, str) and not is_url(notebook):
        notebook = os.path.abspath(notebook)
    for i, params in enumerate(plain):
        point = dataclasses.replace(
            request, notebook=notebook, parameters=params, run_dir=point_url(url, i)
        )
        prepare(point, key=key, here=here)
    sweep_id = (old or {}).get("sweep_id") if not restart else None
    sweep_id = sweep_id or new_run_id()
    root.write_json(
        SWEEP_FILE,
        {
            "sweep_id": sweep_id,
            "source": notebook if isinstance(notebook, str) else "-",
            "created": (old or {}).get("created", time.time()) if not restart else time.time(),
            "points": [{"index": i, "parameters": p} for i, p in enumerate(plain)],
        },
    )
    return str(sweep_id)


def open_sweep(url: str) -> tuple[str, list[SweepPoint]]:
    """(the sweep's URL, its points, checked)."""
    url = resolve_run(url).rstrip("/")
    points = RunStore(url).sweep_points()
    if points is None:
        raise RunNotFoundError(
            f"no sweep in {url} ({SWEEP_FILE} is missing); start one with "
            "`spotbook sweep NOTEBOOK --run-dir URL -p NAME V1,V2`"
        )
    return url, points


def point_results(store: RunStore) -> dict[str, Any]:
    """What the point's cells recorded with ``spotbook.record`` (or scrapbook's ``glue``
    of JSON values, or papermill's ``record``), last value per name: only
    what the run's seal vouches for (StoreIntegrityError names a record that fails its
    check, as a resume of the point would)."""
    out: dict[str, Any] = {}
    store.unseal()
    records = store.cell_records()
    for index in sorted(records):
        for o in records[index].get("outputs") or []:
            found = recorded(o)
            if found is not None:
                out[found[0]] = found[1]
    return out


def sweep_status(url: str) -> SweepTable:
    """The sweep's table: every point's parameters, status, cells, attempts,
    preemptions, recorded results and time in attempts."""
    url, points = open_sweep(url)
    rows = []
    for p in points:
        i = p.index
        store = RunStore(point_url(url, i))
        if not store.exists("run.json"):
            rows.append(PointRow(i, p.parameters, "missing", 0, 0, 0, 0, {}, None, store.url))
            continue
        doc = describe(store)
        totals = doc["downtime"]["totals"]
        message, refused = doc["message"], False
        try:
            results = point_results(store)
        except StoreIntegrityError as exc:
            results, message, refused = {}, f"results refused: {exc}", True
        rows.append(
            PointRow(
                index=i,
                parameters=p.parameters,
                status=doc["status"],
                cells_done=doc["cells_done"],
                cells_total=doc["cells_total"],
                attempts=len(doc["attempts"]),
                preemptions=doc["preemptions"],
                results=results,
                duration=totals["attempt_seconds"] if doc["attempts"] else None,
                url=store.url,
                message=message,
                refused=refused,
            )
        )
    return SweepTable(url, rows, varying([p.parameters for p in points]))


def run_points(
    url: str,
    *,
    parallel: int | None = None,
    grace: float | None = None,
    say: Say | None = None,
    points: Sequence[int] | None = None,
) -> SweepTable:
    """Run (or resume) every unfinished point of the sweep at ``url`` here, ``parallel``
    at a time, each in a ``spotbook resume`` process with its own kernel. SIGINT or
    SIGTERM stops them all (each saves its progress) and starts no more; the table
    says where every point stands."""
    tell = say or log.info
    url, listed = open_sweep(url)
    width = parallel or default_parallel()
    if width < 1:
        raise UsageError("--parallel must be 1 or more")
    todo = []
    for p in listed:
        i = p.index
        if points is not None and i not in points:
            continue
        store = RunStore(point_url(url, i))
        if not store.exists("run.json"):
            raise UsageError(
                f"point {i} of the sweep in {url} has no run store; run the same "
                "`spotbook sweep` command again to create it"
            )
        status = describe(store)["status"]
        if RunStatus(status).settled:  # a resume of the sweep leaves it alone
            continue
        if status == RunStatus.RUNNING:
            tell(f"point {i} is running in another process; leaving it to that one")
            continue
        todo.append(i)
    tell(f"sweep {url}: {len(todo)} of {len(listed)} points to run, {width} at a time")
    _Pool(url, width, grace, tell).run(todo)
    return sweep_status(url)


class _Pool:
    """The point processes of a local sweep, and the stop that reaches them all."""

    def __init__(self, url: str, width: int, grace: float | None, say: Say) -> None:
        self.url, self.width, self.grace, self.say = url, width, grace, say
        self.running: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping = ""
        self.lock = threading.Lock()
        self.relays: list[threading.Thread] = []

    def _start(self, i: int) -> None:
        argv = [sys.executable, "-m", "spotbook", "resume", point_url(self.url, i)]
        argv += ["--no-progress-bar", "--log-level", "WARNING"]
        if self.grace is not None:
            argv += ["--grace", str(self.grace)]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.running[i] = proc
        relay = threading.Thread(target=self._relay, args=(i, proc), daemon=True)
        relay.start()
        self.relays.append(relay)
        self.say(f"point {i}: started (pid {proc.pid})")

    def _relay(self, i: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        with proc.stderr:
            for line in proc.stderr:
                text = line.decode(errors="replace").rstrip()
                if text:
                    with self.lock:
                        sys.stderr.write(f"[point {i}] {text}\n")
                        sys.stderr.flush()

    def _stop(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if not self.stopping:
            self.say(f"{name}: stopping every point (each saves its progress)")
        self.stopping = name
        # the same stop to every point: Ctrl-C stays the user's stop, not a preemption
        forward = signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM
        for proc in list(self.running.values()):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(forward)

    def run(self, todo: list[int]) -> None:
        queue = list(todo)
        previous = {}
        main = threading.current_thread() is threading.main_thread()
        if main:
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._stop)
        try:
            while queue or self.running:
                while queue and len(self.running) < self.width and not self.stopping:
                    self._start(queue.pop(0))
                for i, proc in list(self.running.items()):
                    code = proc.poll()
                    if code is not None:
                        del self.running[i]
                        self.say(f"point {i}: exit {code}")
                if self.stopping and not self.running:
                    break
                if self.running:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        next(iter(self.running.values())).wait(timeout=0.2)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for relay in self.relays:  # every line of the points' output said
                relay.join(timeout=5.0)


def sweep(
    notebook: Any,
    run_dir: str,
    grid: Mapping[str, Any] | None = None,
    *,
    rows: Sequence[Mapping[str, Any]] = (),
    output: str | None = None,
    parallel: int | None = None,
    kernel_name: str | None = None,
    limits: Limits | None = None,
    snapshot: SnapshotPolicy | None = None,
    strict_resume: bool = False,
    restart: bool = False,
    say: Say | None = None,
) -> SweepTable:
    """Run ``notebook`` at every point of ``grid`` (lists are swept, see
    ``notebook.grid``) and ``rows``, ``parallel`` at a time, each point a run in
    ``run_dir/points/<i>``; the table of every point. Running it again with the same
    grid continues the sweep."""
    from ..notebook.grid import expand

    request = RunRequest(
        notebook,
        output,
        kernel_name=kernel_name,
        limits=limits or Limits(),
        snapshot=snapshot or SnapshotPolicy(),
        strict_resume=strict_resume,
        restart=restart,
    )
    prepare_sweep(request, run_dir, expand(grid or {}, rows))
    return run_points(run_dir, parallel=parallel, say=say)


def resume_sweep(url: str, *, parallel: int | None = None, say: Say | None = None) -> SweepTable:
    """Continue every unfinished point of a sweep (each resumed after its last saved
    cell, with its kernel's state); finished and failed points are left as they are."""
    return run_points(url, parallel=parallel, say=say)


def submit_sweep(
    request: RunRequest,
    job: JobOptions,
    points: Sequence[Mapping[str, Any]],
    *,
    parallelism: int | None = None,
    max_failed_points: int | None = None,
    context: str | None = None,
    namespace: str | None = None,
    dry_run: bool = False,
    warn: Callable[[str], None] | None = None,
) -> Submitted:
    """Freeze ``request``'s notebook at every point into ``job.run_dir/points/<i>`` (a
    bucket URL), sealed with the cluster's run key, and create one Indexed Job: pod ``i``
    runs point ``i``, a preempted pod is replaced for its point alone, and a failing point
    fails only itself (``max_failed_points`` of them stop the Job; default: none do).
    ``warn`` and ``dry_run`` as for ``submit`` (the dry run checks that the notebook takes
    the first point's parameters)."""
    from ..kube.manifest import build_job
    from .jobs import cluster_for, new_job_record
    from .submit import check_submit, for_cluster, would_submit

    check_submit(request, job, warn)
    job = dataclasses.replace(
        job, points=len(points), parallelism=parallelism, max_failed_points=max_failed_points
    )
    if dry_run:
        first = dict(points[0]) if points else {}
        return would_submit(dataclasses.replace(request, parameters=first), job)
    with cluster_for(context, namespace) as cluster:
        job, key = for_cluster(cluster, job, request.limits, request.notebook)
        sweep_id = prepare_sweep(request, job.run_dir, points, key=key, here=False)
        job = dataclasses.replace(job, run_id=sweep_id)
        manifest = build_job(job)
        name = manifest["metadata"]["name"]
        RunStore(job.run_dir).write_job_record(
            new_job_record(cluster, job, name, None), key=key, sweep_id=sweep_id
        )
        cluster.create_job(manifest)
    return Submitted(
        run_id=sweep_id,
        url=job.run_dir,
        job=name,
        namespace=cluster.namespace,
        context=cluster.context_name,
        manifest=manifest,
    )


def write_results(table: SweepTable, path: str) -> str:
    """The results table to ``path``: CSV, or Parquet (``.parquet``, with pandas); JSON
    lines for ``.jsonl``. Returns the format written."""
    rows = table.records()
    if path.endswith(".parquet"):
        try:
            import pandas as pd  # type: ignore[import-untyped]

            frame = pd.DataFrame(rows)
            frame.to_parquet(path)
        except ImportError as exc:
            raise UsageError(
                f"writing Parquet needs pandas and pyarrow ({exc}); pip install pandas "
                "pyarrow, or give a .csv or .jsonl file"
            ) from exc
        return "parquet"
    if path.endswith(".jsonl"):
        with open(path, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        return "jsonl"
    import csv

    with open(path, "w", encoding="utf-8", newline="") as fh:
        columns = list(rows[0]) if rows else ["point"]
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(v) for k, v in row.items()})
    return "csv"


def _cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, dict | list) else value
