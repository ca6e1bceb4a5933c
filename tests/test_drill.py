"""Preemption drills and the downtime report: locally against a real runner process, and
on a "cluster" (the fake API server, with real worker processes as pods)."""

from __future__ import annotations

import datetime
import json
import math
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from spotbook.store.runstore import RunStore

from .conftest import (
    cells_committed,
    cli,
    kill,
    start_cli,
    wait_clock_past,
    wait_for,
    write_notebook,
)
from .servers import FakeKube
from .test_cluster import disrupted, pod, submit_args, terminated, worker

pytestmark = pytest.mark.slow
EPS = 0.05  # seconds: clocks of two processes read at different instants


def check_consistent(event: dict[str, Any], attempts: list[dict[str, Any]]) -> None:
    """The report's instants are ordered, its split adds up, and it matches the attempts."""
    order = ["last_progress_at", "next_started_at", "kernel_ready_at", "running_new_cells_at"]
    times = [event[k] for k in order]
    assert times == sorted(times), event
    if event["stopped_at"] is not None:
        assert event["last_progress_at"] <= event["stopped_at"] <= event["next_started_at"]
    if event["next_scheduled_at"] is not None:
        stopped = event["stopped_at"] or event["last_progress_at"]
        assert stopped <= event["next_scheduled_at"] <= event["next_started_at"]
    assert abs(sum(event["split"].values()) - event["gap_seconds"]) < 0.01
    before = next(a for a in attempts if a["attempt"] == event["attempt"])
    after = next(a for a in attempts if a["attempt"] == event["next_attempt"])
    assert before["started"] - EPS <= event["last_progress_at"] <= after["started"] + EPS
    assert event["next_started_at"] <= after["started"] + EPS
    assert abs(event["running_new_cells_at"] - after["resumed_at"]) < 0.01
    assert event["split"]["state_restore"] >= 0 and event["redone_seconds"] >= 0


def test_local_drill_sigterms_resumes_and_reports(work: Path) -> None:
    rd, gate = work / "rd", work / "gate"
    # the run waits at cell 3 until the gate is made: the drill finds it running however
    # long its own start takes (on a loaded machine the run once finished first)
    runner = start_cli(
        "run", "sleepy.ipynb", "out.ipynb", "--run-dir", "rd", cwd=work,
        env={"SB_GATE": str(gate)},
    )  # fmt: skip
    wait_for(lambda: cells_committed(rd) >= 3, what="3 cells")
    proc = start_cli("drill", "rd", cwd=work)
    runner.wait(timeout=300)  # stopped by the drill's SIGTERM
    gate.touch()  # (for the resume, wherever its kernel gets its environment from)
    out, errors = proc.communicate(timeout=300)
    code, err = kill(runner, signal.SIGKILL)  # already gone: collect its exit status
    assert code == 75, err  # it stopped on the drill's SIGTERM
    assert proc.returncode == 0, errors
    assert "sent SIGTERM to the runner" in errors and "resuming" in errors
    drill = json.loads(out[out.index("{") :])["drill"]
    # it stopped on the SIGTERM (exit 75 above), not on the SIGKILL after the grace
    assert drill["how"] == "preempted" and drill["sigterm_to_exit_seconds"] > 0
    doc = json.loads(cli("status", "rd", "--json", cwd=work).stdout)
    assert doc["status"] == "succeeded" and doc["cells_done"] == 9
    (event,) = doc["downtime"]["preemptions"]
    check_consistent(event, doc["attempts"])
    assert event == {k: v for k, v in drill.items() if k != "sigterm_to_exit_seconds"}
    totals = doc["downtime"]["totals"]
    assert totals["preemptions"] == 1
    assert totals["wasted_seconds"] <= totals["attempt_seconds"]
    text = cli("status", "rd", cwd=work).stdout
    assert "preemption attempt 1 → 2 (preempted" in text and "state restore" in text


