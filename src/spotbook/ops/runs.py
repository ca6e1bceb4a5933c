"""Find a run wherever it is, and say where it stands: its store, and its Job when it
was submitted (``spotbook status``, ``cancel``, ``recover``)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import RunNotFoundError, UsageError
from .._models import RunStatus
from .._status import ClusterView, RunReport, describe
from ..kube.jobs import CANCELLED, JOB_RECORD, LIVE_STATES
from ..kube.manifest import ANNOTATION_RUN_DIR
from ..store.runstore import RunStore, is_url, resolve_run

if TYPE_CHECKING:
    from ..kube.cluster import Cluster

# what the store says while the cluster may know better (the pod is pending, queued...)
_STORE_UNSETTLED = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.INTERRUPTED)


def cluster_for(
    context: str | None = None,
    namespace: str | None = None,
    record: dict[str, Any] | None = None,
) -> Cluster:
    """The cluster client: the context and namespace given, else the run's Job record's,
    else the kubeconfig's."""
    from ..kube.cluster import Cluster

    record = record or {}
    return Cluster(
        context=context or record.get("context"),
        namespace=namespace or record.get("namespace") or "",
    )


def open_run(run: str, *, context: str | None = None, namespace: str | None = None) -> RunStore:
    """The run store of ``run``: a URL, a local run (path or id), or (by id) a Job on the
    cluster whose annotation names its store."""
    store = RunStore(resolve_run(run))
    if store.exists("run.json") or is_url(run) or os.sep in run:
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


def job_record(store: RunStore) -> dict[str, Any]:
    """What ``submit`` recorded about the run's Job; a UsageError for a local run."""
    record = store.read_json(JOB_RECORD)
    if record is None:
        raise UsageError(
            f"the run in {store.url} was not submitted to a cluster; its notebook is in "
            f"{store.url}/output.ipynb (`spotbook status {store.url}`)"
        )
    assert isinstance(record, dict)
    return record


def cluster_view(
    context: str | None = None,
    namespace: str | None = None,
    cluster: Cluster | None = None,
) -> ClusterView:
    """``describe``'s window on the cluster: the Job and its pods, or the error that kept
    them from view; through ``cluster`` when the caller holds one."""
    from ..kube.cluster import ClusterError
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
    live = (doc.get("cluster") or {}).get("state")
    if doc["status"] in _STORE_UNSETTLED and live in LIVE_STATES:
        doc["status"] = live
    return doc


@dataclass(frozen=True)
class Cancelled:
    """A cancelled run: its Job deleted, its store keeping everything done so far."""

    run_id: str
    url: str
    job: str


def cancel_run(
    run: str | RunStore, *, context: str | None = None, namespace: str | None = None
) -> Cancelled:
    """Delete a submitted run's Job and mark the run cancelled (a worker will not start
    it again)."""
    from ..kube.cluster import ClusterError

    store = _store(run, context, namespace)
    run_id = store.require_run()["spec"]["run_id"]
    record = job_record(store)
    with cluster_for(context, namespace, record) as cluster:
        if cluster.get_job(run_id) is None:
            raise ClusterError(
                f"run {run_id} has no Job in namespace {cluster.namespace!r}: it has finished "
                "and been cleaned up, or was cancelled already"
            )
        store.write_json(CANCELLED, {"at": time.time(), "by": os.environ.get("USER", "")})
        cluster.delete_job(run_id)
    return Cancelled(run_id=run_id, url=store.url, job=str(record.get("job") or run_id))


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
    run_id = store.require_run()["spec"]["run_id"]
    with cluster_for(context, namespace, job_record(store)) as cluster:
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
