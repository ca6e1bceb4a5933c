"""Preempt a run on purpose and measure its recovery (``spotbook drill``).

A local run gets SIGTERM as a node's notice would give it (SIGKILL when it outlives its
grace and save budget), then is resumed here as the Job controller would resume it. A
submitted run's pod is evicted through the Eviction API, or on GKE its node gets a
simulated maintenance event. Either way the drill follows the run until an attempt
after the disruption runs new cells, and reports that preemption as the downtime
report measures it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import CommandFailedError, UsageError
from .._models import SAVE_BUDGET, Outcome, RunStatus, alive
from .._status import ClusterView, RunReport, describe
from ..store.runstore import RunStore
from .jobs import cluster_for
from .runs import _store, cluster_view

if TYPE_CHECKING:
    from ..attempt.context import RunnerOptions
    from ..attempt.runner import RunResult
    from ..kube.cluster import Cluster

log = logging.getLogger(__name__)

Say = Callable[[str], None]


@dataclass(frozen=True)
class DrillReport:
    """What a drill did and what the recovery cost."""

    run_id: str
    how: str  # "sigterm" (a local run), "evict" or "maintenance" (a submitted one)
    target: str  # "pid N" or "pod NAME on NODE"
    # False only for --how maintenance without yes: ``command`` was not run
    disrupted: bool = True
    command: tuple[str, ...] = ()  # the gcloud command of a maintenance event
    stopped_in: float | None = None  # local: seconds from SIGTERM to the runner's end
    killed: bool = False  # local: it outlived grace + save budget and got SIGKILL
    resumed: RunResult | None = None  # local: the resume that followed
    # the preemption as ``describe``'s downtime report has it; None when the run ended
    # without another attempt
    event: dict[str, Any] | None = None
    status: str = ""  # the run's status when the drill ended


def drill(
    run: str | RunStore,
    *,
    how: str = "evict",
    yes: bool = False,
    resume: bool = True,
    timeout: float = 1800.0,
    context: str | None = None,
    namespace: str | None = None,
    options: RunnerOptions | None = None,
    say: Say | None = None,
) -> DrillReport:
    """Disrupt ``run`` (see the module's text) and report its recovery.

    ``how``: for a submitted run, ``evict`` or ``maintenance`` (GKE; the gcloud command
    is run only with ``yes``). ``resume``: for a local run, resume it here after the stop
    (with ``options``). ``timeout``: how long to follow a submitted run's recovery.
    ``say``: progress lines (default: the log at INFO).
    """
    tell = say or log.info
    store = _store(run, context, namespace)
    spec = store.require_run()
    run_id = spec["spec"]["run_id"]
    record = store.job_record()
    attempts = store.attempts()
    last = max((int(a.get("attempt") or 0) for a in attempts), default=0)
    if record is not None:
        if how not in ("evict", "maintenance"):
            raise UsageError(f"drill --how must be evict or maintenance, not {how!r}")
        with cluster_for(context, namespace, record) as cluster:
            report = _drill_cluster(cluster, run_id, how, yes, tell)
            if not report.disrupted:
                return report
            view = cluster_view(cluster=cluster)
            event, status = _follow_recovery(store, last, timeout, tell, view)
        return _with(report, event=event, status=status)
    took, killed, pid = _drill_local(store, spec, tell)
    report = DrillReport(run_id, "sigterm", f"pid {pid}", stopped_in=took, killed=killed)
    if not resume:
        return _with(report, status=describe(store)["status"])
    tell("resuming, as the Job controller would")
    from ..attempt.runner import Runner

    result = Runner.open(store, options).run()
    event, status = _follow_recovery(store, last, 0.0, tell)
    if event is not None:
        event["sigterm_to_exit_seconds"] = round(took, 3)
    return _with(report, resumed=result, event=event, status=status)


def _with(report: DrillReport, **changes: Any) -> DrillReport:
    import dataclasses

    return dataclasses.replace(report, **changes)


def _drill_local(store: RunStore, run: dict[str, Any], say: Say) -> tuple[float, bool, int]:
    """SIGTERM the local runner and wait for it to stop: (seconds, killed, pid). The
    runner is found as ``cancel`` finds it: a sealed attempt record, and a process that
    holds the run's mark open (a pid in a record alone could name any process)."""
    from .runs import local_runner, run_grace

    runner = local_runner(store)
    pid = runner.pid
    grace = run_grace(run)
    n = runner.attempt
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    say(f"sent SIGTERM to the runner (pid {pid}, attempt {n})")
    budget = grace + SAVE_BUDGET + 5.0

    def running() -> bool:
        rec = store.read_json(f"attempts/{n:04d}.json") or {}
        return alive(pid) and rec.get("outcome") == Outcome.RUNNING

    while running() and time.monotonic() - t0 < budget:
        time.sleep(0.05)
    took = time.monotonic() - t0
    if running():
        os.kill(pid, signal.SIGKILL)
        say(f"the runner did not stop within {budget:.0f} s: sent SIGKILL")
        return took, True, pid
    say(f"the runner stopped {took:.2f} s after the notice")
    return took, False, pid


def _drill_cluster(cluster: Cluster, run_id: str, how: str, yes: bool, say: Say) -> DrillReport:
    from ..kube.jobs import PodState, pod_view

    views = [pod_view(p) for p in cluster.pods(run_id)]
    live = [v for v in views if v["state"] == PodState.RUNNING]
    if not live:
        states = ", ".join(f"{v['name']} {v['state']}" for v in views) or "no pods"
        raise UsageError(f"run {run_id} has no running pod to disrupt ({states})")
    pod = live[-1]
    target = f"pod {pod['name']} on {pod['node']}"
    if how == "evict":
        cluster.evict(pod["name"])
        say(f"evicted pod {pod['name']} on {pod['node']} through the Eviction API")
        return DrillReport(run_id, how, target)
    # GKE nodes are Compute Engine instances: spec.providerID is gce://PROJECT/ZONE/NAME
    where = cluster.provider_id(pod["node"])
    if not where.startswith("gce://"):
        kind = where.split(":", 1)[0] or "unknown"
        raise UsageError(
            f"--how maintenance simulates a Compute Engine maintenance event, which exists on "
            f"GKE only; node {pod['node']} is an {kind!r} node: use --how evict"
        )
    parts = where[len("gce://") :].split("/")
    if len(parts) != 3 or not all(parts):
        raise UsageError(f"node {pod['node']}: unexpected providerID {where!r}")
    project, zone, instance = parts
    cmd = (
        "gcloud",
        "compute",
        "instances",
        "simulate-maintenance-event",
        instance,
        f"--zone={zone}",
        f"--project={project}",
    )
    if not yes:
        return DrillReport(run_id, how, target, disrupted=False, command=cmd)
    import shlex

    if subprocess.run(cmd, check=False).returncode != 0:
        raise CommandFailedError(f"`{shlex.join(cmd)}` failed; see its message above")
    return DrillReport(run_id, how, target, command=cmd)


def _recovered(doc: RunReport, before: int) -> list[dict[str, Any]]:
    """Preemptions since attempt ``before`` whose next attempt runs new cells (or has
    ended): until then its figures are not final."""
    attempts = {a.get("attempt"): a for a in doc["attempts"]}
    out = []
    for e in doc["downtime"]["preemptions"]:
        b = attempts.get(e["next_attempt"]) or {}
        if e["attempt"] >= before and (
            b.get("resumed_at") is not None or b.get("outcome") != Outcome.RUNNING
        ):
            out.append(e)
    return out


def _follow_recovery(
    store: RunStore,
    before: int,
    timeout: float,
    say: Say,
    cluster: ClusterView | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """Wait until an attempt after ``before`` runs new cells, or the run ends: (the
    preemption, or None when it ended without another attempt; the run's status)."""
    deadline = time.monotonic() + timeout
    told = False
    while True:
        doc = describe(store, cluster=cluster)
        events = _recovered(doc, before)
        if events:
            return events[0], doc["status"]
        status = RunStatus.of(doc["status"])
        if status is not None and status.settled:
            say(f"the run {doc['status']} without another attempt; nothing to report")
            return None, doc["status"]
        if time.monotonic() > deadline:
            raise CommandFailedError(
                f"no new attempt of the run within {timeout:.0f} s; see "
                f"`spotbook status {store.url}`"
            )
        if not told:
            say("following the run until it runs new cells again")
            told = True
        time.sleep(1.0)