def test_downtime_of_a_run_killed_without_notice(work: Path) -> None:
    rd = work / "rd"
    runner = start_cli("run", "sleepy.ipynb", "--run-dir", "rd", cwd=work)
    wait_for(lambda: cells_committed(rd) >= 4, what="4 cells")
    kill(runner)  # SIGKILL: the node is gone, nothing is saved on the way out
    assert cli("resume", "rd", cwd=work).returncode == 0
    doc = json.loads(cli("status", "rd", "--json", cwd=work).stdout)
    (event,) = doc["downtime"]["preemptions"]
    assert event["how"] == "killed" and event["stopped_at"] is None
    check_consistent(event, doc["attempts"])
    assert "at an unknown time (killed without notice)" in cli("status", "rd", cwd=work).stdout


def test_downtime_when_the_first_cell_never_finished(work: Path) -> None:
    """Killed inside its first cell, the run has nothing to restore; the next attempt
    still marks when it went back to new cells, which the report and the drill use."""
    marker = work / "started"
    write_notebook(
        work / "first.ipynb",
        f"import os, time\nif not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close()\n    while True:  # held until the kill\n"
        "        time.sleep(0.01)",
        "x = 1",
    )
    runner = start_cli("run", "first.ipynb", "--run-dir", "rd", cwd=work)
    wait_for(marker.exists, what="the first cell running")
    kill(runner)
    assert cells_committed(work / "rd") == 0
    assert cli("resume", "rd", cwd=work).returncode == 0
    doc = json.loads(cli("status", "rd", "--json", cwd=work).stdout)
    (event,) = doc["downtime"]["preemptions"]
    check_consistent(event, doc["attempts"])
    assert doc["attempts"][1]["resumed_from"] == 0


def test_drill_refuses_a_run_that_is_not_running(work: Path) -> None:
    assert cli("run", "sleepy.ipynb", "--run-dir", "rd", cwd=work).returncode == 0
    r = cli("drill", "rd", cwd=work)
    assert r.returncode == 2 and "not running on this machine" in r.stderr


