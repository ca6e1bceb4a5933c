"""Runs as Kubernetes Jobs: where a Job and its pods stand, and following one to its end.

Pure views over the Job and pod objects (``job_view``, ``pod_view``) and the follow
loop; the cluster calls are in ``kube/cluster.py`` and the manifest in
``kube/manifest.py``.
"""

from __future__ import annotations

import contextlib
import enum
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from .._models import (
    EXIT_CELL_ERROR,
    EXIT_OK,
    EXIT_STOPPED,
    EXIT_STORAGE,
    EXIT_TIMEOUT,
    epoch,
)
from .manifest import LABEL_QUEUE


class PodState(enum.StrEnum):
    """A pod of the run as ``status`` shows it."""

    PENDING = "pending"  # not scheduled yet, or pulling its image
    RUNNING = "running"
    TERMINATING = "terminating"  # deleted, inside its grace
    STUCK = "stuck"  # Terminating past its grace on a node that is down (`spotbook recover`)
    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"  # ended with the DisruptionTarget condition (spot reclaim, drain)
    STOPPED = "stopped"  # exited 75: stopped on a notice after saving progress
    FAILED = "failed"


class JobState(enum.StrEnum):
    """The run's Job, merged from its conditions and its pods."""

    GONE = "gone"  # deleted: finished and cleaned up (TTL), or cancelled
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    QUEUED = "queued"  # suspended: Kueue has not admitted it
    RUNNING = "running"
    STUCK = "stuck"
    RETRYING = "retrying"  # a pod was preempted or failed; the Job makes another
    PENDING = "pending"


# what the Job's view can tell while the run store has nothing more settled to say
LIVE_STATES = (JobState.PENDING, JobState.QUEUED, JobState.RETRYING, JobState.RUNNING)
ENDED_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.GONE)  # no pod will run again


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return dict(c)
    return None


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return dict(term)
    return None


# A pod whose deletion is this far past its grace, on a node that is not Ready, is stuck:
# only the node's kubelet can confirm it stopped.
STUCK_AFTER = 30


def _stuck(
    pod: dict[str, Any], node_ready: Callable[[str], bool | None] | None, now: float
) -> tuple[str, str]:
    """("stuck", why) for a Terminating pod on a dead node; ("terminating", why) when
    the node cannot be read; ("", "") otherwise."""
    meta, node = pod["metadata"], (pod.get("spec") or {}).get("nodeName")
    gone_at = epoch(meta.get("deletionTimestamp"))  # the deletion time plus the grace
    if node_ready is None or not node or gone_at is None or now < gone_at + STUCK_AFTER:
        return "", ""
    ready = node_ready(node)
    if ready:
        return "", ""
    if ready is None:
        return PodState.TERMINATING, (
            f"Terminating {now - gone_at:.0f} s past its grace on node {node}; this account "
            "may not read nodes (`kubectl auth can-i get nodes`), so whether the node is "
            "down is unknown; if it is, `spotbook recover RUN` deletes the pod"
        )
    return PodState.STUCK, (
        f"stuck Terminating for {now - gone_at:.0f} s past its grace on node {node}, which is "
        "not Ready: only that node's kubelet can confirm the pod stopped, and the Job starts "
        "no replacement until then (podReplacementPolicy: Failed). `spotbook recover RUN` "
        "deletes it with grace 0 (safe: the run store's fence refuses the old attempt if "
        "the node comes back); or, if the node is shut down for good, taint it "
        "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
    )


