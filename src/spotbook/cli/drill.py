"""spotbook drill: preempt a run on purpose and follow its recovery."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import time
from typing import TYPE_CHECKING, Any

from .._errors import (
    SpotbookError,
    UsageError,
)
from .._models import (
    Limits,
)
from .._status import ClusterView, describe
from ..kube.jobs import JOB_RECORD
from ..store.runstore import RunStore
from .cluster import _cluster_for, _cluster_view, _open_run
from .plans import _PlanStepError
from .run import _run_runner
from .status import _print_downtime

if TYPE_CHECKING:
    from ..kube.cluster import Cluster

log = logging.getLogger("spotbook")


def _say(line: str) -> None:
    print(f"spotbook: {line}", file=sys.stderr, flush=True)


def _cmd_drill(args: argparse.Namespace) -> int:
    store = _open_run(args)
    run = store.require_run()
    record = store.read_json(JOB_RECORD)
    attempts = store.attempts()
    last = max((int(a.get("attempt") or 0) for a in attempts), default=0)
    if record is not None:
        cluster = _cluster_for(args, record)
        _drill_cluster(cluster, run["spec"]["run_id"], args)
        return _report_recovery(store, last, args.timeout, None, _cluster_view(args, cluster))
    took = _drill_local(store, run, attempts, args)
    if args.no_resume:
        return 0
    _say("resuming, as the Job controller would")
    _run_runner(store, args)
    return _report_recovery(store, last, 0.0, took)


def _drill_local(
    store: RunStore, run: dict[str, Any], attempts: list[dict[str, Any]], args: argparse.Namespace
) -> float:
    import signal
    import socket

    from .._models import SAVE_BUDGET
    from .._status import alive

    current = attempts[-1] if attempts else {}
    pid = int(current.get("pid") or 0)
    if (
        current.get("outcome") != "running"
        or current.get("host") != socket.gethostname()
        or not pid
        or not alive(pid)
    ):
        raise UsageError(
            f"run {run['spec']['run_id']} is not running on this machine (status "
            f"{run.get('status')}); start it with `spotbook run` or `spotbook resume`, then drill"
        )
    from ..attempt.environment import process_started

    recorded, now = current.get("process_started"), process_started(pid)
    if recorded is not None and now is not None and abs(float(recorded) - now) > 2.0:
        # the runner died and its pid was reused: never signal a stranger
        raise UsageError(
            f"run {run['spec']['run_id']} is not running: its runner (pid {pid}) is gone and "
            "that pid now belongs to another process; resume the run with `spotbook resume`"
        )
    grace = float((run["spec"].get("limits") or {}).get("grace", Limits().grace))
    n = int(current["attempt"])
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    _say(f"sent SIGTERM to the runner (pid {pid}, attempt {n})")
    budget = grace + SAVE_BUDGET + 5.0

    def running() -> bool:
        rec = store.read_json(f"attempts/{n:04d}.json") or {}
        return alive(pid) and rec.get("outcome") == "running"

    while running() and time.monotonic() - t0 < budget:
        time.sleep(0.05)
    took = time.monotonic() - t0
    if running():
        os.kill(pid, signal.SIGKILL)
        _say(f"the runner did not stop within {budget:.0f} s: sent SIGKILL")
    else:
        _say(f"the runner stopped {took:.2f} s after the notice")
    return took


def _drill_cluster(cluster: Cluster, run_id: str, args: argparse.Namespace) -> None:
    import subprocess

    from ..kube.jobs import pod_view

    views = [pod_view(p) for p in cluster.pods(run_id)]
    live = [v for v in views if v["state"] == "running"]
    if not live:
        states = ", ".join(f"{v['name']} {v['state']}" for v in views) or "no pods"
        raise UsageError(f"run {run_id} has no running pod to disrupt ({states})")
    pod = live[-1]
    if args.how == "evict":
        cluster.evict(pod["name"])
        _say(f"evicted pod {pod['name']} on {pod['node']} through the Eviction API")
        return
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
    cmd = [
        "gcloud",
        "compute",
        "instances",
        "simulate-maintenance-event",
        instance,
        f"--zone={zone}",
        f"--project={project}",
    ]
    print(shlex.join(cmd))
    if not args.yes:
        raise _DrillNotRun("printed the command above; run it (or pass --yes) to cause the event")
    if subprocess.run(cmd, check=False).returncode != 0:
        raise _PlanStepError(f"`{shlex.join(cmd)}` failed; see its message above")


class _DrillNotRun(SpotbookError):
    """Nothing was disrupted: the command to do it was printed (exit 0)."""


def _recovered(doc: dict[str, Any], before: int) -> list[dict[str, Any]]:
    """Preemptions since attempt ``before`` whose next attempt runs new cells (or has
    ended): until then its figures are not final."""
    attempts = {a.get("attempt"): a for a in doc["attempts"]}
    out = []
    for e in doc["downtime"]["preemptions"]:
        b = attempts.get(e["next_attempt"]) or {}
        if e["attempt"] >= before and (
            b.get("resumed_at") is not None or b.get("outcome") != "running"
        ):
            out.append(e)
    return out


def _report_recovery(
    store: RunStore,
    before: int,
    timeout: float,
    stopped_in: float | None,
    cluster: ClusterView | None = None,
) -> int:
    """Wait until an attempt after ``before`` runs new cells (or the run ends); report."""
    deadline = time.monotonic() + timeout
    told = False
    while True:
        doc = describe(store, cluster=cluster)
        events = _recovered(doc, before)
        done = doc["status"] in ("succeeded", "failed", "cancelled")
        if events or done or time.monotonic() > deadline:
            break
        if not told:
            _say("following the run until it runs new cells again")
            told = True
        time.sleep(1.0)
    if not events:
        if done:
            _say(f"the run {doc['status']} without another attempt; nothing to report")
            return 0
        raise _PlanStepError(
            f"no new attempt of the run within {timeout:.0f} s; see `spotbook status {store.url}`"
        )
    event = events[0]
    if stopped_in is not None:
        event["sigterm_to_exit_seconds"] = round(stopped_in, 3)
    _print_downtime({"preemptions": [event], "totals": {"preemptions": 0, "gpu_seconds": 0}})
    print(json.dumps({"drill": event}, indent=2))
    return 0
