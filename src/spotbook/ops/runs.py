"""Find a run wherever it is, and say where it stands: its store, and its Job when it
was submitted (``spotbook status``, ``cancel``, ``recover``, ``logs``)."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .._errors import ClusterError, RunNotFoundError, SpotbookError, UsageError
from .._models import Outcome, RunStatus, alive, runner_mark
from .._status import ClusterView, RunReport, describe
from ..kube.jobs import ENDED_STATES, LIVE_STATES
from ..kube.manifest import ANNOTATION_RUN_DIR
from ..store.runstore import (
    CANCELLED,
    JOB_RECORD,
    SWEEP_FILE,
    RunStore,
    is_url,
    listing_fs,
    resolve_run,
)
from .fallback import FallbackPolicy, fall_back
from .jobs import cluster_for, job_record
from .submit import Submitted
from .sweep import sweep_status

if TYPE_CHECKING:
    from ..kube.cluster import Cluster
    from ..notebook.document import Notebook


# what the store says while the cluster may know better (the pod is pending, queued...)
def _live_status(doc: RunReport) -> None:
    """A submitted run's status from its Job while the store has nothing settled to say
    (the pod is pending, queued, retrying...)."""
    live = (doc.get("cluster") or {}).get("state")
    status = RunStatus.of(doc["status"])
    if status is not None and status.unsettled and live in LIVE_STATES:
        doc["status"] = live


log = logging.getLogger(__name__)


def open_run(run: str, *, context: str | None = None, namespace: str | None = None) -> RunStore:
    """The run store of ``run``: a URL, a local run (path or id), or (by id) a Job on the
    cluster whose annotation names its store."""
    store = RunStore(resolve_run(run))
    if store.exists("run.json") or store.exists(SWEEP_FILE) or is_url(run) or os.sep in run:
        return store
    try:
        cluster = cluster_for(context, namespace)
    except UsageError:
        return store  # no cluster configured: report the local lookup's failure
    with cluster:
        job = cluster.get_job(run)
    url = ((job or {}).get("metadata", {}).get("annotations") or {}).get(ANNOTATION_RUN_DIR)
    if not url:
        raise RunNotFoundError(
            f"no run {run!r} under ./.spotbook/runs nor as a Job in namespace "
            f"{cluster.namespace!r}; give the run store URL, or --namespace/--context"
        )
    return RunStore(url)


def _store(run: str | RunStore, context: str | None, namespace: str | None) -> RunStore:
    return run if isinstance(run, RunStore) else open_run(run, context=context, namespace=namespace)


def cluster_view(
    context: str | None = None,
    namespace: str | None = None,
    cluster: Cluster | None = None,
) -> ClusterView:
    """``describe``'s window on the cluster: the Job and its pods, or the error that kept
    them from view; through ``cluster`` when the caller holds one."""
    from ..kube.jobs import job_view

    def view(run_id: str, record: dict[str, Any]) -> dict[str, Any]:
        try:
            if cluster is not None:
                return job_view(cluster.get_job(run_id), cluster.pods(run_id), cluster.node_ready)
            with cluster_for(context, namespace, record) as c:
                return job_view(c.get_job(run_id), c.pods(run_id), c.node_ready)
        except (ClusterError, UsageError) as exc:
            return {"error": str(exc)}

    return view


def run_status(
    run: str | RunStore,
    *,
    context: str | None = None,
    namespace: str | None = None,
) -> RunReport:
    """Where a run stands (``spotbook status --json``): the store's account, and for a
    submitted run its Job's, whose live state (pending, queued, retrying, running) is the
    status while the store has nothing more settled to say."""
    store = _store(run, context, namespace)
    doc = describe(store, cluster=cluster_view(context, namespace))
    _live_status(doc)
    return doc


@dataclass(frozen=True)
class Cancelled:
    """A cancelled run, its store keeping everything done so far: a submitted run's Job
    deleted (``job``), or a run on this machine stopped as Ctrl-C stops it (``pid``)."""

    run_id: str
    url: str
    job: str | None = None  # the deleted Job of a submitted run
    pid: int | None = None  # the runner asked to stop, of a run on this machine
    stopped: bool = True  # whether that runner had ended when the call returned
    cells_done: int | None = None  # of the run on this machine, once it stopped
    cells_total: int | None = None


def cancel_run(
    run: str | RunStore,
    *,
    context: str | None = None,
    namespace: str | None = None,
    wait: float | None = None,
) -> Cancelled:
    """Cancel a run: delete a submitted run's Job and mark the run cancelled (a worker
    will not start it again); stop a run on this machine as Ctrl-C would (progress saved,
    ``spotbook resume`` continues it). ``wait``: how long to wait for a local runner to
    end (default: the run's --grace and the time to save); 0 only asks it. A runner that
    did not end in a wait of more than 0 is a ``CommandFailedError`` naming its pid."""
    store = _store(run, context, namespace)
    run_id = str(store.unseal()["spec"]["run_id"])  # the Job it names: from a checked spec
    record = store.job_record()
    if record is None:
        return _stop_local(store, wait)
    with cluster_for(context, namespace, record) as cluster:
        if cluster.get_job(run_id) is None:
            raise ClusterError(
                f"run {run_id} has no Job in namespace {cluster.namespace!r}: it has finished "
                "and been cleaned up, or was cancelled already"
            )
        store.write_json(CANCELLED, {"at": time.time(), "by": os.environ.get("USER", "")})
        cluster.delete_job(run_id)
    return Cancelled(run_id=run_id, url=store.url, job=str(record.get("job") or run_id))


def _stop_local(store: RunStore, wait: float | None) -> Cancelled:
    """``cancel_run`` of a run on this machine."""
    from .._errors import CommandFailedError
    from .._models import EXIT_MARGIN, SAVE_BUDGET

    if wait is None:
        wait = run_grace(store.require_run()) + SAVE_BUDGET + EXIT_MARGIN + 5.0
    runner, ended = stop_local_run(store, timeout=wait)
    if not ended and wait > 0:
        raise CommandFailedError(
            f"run {runner.run_id}: its runner (pid {runner.pid}) was asked to stop and is "
            f"still saving; `kill -9 {runner.pid}` ends it (what it committed stays)"
        )
    doc = describe(store) if ended else None
    return Cancelled(
        run_id=runner.run_id,
        url=runner.url,
        pid=runner.pid,
        stopped=ended,
        cells_done=None if doc is None else doc["cells_done"],
        cells_total=None if doc is None else doc["cells_total"],
    )


@dataclass(frozen=True)
class Trusted:
    """What ``trust_run`` did to a run store made before the seal: trusted here (``entry``:
    the file on this machine that says so), or trusted no longer (``changed``: it was)."""

    url: str
    trusted: bool
    changed: bool
    entry: str | None = None


def trust_run(run: str, *, remove: bool = False) -> Trusted:
    """``spotbook trust``: let this machine's user resume a run store an older spotbook
    made (nothing in it is sealed), or take that back (``remove``). A sealed store is a
    ``UsageError``: it resumes with the key it was made with."""
    from ..store.integrity import trust, untrust

    store = RunStore(resolve_run(run))
    doc = store.require_run()
    if remove:
        return Trusted(store.url, trusted=False, changed=untrust(store.url))
    if doc.get("seal") is not None:
        raise UsageError(
            f"{store.url} is sealed with a key (run {doc['spec'].get('run_id')}): there is "
            "nothing to trust; it resumes with the key it was made with"
        )
    return Trusted(store.url, trusted=True, changed=True, entry=trust(store.url))


@dataclass(frozen=True)
class Recovered:
    """What ``recover`` found: the pods it deleted (stuck Terminating on a lost node), and
    the others as ``describe_pod`` words them."""

    run_id: str
    deleted: list[dict[str, Any]]
    others: list[str]


def recover_run(
    run: str | RunStore, *, context: str | None = None, namespace: str | None = None
) -> Recovered:
    """Force-delete the run's pods stuck past their grace on a node that is gone, so the
    Job starts a replacement that resumes the run."""
    from ..kube.jobs import describe_pod, pod_view

    store = _store(run, context, namespace)
    record = job_record(store)  # sealed: checks run.json's seal first
    run_id = store.require_run()["spec"]["run_id"]
    with cluster_for(context, namespace, record) as cluster:
        views = [pod_view(p, cluster.node_ready) for p in cluster.pods(run_id)]
        # stuck on a node that is not Ready, or past its grace on one this account may not
        # read
        stuck = [v for v in views if v.get("past_grace")]
        for v in stuck:
            # The old attempt cannot write once a new one claims the run (the store's
            # fence), so forgetting a pod whose node died is safe even if it comes back.
            cluster.force_delete_pod(v["name"])
    return Recovered(
        run_id=run_id,
        deleted=stuck,
        others=[describe_pod(v) for v in views if not v.get("past_grace")],
    )


def run_notebook(
    run: str | RunStore, *, context: str | None = None, namespace: str | None = None
) -> Notebook:
    """The run's notebook as it stands: every finished cell's outputs, the others
    pending (the store's output notebook, refreshed as cells finish; before the first
    refresh, the parameterized input)."""
    from ..notebook import document as nbs

    store = _store(run, context, namespace)
    store.require_run()
    for name in ("output.ipynb", "input.ipynb"):
        data = store.read(name)
        if data is not None:
            return nbs.parse(data, f"{store.url}/{name}")
    raise RunNotFoundError(f"the run in {store.url} has no notebook yet")


def run_logs(
    run: str | RunStore,
    *,
    lines: int = 200,
    context: str | None = None,
    namespace: str | None = None,
) -> list[str]:
    """The run's last ``lines`` lines of output as ``spotbook logs`` shows them
    (``stream_logs``): its pod's log for a submitted run whose pod is still there, else
    its finished cells' outputs between papermill's --log-output separators, from the
    sealed records."""
    store = _store(run, context, namespace)
    record = store.job_record()  # checks run.json's seal where it is a Job's
    got: list[str] = []
    try:
        for event in _log_events(store, record, context, namespace):
            if event.kind == "no-pods":
                break
            if event.kind == "line":
                got.append(event.text)
    except (ClusterError, UsageError):
        got = []  # the Job is gone or out of reach: what the store kept
    if not got and record is not None:
        got = list(_stored_lines(store))
    return "".join(got).splitlines()[-lines:]


def _stored_lines(store: RunStore, follow: bool = False) -> Iterator[str]:
    """The run's cell outputs from its sealed records, as papermill's --log-output
    shows them (``follow``: as ``run_outputs``)."""
    from .._api import output_line

    for kind, content in run_outputs(store, follow=follow):
        line = output_line(kind, content)
        if line:
            yield line


@dataclass(frozen=True)
class LogEvent:
    """One thing ``stream_logs`` yields. ``line``: a line of the run's log, ending in a
    newline; ``pod``: the pod whose log follows (``all_pods``; text: its name);
    ``waiting``: for the run's pod to start (``follow``; yielded once); ``no-pods``: the
    Job has none (text: the sentence that says so, and where the notebook is)."""

    kind: Literal["line", "pod", "waiting", "no-pods"]
    text: str = ""


def stream_logs(
    run: str | RunStore,
    *,
    context: str | None = None,
    namespace: str | None = None,
    follow: bool = False,
    all_pods: bool = False,
    pod_wait: float = 600.0,
) -> Iterator[LogEvent]:
    """``spotbook logs``: a submitted run's log from its latest pod (every pod's, oldest
    first, with ``all_pods``), a run here's cell outputs between papermill's --log-output
    separators. ``follow``: go on while the run does (a submitted run's pod waited for up
    to ``pod_wait`` seconds while it is pending). Reads sealed records only."""
    store = _store(run, context, namespace)
    record = store.job_record()  # checks run.json's seal where it is a Job's
    yield from _log_events(store, record, context, namespace, follow, all_pods, pod_wait)


def _log_events(
    store: RunStore,
    record: dict[str, Any] | None,
    context: str | None,
    namespace: str | None,
    follow: bool = False,
    all_pods: bool = False,
    pod_wait: float = 600.0,
) -> Iterator[LogEvent]:
    """``stream_logs`` of the run in ``store`` whose Job record (``record``: None for a
    run here) was read and checked."""
    if record is None:
        for line in _stored_lines(store, follow):
            yield LogEvent("line", line)
        return
    run_id = store.require_run()["spec"]["run_id"]
    with cluster_for(context, namespace, record) as cluster:
        pods = cluster.pods(run_id)
        deadline = time.monotonic() + pod_wait
        waiting = follow and (not pods or pods[-1].get("status", {}).get("phase") == "Pending")
        if waiting:
            yield LogEvent("waiting")
        while waiting and time.monotonic() < deadline:
            time.sleep(2.0)  # a poll of the cluster for the pod's start
            pods = cluster.pods(run_id)
            waiting = not pods or pods[-1].get("status", {}).get("phase") == "Pending"
        if not pods:
            yield LogEvent(
                "no-pods",
                f"run {run_id} has no pods (not started yet, or removed after the Job "
                f"finished); its notebook is in {store.url}/output.ipynb",
            )
            return
        for pod in pods if all_pods else pods[-1:]:
            if all_pods:
                yield LogEvent("pod", pod["metadata"]["name"])
            for line in cluster.logs(pod["metadata"]["name"], follow=follow and pod is pods[-1]):
                yield LogEvent("line", line if line.endswith("\n") else line + "\n")


@dataclass
class RunListing:
    """What ``find_runs`` found under one place: runs, sweeps, and what could not be
    read (named, with why)."""

    where: str
    runs: list[RunReport]
    sweeps: list[Any]  # ops.sweep.SweepTable
    errors: list[str]


def find_runs(base: str, depth: int = 3) -> RunListing:
    """Every run store and sweep under ``base`` (a local folder or any fsspec URL, such as
    ``gs://bucket/runs``), in it or in its subfolders down to ``depth`` levels (a folder
    that is a run or a sweep is not looked into), each as ``run_status``/``sweep_status``
    give it."""
    listing = RunListing(base, [], [], [])
    try:
        fs, root = listing_fs(base)
    except Exception as exc:
        listing.errors.append(f"{base}: cannot list it ({exc})")
        return listing
    _find_under(fs, root, base.rstrip("/"), depth, listing)
    listing.runs.sort(key=lambda d: d["run_id"], reverse=True)  # newest first
    return listing


def _find_under(fs: Any, root: str, base: str, depth: int, listing: RunListing) -> None:

    try:
        entries = fs.ls(root, detail=True)
    except FileNotFoundError:
        return
    except Exception as exc:
        listing.errors.append(f"{base}: cannot list it ({exc})")
        return
    dirs = sorted(
        (str(e["name"]).rstrip("/") for e in entries if e.get("type") == "directory"),
        reverse=True,
    )
    for path in dirs:
        name = path.rsplit("/", 1)[-1]
        url = f"{base}/{name}"
        try:
            store = RunStore(url)
            if store.exists(SWEEP_FILE):
                listing.sweeps.append(sweep_status(url))
            elif store.exists("run.json"):
                listing.runs.append(describe(store))
            elif depth > 1 and (not name.startswith(".") or name == ".spotbook"):
                _find_under(fs, path, url, depth - 1, listing)
        except Exception as exc:
            listing.errors.append(f"{url}: {exc}")


@dataclass(frozen=True)
class ClusterJob:
    """One Job spotbook made, as the cluster lists it (``runs --cluster``)."""

    run: str  # the run's id (its Job's label), or the Job's name
    namespace: str
    state: str  # succeeded, failed, queued, active or pending
    failed_pods: int
    run_dir: str  # the store its annotation names ("" when it has none)
    created: str  # creationTimestamp, RFC 3339

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ClusterJobs:
    """The Jobs spotbook made in a namespace (or every one), oldest first."""

    context: str
    namespace: str
    all_namespaces: bool
    jobs: list[ClusterJob]


def cluster_jobs(
    context: str | None = None, namespace: str | None = None, all_namespaces: bool = False
) -> ClusterJobs:
    """The spotbook Jobs on the cluster with their live state, from the Jobs alone (no
    store is read: ``cluster_runs`` gives each run's own report)."""
    from ..kube.jobs import JobState, job_view
    from ..kube.manifest import LABEL_RUN

    with cluster_for(context, namespace) as cluster:
        listed = cluster.list_jobs(all_namespaces=all_namespaces)
    rows = []
    for job in sorted(listed, key=lambda j: j["metadata"].get("creationTimestamp") or ""):
        meta = job["metadata"]
        view = job_view(job, [])
        st = job.get("status") or {}
        state = (
            view["state"]
            if view["state"] in (JobState.SUCCEEDED, JobState.FAILED, JobState.QUEUED)
            else ("active" if st.get("active") else JobState.PENDING)
        )
        rows.append(
            ClusterJob(
                run=(meta.get("labels") or {}).get(LABEL_RUN, meta["name"]),
                namespace=meta.get("namespace", ""),
                state=str(state),
                failed_pods=int(st.get("failed", 0)),
                run_dir=(meta.get("annotations") or {}).get(ANNOTATION_RUN_DIR, ""),
                created=meta.get("creationTimestamp") or "",
            )
        )
    return ClusterJobs(cluster.context_name, cluster.namespace, all_namespaces, rows)


def cluster_runs(
    context: str | None = None, namespace: str | None = None, all_namespaces: bool = False
) -> RunListing:
    """The runs of the spotbook Jobs on the cluster, each read from the store its Job
    names, with the Job's live state (``run_status``)."""
    listing = RunListing("cluster", [], [], [])
    try:
        with cluster_for(context, namespace) as cluster:
            listing.where = f"cluster {cluster.context_name}/{cluster.namespace}"
            jobs = cluster.list_jobs(all_namespaces=all_namespaces)
            view = cluster_view(cluster=cluster)
            for job in jobs:
                meta = job.get("metadata") or {}
                url = (meta.get("annotations") or {}).get(ANNOTATION_RUN_DIR)
                if not url:
                    continue
                try:
                    doc = describe(RunStore(url), cluster=view)
                except Exception as exc:
                    listing.errors.append(f"Job {meta.get('name')}: {url}: {exc}")
                    continue
                _live_status(doc)
                listing.runs.append(doc)
    except (ClusterError, UsageError) as exc:
        listing.errors.append(f"cluster: {exc}")
    return listing


# -- runs on this machine -------------------------------------------------------------
@dataclass(frozen=True)
class LocalRunner:
    """The process on this machine that runs a run's current attempt."""

    run_id: str
    url: str
    pid: int
    attempt: int


def local_runner(store: RunStore) -> LocalRunner:
    """The runner of ``store``'s current attempt on this machine, proven to be it before
    anyone signals it: the attempt record (sealed: checked with this machine's key) names
    its host, boot and pid, and that process holds open the file every runner keeps for
    its run (:func:`runner_mark`), so a record naming another process is refused."""
    from ..attempt.environment import boot_id

    run = store.unseal()
    run_id = str(run["spec"]["run_id"])
    attempts = store.attempts()
    current = attempts[-1] if attempts else {}
    if current.get("outcome") != Outcome.RUNNING:
        raise UsageError(
            f"run {run_id} is not running on this machine (status "
            f"{describe(store)['status']}): nothing to stop or disrupt (`spotbook resume "
            f"{store.url}` continues a stopped run)"
        )
    here = boot_id()
    if current.get("host") != socket.gethostname() or (
        current.get("boot_id") and here and current.get("boot_id") != here
    ):
        raise UsageError(
            f"run {run_id} runs on another machine ({current.get('host')}, or before this "
            "machine restarted): stop it there"
        )
    pid = current.get("pid")
    if not isinstance(pid, int) or pid <= 1 or not alive(pid) or not _holds(pid, run_id):
        raise UsageError(
            f"run {run_id} is not running: the process its attempt {current.get('attempt')} "
            f"names (pid {pid}) is not its runner (killed without notice?); `spotbook resume "
            f"{store.url}` continues it"
        )
    return LocalRunner(run_id=run_id, url=store.url, pid=pid, attempt=int(current["attempt"]))


def _holds(pid: int, run_id: str) -> bool:
    """Whether process ``pid`` holds the run's mark file open."""
    fds = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return False
    for name in names:
        try:
            target = os.readlink(os.path.join(fds, name))
        except OSError:
            continue
        if os.path.basename(target) == runner_mark(run_id):
            return True
    return False


def run_grace(run: dict[str, Any]) -> float:
    """The --grace a run was started with (run.json's spec), else the default."""
    from .._models import Limits

    return float((run["spec"].get("limits") or {}).get("grace", Limits().grace))


def stop_local_run(run: str | RunStore, timeout: float) -> tuple[LocalRunner, bool]:
    """Stop a run running on this machine as Ctrl-C would (the user's stop: progress
    saved, resumable, no preemption counted); wait up to ``timeout`` seconds for its
    runner to end. Returns the runner and whether it ended."""
    store = _store(run, None, None)
    runner = local_runner(store)
    os.kill(runner.pid, signal.SIGINT)
    deadline = time.monotonic() + timeout
    rel = f"attempts/{runner.attempt:04d}.json"
    while time.monotonic() < deadline:
        ended = (store.read_json(rel) or {}).get("outcome") != Outcome.RUNNING
        if ended or not alive(runner.pid):
            return runner, True
        time.sleep(0.1)  # a poll of the runner's record: the period decides nothing
    return runner, False


def run_outputs(run: str | RunStore, follow: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
    """A run's cell outputs from its store's records, in cell order, as ``(kind,
    content)`` with a start and an end item around each cell (papermill's --log-output
    separators); with ``follow``, waits for the cells still to come while an attempt
    runs. Reads sealed records only."""
    from ..attempt.cells import CELL_END, CELL_START

    store = _store(run, None, None)
    store.unseal()
    shown = -1
    while True:
        records, _ = store.records_and_notes()
        # an attempt commits its cells in order: what is new comes after what was shown
        for index in sorted(i for i in records if i > shown):
            record = records[index]
            yield CELL_START, {"index": index}
            # text cut at --max-output-bytes is shown whole, as the cell printed it (read
            # from the store and checked against its sealed record), where its first
            # stream output was
            full = store.spilled_text(record)
            for out in record.get("outputs") or []:
                if not isinstance(out, dict):
                    continue
                if full is not None and out.get("output_type") == "stream":
                    if full:
                        yield "stream", {"output_type": "stream", "name": "stdout", "text": full}
                    full = ""
                    continue
                yield str(out.get("output_type", "")), out
            yield CELL_END, {"index": index}
            shown = index
        if not follow:
            return
        # running: an attempt says so and its runner lives (one killed without notice on
        # this machine is seen as killed, and there is nothing more to wait for)
        if describe(store)["status"] != RunStatus.RUNNING:
            records, _ = store.records_and_notes()
            if not any(i > shown for i in records):
                return
            continue
        time.sleep(0.5)  # a poll of the store for the next record


# -- every run this user made ----------------------------------------------------------
def started_at(doc: RunReport) -> float | None:
    """When the run's first attempt began (None before any did)."""
    times = [float(a["started"]) for a in doc["attempts"] if a.get("started")]
    return min(times) if times else None


def run_seconds(doc: RunReport, now: float | None = None) -> float | None:
    """From the first attempt's start to the last one's end (or now, while it runs)."""
    first = started_at(doc)
    if first is None:
        return None
    ends = [float(a.get("ended") or 0.0) for a in doc["attempts"]]
    running = doc["attempts"][-1].get("outcome") == Outcome.RUNNING
    end = (now or time.time()) if running else max(ends, default=0.0)
    return max(0.0, end - first) if end else None


def list_runs(
    base: str = ".", *, status: str | None = None, since: float | None = None
) -> RunListing:
    """Every run this user made on this machine, newest first: those under
    ``base/.spotbook/runs`` and those the index of runs names (``--run-dir`` runs, sweep
    points, submitted runs, library calls, wherever their stores are); ``status`` keeps
    those with that status, ``since`` those whose first attempt began at or after that
    time (a ``time.time()`` value). A store that cannot be read is named in ``errors``."""
    from .._status import local_run_dirs
    from ..store.index import indexed_runs, name_of

    listing = RunListing("this machine", [], [], [])
    seen: set[str] = set()
    urls = local_run_dirs(os.path.abspath(base)) + [str(e["url"]) for e in indexed_runs()]
    for url in urls:
        if url in seen:
            continue
        seen.add(url)
        try:
            store = RunStore(url)
            if not store.exists("run.json"):
                continue  # deleted since: nothing to list
            listing.runs.append(describe(store))
        except Exception as exc:  # a store out of reach or broken: named, not fatal
            listing.errors.append(f"{url}: {exc}")
    for doc in listing.runs:
        name = name_of(doc["run_dir"], doc["run_id"])
        if name is not None:
            doc["name"] = name
    if status is not None:
        listing.runs = [d for d in listing.runs if d["status"] == status]
    if since is not None:
        listing.runs = [d for d in listing.runs if (started_at(d) or 0.0) >= since]
    listing.runs.sort(key=lambda d: d["run_id"], reverse=True)
    return listing


@dataclass(frozen=True)
class Removed:
    """A run whose store ``remove_run`` deleted."""

    run_id: str
    url: str


def _removable(doc: RunReport, submitted: bool) -> None:
    """Refuse (UsageError) to delete a run that runs, or whose Job may still start it."""
    live = doc["status"] == RunStatus.RUNNING or (
        submitted and doc["status"] in (RunStatus.PENDING, RunStatus.INTERRUPTED)
    )
    if live:
        raise UsageError(
            f"run {doc['run_id']} is {doc['status']}: stop it first (`spotbook cancel "
            f"{doc['run_dir']}`), then remove it"
        )


def remove_run(run: str | RunStore) -> Removed:
    """Delete a run's store (never one that runs, nor a submitted one its Job may still
    start) and its entry in the index of runs."""
    from ..store.index import forget_run

    store = _store(run, None, None)
    doc = describe(store)
    _removable(doc, store.exists(JOB_RECORD))
    store.delete()
    forget_run(doc["run_id"])
    return Removed(run_id=doc["run_id"], url=store.url)


def gc_runs(
    *, keep: int | None = None, older_than: float | None = None, dry_run: bool = False
) -> tuple[list[Removed], list[str]]:
    """Delete the runs ``list_runs`` finds beyond a retention rule: all but the newest
    ``keep``, and (if given) only those whose first attempt began ``older_than`` seconds
    ago or more; never a running one. Returns what was (with ``dry_run``: would be)
    removed, and what could not be (named, with why)."""
    if keep is None and older_than is None:
        raise UsageError("gc needs a retention rule: --keep N, --older-than DURATION, or both")
    if keep is not None and keep < 0:
        raise UsageError("--keep must be zero or more")
    now = time.time()
    listing = list_runs()
    done: list[Removed] = []
    skipped = list(listing.errors)
    for n, doc in enumerate(listing.runs):
        if keep is not None and n < keep:
            continue
        first = started_at(doc)
        if older_than is not None and first is not None and now - first < older_than:
            continue
        if doc["status"] == RunStatus.RUNNING:
            skipped.append(f"{doc['run_id']}: running")
            continue
        if dry_run:
            done.append(Removed(run_id=doc["run_id"], url=doc["run_dir"]))
            continue
        try:
            done.append(remove_run(RunStore(doc["run_dir"])))
        except SpotbookError as exc:
            skipped.append(f"{doc['run_id']}: {exc}")
    return done, skipped


def wait_for_job(
    submitted: Submitted,
    *,
    say: Callable[[str], None] | None = None,
    cluster: Cluster | None = None,
) -> int:
    """Follow the Job until it ends, saying what happens (pods scheduled, preempted,
    replaced); returns the run's exit code as ``spotbook run`` would have it."""
    from .._status import describe
    from ..kube.jobs import follow, job_view

    tell = say or log.info
    client = cluster or cluster_for(submitted.context, submitted.namespace)
    run_id = submitted.run_id
    store = RunStore(submitted.url)
    record = store.job_record() or {}
    policy = FallbackPolicy(**(record.get("fallback_policy") or {}))
    done = bool(record.get("fallback"))

    def view() -> dict[str, Any]:
        nonlocal done
        current = job_view(client.get_job(run_id), client.pods(run_id), client.node_ready)
        why = None if done or not policy.active else policy.reason(current, time.time())
        if why is not None and current.get("state") not in ENDED_STATES:
            done = True
            tell(f"falling back to on-demand nodes: {why}")
            name = fall_back(client, store, why)
            tell(f"Job {name} recreated on on-demand nodes; the run resumes there")
            current = job_view(client.get_job(run_id), client.pods(run_id), client.node_ready)
        return current

    try:
        code = follow(view, lambda: client.watch_job(run_id), tell)
    finally:
        if cluster is None:
            client.close()
    if store.exists("run.json"):
        doc = describe(store)
        tell(f"run {run_id} {doc['status']}: {doc['cells_done']}/{doc['cells_total']} cells")
    else:  # a sweep
        counts = sweep_status(submitted.url).counts()
        tell(f"sweep {run_id}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return int(code)


def wait_run(
    run: str,
    *,
    context: str | None = None,
    namespace: str | None = None,
    say: Callable[[str], None] | None = None,
) -> int:
    """``spotbook wait``: follow a submitted run's (or sweep's) Job until it ends, as
    ``wait_for_job`` does; a run not submitted is a UsageError that says where it is."""
    store = open_run(run, context=context, namespace=namespace)
    record = job_record(store)  # sealed: checks run.json's seal first
    run_id = store.require_run()["spec"]["run_id"] if store.exists("run.json") else ""
    submitted = Submitted(
        run_id=run_id or str((record.get("options") or {}).get("run_id") or ""),
        url=store.url,
        job=str(record.get("job") or ""),
        namespace=str(record.get("namespace") or ""),
        context=context or str(record.get("context") or ""),
        manifest={},
    )
    return wait_for_job(submitted, say=say)