def pod_view(
    pod: dict[str, Any],
    node_ready: Callable[[str], bool | None] | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """One pod as status shows it: pending / running / preempted / stopped / failed / ...
    With ``node_ready`` a Terminating pod on a dead node shows as ``stuck``."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    term = _terminated(pod)
    scheduled = _condition(pod, "PodScheduled") or {}
    view: dict[str, Any] = {
        "name": pod["metadata"]["name"],
        "node": (pod.get("spec") or {}).get("nodeName"),
        "phase": phase,
        "created": pod["metadata"].get("creationTimestamp"),
        # when the scheduler bound it to a node (after any node was added for it): the
        # downtime report splits waiting for a node from pulling the image with it
        "scheduled": scheduled.get("lastTransitionTime"),
        "exit_code": term.get("exitCode") if term else None,
    }
    disrupted = _condition(pod, "DisruptionTarget")
    if phase == "Pending":
        unsched = next(
            (
                c
                for c in status.get("conditions") or []
                if c.get("type") == "PodScheduled" and c.get("status") == "False"
            ),
            None,
        )
        view["state"] = PodState.PENDING
        if unsched:
            view["reason"] = (
                f"waiting for a node: {unsched.get('message') or unsched.get('reason')}"
            )
    elif phase == "Running":
        deleted = pod["metadata"].get("deletionTimestamp")
        view["state"] = PodState.TERMINATING if deleted else PodState.RUNNING
        state, why = _stuck(pod, node_ready, time.time() if now is None else now)
        if state:  # past its grace on a node that is down, or that cannot be read
            view["state"], view["reason"], view["past_grace"] = state, why, True
    elif phase == "Succeeded":
        view["state"] = PodState.SUCCEEDED
    elif disrupted:
        view["state"] = PodState.PREEMPTED
        view["reason"] = disrupted.get("reason") or disrupted.get("message")
    elif view["exit_code"] == EXIT_STOPPED:
        view["state"] = PodState.STOPPED
    else:
        view["state"] = PodState.FAILED
        if term:
            view["reason"] = term.get("reason")
    return view


def job_view(
    job: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    node_ready: Callable[[str], bool | None] | None = None,
) -> dict[str, Any]:
    """The Job's state, merged from its conditions and its pods."""
    views = [pod_view(p, node_ready) for p in pods]
    out: dict[str, Any] = {"pods": views}
    if job is None:
        out["state"] = JobState.GONE
        return out
    out["job"] = job["metadata"]["name"]
    out["namespace"] = job["metadata"].get("namespace")
    interrupted = [v for v in views if v["state"] in (PodState.PREEMPTED, PodState.STOPPED)]
    out["preemptions"] = len(interrupted)
    failed = _condition(job, "Failed")
    if _condition(job, "Complete"):
        out["state"] = JobState.SUCCEEDED
    elif failed:
        out["state"] = JobState.FAILED
        out["reason"] = failed.get("reason")
        out["message"] = failed.get("message")
    elif (job.get("spec") or {}).get("suspend"):
        out["state"] = JobState.QUEUED
        queue_name = (job["metadata"].get("labels") or {}).get(LABEL_QUEUE)
        out["reason"] = (
            f"waiting for Kueue to admit it from LocalQueue {queue_name} "
            f"(`kubectl get workloads -n {out['namespace']}` shows why)"
            if queue_name
            else "the Job is suspended (spec.suspend); nothing starts until it is resumed"
        )
    elif views and views[-1]["state"] == PodState.RUNNING:
        out["state"] = JobState.RUNNING
    elif views and views[-1]["state"] == PodState.STUCK:
        out["state"] = JobState.STUCK
        out["reason"] = f"pod {views[-1]['name']} {views[-1]['reason']}"
    elif interrupted or any(v["state"] == PodState.FAILED for v in views):
        out["state"] = JobState.RETRYING
    else:
        out["state"] = JobState.PENDING
    if views:
        out["current_pod"] = views[-1]["name"]
        out["node"] = views[-1]["node"]
    return out


def exit_code_of(view: dict[str, Any]) -> int | None:
    """The code ``submit --wait`` exits with once the Job has finished (None: not yet)."""
    state = view.get("state")
    if state == JobState.SUCCEEDED:
        return EXIT_OK
    if state == JobState.GONE:
        return EXIT_STOPPED  # deleted: cancelled; its pod saved progress on SIGTERM
    if state != JobState.FAILED:
        return None
    if view.get("reason") == "DeadlineExceeded":
        return EXIT_TIMEOUT
    if view.get("reason") in ("FailedIndexes", "MaxFailedIndexesExceeded"):
        return EXIT_CELL_ERROR  # points of a sweep failed (the others ran on)
    codes = [p["exit_code"] for p in view["pods"] if p.get("exit_code") is not None]
    if view.get("reason") == "PodFailurePolicy" and codes:
        return int(codes[-1])
    return EXIT_STORAGE


def describe_pod(v: dict[str, Any]) -> str:
    """One line for a pod's view: its state, node, exit code and reason."""
    text = f"pod {v['name']} {v['state']}"
    if v.get("node"):
        text += f" on {v['node']}"
    if v.get("exit_code") is not None and v["state"] != PodState.RUNNING:
        text += f" (exit {v['exit_code']})"
    if v.get("reason"):
        text += f": {v['reason']}"
    return text


def follow(
    get_view: Callable[[], dict[str, Any]],
    events: Callable[[], Any],
    say: Callable[[str], None],
    poll: float = 5.0,
    timeout: float | None = None,
) -> int:
    """Report a Job's pods as they change until it finishes; return the exit code.

    ``events`` is an iterator of watch events on the Job (run in a thread); pods are
    looked at again on every event and at least every ``poll`` seconds.
    """
    wake: queue.Queue[object] = queue.Queue()
    failure: list[BaseException] = []

    def pump() -> None:
        try:
            for event in events():
                wake.put(event)
        except BaseException as exc:  # reported by the main loop
            failure.append(exc)
            wake.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: dict[str, str] = {}
    last_state = ""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        view = get_view()
        for v in view["pods"]:
            line = describe_pod(v)
            if seen.get(v["name"]) != line:
                seen[v["name"]] = line
                say(line)
        if view["state"] != last_state:
            last_state = view["state"]
            why = f": {view['reason']}" if view.get("reason") else ""
            say(f"job {view.get('job', '')} {last_state}{why}".replace("  ", " "))
        code = exit_code_of(view)
        if code is not None:
            return code
        if failure:
            raise failure[0]
        if end is not None and time.monotonic() > end:
            raise TimeoutError("gave up following the Job")
        with contextlib.suppress(queue.Empty):
            wake.get(timeout=poll)