def test_cluster_drill_evicts_the_pod_and_follows_the_recovery(work: Path, kube: FakeKube) -> None:
    rd = f"file://{work}/runs/drill"
    assert cli(*submit_args(rd), cwd=work, env=kube.env).returncode == 0
    run_id = RunStore(rd).require_run()["spec"]["run_id"]
    kube.put("pods", pod("p1", run_id, "Running", node="gke-spot-1"))
    w1 = worker(work, rd, "p1", "gke-spot-1", kube, stopped=True)
    wait_for(lambda: len(RunStore(rd).cell_records()) >= 2, timeout=60, what="2 cells")

    drill = start_cli("drill", rd, "--timeout", "120", cwd=work, env=kube.env)
    wait_for(lambda: kube.state()["evictions"], timeout=60, what="the eviction")
    assert kube.state()["evictions"] == ["default/p1"]
    # what the kubelet and the Job controller do after an eviction
    code, err = kill(w1, signal.SIGTERM)
    assert code == 75, err
    kube.put("pods", disrupted("p1", run_id, "gke-spot-1", "EvictionByEvictionAPI"))
    # the replacement waits for a node, then is bound to one (the API's clock has whole
    # seconds: the bind is stamped a whole second after the stop) and pulls its image
    # before the worker process starts
    wait_clock_past(math.floor(time.time()) + 1.0)
    bound = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    condition = {
        "type": "PodScheduled",
        "status": "True",
        "lastTransitionTime": bound.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    kube.put("pods", pod("p2", run_id, "Running", node="gke-spot-2", conditions=[condition]))
    wait_clock_past(bound.timestamp() + 0.2)  # the image pull: the worker starts after it
    w2 = worker(work, rd, "p2", "gke-spot-2", kube)
    out, err = drill.communicate(timeout=120)
    assert drill.returncode == 0, err
    assert "evicted pod p1 on gke-spot-1 through the Eviction API" in err
    event = json.loads(out[out.index("{") :])["drill"]
    assert (event["node"], event["next_node"]) == ("gke-spot-1", "gke-spot-2")
    # waiting for a node ends when the pod is bound; the image pull counts as GPU time lost
    assert event["next_scheduled_at"] == bound.timestamp()
    _, err2 = w2.communicate(timeout=120)
    assert w2.returncode == 0, err2
    doc = json.loads(cli("status", rd, "--json", cwd=work, env=kube.env).stdout)
    (reported,) = doc["downtime"]["preemptions"]
    check_consistent(reported, doc["attempts"])
    assert event == reported  # the drill waited until the new pod ran new cells
    assert reported["next_scheduled_at"] == bound.timestamp()
    split = reported["split"]
    assert split["scheduling_and_node"] == round(bound.timestamp() - reported["stopped_at"], 3)
    assert doc["downtime"]["totals"]["gpu_seconds"] > 0  # the Job asked for one GPU
    assert "next pod on a node" in cli("status", rd, cwd=work, env=kube.env).stdout


def test_cluster_drill_maintenance_prints_the_gcloud_command(work: Path, kube: FakeKube) -> None:
    rd = f"file://{work}/runs/maint"
    assert cli(*submit_args(rd), cwd=work, env=kube.env).returncode == 0
    run_id = RunStore(rd).require_run()["spec"]["run_id"]
    kube.put(
        "nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "gke-spot-1",
                "labels": {"topology.kubernetes.io/zone": "us-central1-b"},
            },
            "spec": {"providerID": "gce://my-proj/us-central1-b/gke-spot-1"},
        },
    )
    kube.put("pods", pod("p1", run_id, "Running", node="gke-spot-1"))
    r = cli("drill", rd, "--how", "maintenance", cwd=work, env=kube.env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        "gcloud compute instances simulate-maintenance-event gke-spot-1 --zone=us-central1-b "
        "--project=my-proj"
    )
    assert kube.state()["evictions"] == []
    # an EKS node has no maintenance event to simulate: said, and nothing is printed to run
    kube.put(
        "nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "ip-10-0-1-5"},
            "spec": {"providerID": "aws:///us-west-2a/i-0abc"},
        },
    )
    kube.put("pods", pod("p1", run_id, "Running", node="ip-10-0-1-5"))
    r = cli("drill", rd, "--how", "maintenance", cwd=work, env=kube.env)
    assert r.returncode == 2 and "GKE only" in r.stderr and "--how evict" in r.stderr
    assert r.stdout == ""
    kube.put(
        "pods", pod("p1", run_id, "Succeeded", node="gke-spot-1", containerStatuses=terminated(0))
    )
    r = cli("drill", rd, cwd=work, env=kube.env)
    assert r.returncode == 2 and "no running pod to disrupt (p1 succeeded)" in r.stderr


def test_drill_never_signals_a_process_that_reused_the_runners_pid(work: Path) -> None:
    import socket
    import subprocess
    import sys

    from spotbook.attempt.environment import process_started

    assert cli("run", "sleepy.ipynb", "--run-dir", "rd", cwd=work).returncode == 0
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        store = RunStore(str(work / "rd"))
        rec = store.read_json("attempts/0001.json")
        started = process_started(stranger.pid)
        assert started is not None
        # the runner "was" this pid, but started long before the process that has it now
        rec.update(
            outcome="running", host=socket.gethostname(), pid=stranger.pid,
            process_started=started - 3600,
        )  # fmt: skip
        store.write_json("attempts/0001.json", rec)  # unsealed: refused by the seal
        r = cli("drill", "rd", cwd=work)
        assert r.returncode == 2 and "attempts/0001.json" in r.stderr, r.stderr
        assert stranger.poll() is None  # not signalled
        store.unseal()  # sealed with this machine's key, as the runner's own record is
        store.update_attempt(1, rec)
        r = cli("drill", "rd", cwd=work)
        assert r.returncode == 2 and f"(pid {stranger.pid}) is not its runner" in r.stderr
        assert stranger.poll() is None  # not signalled
    finally:
        stranger.kill()
        stranger.communicate()  # closes its stdin pipe too
