"""Capacity fallback for submitted runs: when spot capacity keeps failing the run — too
many preemptions, or a pod pending too long for a spot node — its next attempt runs on
on-demand nodes. The Job is replaced by the same Job on on-demand capacity (same name,
same run store, so the new pod resumes the run); the old pod gets its notice and saves
first. Whoever follows the run applies the policy: ``submit --wait`` and ``spotbook
wait RUN`` (which can be started again at any time: the policy is in the run store).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import UsageError
from .._models import epoch
from ..kube.jobs import PodState
from ..kube.manifest import JobOptions, build_job
from ..store.runstore import RunStore

if TYPE_CHECKING:
    from ..kube.cluster import Cluster


@dataclass(frozen=True)
class FallbackPolicy:
    """When a spot run's Job is remade on on-demand nodes."""

    after_preemptions: int | None = None
    after_pending: float | None = None  # seconds a pod may wait for a spot node

    def __post_init__(self) -> None:
        if self.after_preemptions is not None and self.after_preemptions < 1:
            raise UsageError("--fallback-after-preemptions must be 1 or more")
        if self.after_pending is not None and self.after_pending <= 0:
            raise UsageError("--fallback-after-pending must be a positive duration")

    @property
    def active(self) -> bool:
        return self.after_preemptions is not None or self.after_pending is not None

    def reason(self, view: dict[str, Any], now: float) -> str | None:
        """Why the run should fall back now, from the Job's view; None: not (yet)."""
        if self.after_preemptions is not None:
            n = int(view.get("preemptions") or 0)
            if n >= self.after_preemptions:
                return f"{n} preemptions (--fallback-after-preemptions {self.after_preemptions})"
        if self.after_pending is not None:
            pods = view.get("pods") or []
            if pods and pods[-1].get("state") == PodState.PENDING:
                since = epoch(pods[-1].get("created"))
                if since is not None and now - since >= self.after_pending:
                    return (
                        f"pod {pods[-1]['name']} waited {now - since:.0f} s for a spot node "
                        f"(--fallback-after-pending {self.after_pending:g} s)"
                    )
        return None


def options_to_json(opts: JobOptions) -> dict[str, Any]:
    """The Job's options as JSON, for job.json."""
    return dataclasses.asdict(opts)


def options_from_json(doc: dict[str, Any]) -> JobOptions:
    """The Job's options from job.json's JSON."""
    fields = {f.name for f in dataclasses.fields(JobOptions)}
    data = {k: v for k, v in doc.items() if k in fields}
    for key in ("env", "secret_env", "env_from_secrets"):
        if key in data:
            data[key] = tuple(tuple(x) if isinstance(x, list) else x for x in data[key])
    return JobOptions(**data)


def fall_back(cluster: Cluster, store: RunStore, reason: str, wait: float = 120.0) -> str:
    """Replace the run's spot Job by the same Job on on-demand nodes; recorded in the
    store's job.json (``fallback``). Returns the new Job's name."""
    record = store.job_record() or {}
    if "options" not in record:
        raise UsageError(f"the run in {store.url} was submitted without its Job's options")
    opts = dataclasses.replace(options_from_json(record["options"]), spot=False)
    run_id = opts.run_id
    record["fallback"] = {"at": time.time(), "reason": reason, "capacity": "on-demand"}
    store.write_job_record(record)
    cluster.delete_job(run_id)  # its pod gets the notice and saves its progress
    deadline = time.monotonic() + wait
    while cluster.get_job(run_id) is not None and time.monotonic() < deadline:
        time.sleep(1.0)  # the API server is removing the old Job
    manifest = build_job(opts)
    cluster.create_job(manifest)
    return str(manifest["metadata"]["name"])
