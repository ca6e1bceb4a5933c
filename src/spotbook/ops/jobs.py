"""The Job a run's record names: ``job.json`` in the run store, written by ``submit``
and read by every command that follows the run on its cluster, and the cluster client it
points at."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from .._errors import UsageError
from ..store.runstore import RunStore
from .fallback import FallbackPolicy, options_to_json

if TYPE_CHECKING:
    from ..kube.cluster import Cluster
    from ..kube.manifest import JobOptions


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


def job_record(store: RunStore) -> dict[str, Any]:
    """What ``submit`` recorded about the run's Job; a UsageError for a local run."""
    record = store.job_record()
    if record is None:
        raise UsageError(
            f"the run in {store.url} was not submitted to a cluster; its notebook is in "
            f"{store.url}/output.ipynb (`spotbook status {store.url}`)"
        )
    assert isinstance(record, dict)
    return record


def new_job_record(
    cluster: Cluster, job: JobOptions, name: str, fallback: FallbackPolicy | None
) -> dict[str, Any]:
    """What the run store keeps about its Job: where it is, what it asked for (to make
    it again on on-demand nodes), and the fallback policy."""
    return {
        "context": cluster.context_name,
        "server": cluster.server,
        "namespace": cluster.namespace,
        "job": name,
        "provider": job.provider,
        "image": job.image,
        "gpu_count": job.gpu_count,
        "points": job.points,
        "submitted": time.time(),
        "options": options_to_json(job),
        "fallback_policy": dataclasses.asdict(fallback or FallbackPolicy()),
    }
