"""spotbook's cluster commands over HTTP against a stateful fake Kubernetes API server
(tests/fakekube.py, its own process on loopback). The test plays the Job controller and
the kubelet; the "pods" are real `spotbook worker` processes on a real run store."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spotbook.store.runstore import RunStore

from .conftest import cli, kill, start_cli, wait_for
from .servers import FakeKube

pytestmark = pytest.mark.slow


def submit_args(rd: str, *extra: str) -> list[str]:
    return [
        "submit",
        "sleepy.ipynb",
        "--run-dir",
        rd,
        "--image",
        "img:1",
        "--gpu",
        "nvidia-l4",
        "--grace",
        "0.5",
        *extra,
    ]


def pod(name: str, run_id: str, phase: str, node: str | None = None, **status: Any) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"spotbook.dev/run-id": run_id, "job-name": f"sb-{run_id}"},
        },
        "spec": {
            "containers": [{"name": "notebook", "image": "img:1"}],
            **({"nodeName": node} if node else {}),
        },
        "status": {"phase": phase, **status},
    }


def terminated(code: int) -> list[dict[str, Any]]:
    """containerStatuses of a pod whose notebook container exited with ``code``."""
    reason = "Error" if code else "Completed"
    return [
        {
            "name": "notebook",
            "image": "img:1",
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": reason}},
        }
    ]


def disrupted(name: str, run_id: str, node: str, reason: str) -> dict[str, Any]:
    """A pod that stopped with exit 75 and the DisruptionTarget condition."""
    condition = {"type": "DisruptionTarget", "status": "True", "reason": reason}
    return pod(
        name, run_id, "Failed", node=node, conditions=[condition], containerStatuses=terminated(75)
    )


def worker(
    work: Path, rd: str, pod_name: str, node: str, kube: FakeKube, stopped: bool = False
) -> subprocess.Popen:
    """A pod's worker process. ``stopped``: one the test stops part-way (SIGTERM), on any
    machine: sleepy.ipynb's cell 3 waits for a gate file that is never made."""
    gate = {"SB_GATE": str(work / "gate-never-made")} if stopped else {}
    return start_cli(
        "worker",
        cwd=work,
        env={
            **kube.env,
            "SPOTBOOK_RUN_DIR": rd,
            "POD_NAME": pod_name,
            "NODE_NAME": node,
            "POD_NAMESPACE": "default",
            "SPOTBOOK_IMAGE": "img:1",
            **gate,
        },
    )


def status(work: Path, rd: str, kube: FakeKube) -> dict[str, Any]:
    r = cli("status", rd, "--json", cwd=work, env=kube.env)
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def test_submit_creates_the_job_and_freezes_the_run(work: Path, kube: FakeKube) -> None:
    rd = f"file://{work}/runs/r1"
    r = cli(*submit_args(rd, "-p", "n", "3"), cwd=work, env=kube.env)
    assert r.returncode == 0, r.stderr
    (job,) = kube.objects("jobs")
    store = RunStore(rd)
    run_id = store.require_run()["spec"]["run_id"]
    assert job["metadata"]["name"] == f"sb-{run_id}"
    assert job["metadata"]["annotations"]["spotbook.dev/run-dir"] == rd
    assert job["spec"]["podFailurePolicy"]["rules"][0]["action"] == "Ignore"
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert store.read_json("job.json")["namespace"] == "default"
    assert store.read_json("job.json")["context"] == "fake"
    assert f"spotbook status {rd}" in r.stderr
    # the same run again: the Job exists, and the message says what to do
    again = cli(*submit_args(rd, "-p", "n", "3"), cwd=work, env=kube.env)
    assert again.returncode == 3
    assert "already exists" in again.stderr and "Traceback" not in again.stderr


def test_preempted_pod_is_replaced_and_wait_reports_it(work: Path, kube: FakeKube) -> None:
    """Running -> Failed with DisruptionTarget -> a new pod -> Complete, followed by
    `submit --wait`, with `status`, `logs` and `runs --cluster` checked on the way."""
    rd = f"file://{work}/runs/story"
    waiter = start_cli(*submit_args(rd, "--wait"), cwd=work, env=kube.env)
    wait_for(lambda: kube.objects("jobs"), timeout=60, what="the Job")
    run_id = RunStore(rd).require_run()["spec"]["run_id"]
    job = f"sb-{run_id}"

    kube.put(
        "pods",
        pod(
            "p1",
            run_id,
            "Pending",
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu",
                }
            ],
        ),
    )
    assert status(work, rd, kube)["status"] == "pending"
    kube.put("pods", pod("p1", run_id, "Running", node="gke-spot-1"))
    kube.set_status("jobs", "default", job, {"active": 1})
    w1 = worker(work, rd, "p1", "gke-spot-1", kube, stopped=True)
    wait_for(lambda: len(RunStore(rd).cell_records()) >= 2, timeout=60, what="2 cells")
    kube.log("default", "p1", "tick 0", "tick 1")
    doc = status(work, rd, kube)
    assert doc["status"] == "running" and doc["cluster"]["node"] == "gke-spot-1"

    # the node is reclaimed: SIGTERM, the runner saves and exits 75, the pod fails with
    # a DisruptionTarget condition, which the Job's policy ignores
    code, err = kill(w1, signal.SIGTERM)
    assert code == 75, err
    kube.put("pods", disrupted("p1", run_id, "gke-spot-1", "TerminationByKubelet"))
    kube.set_status("jobs", "default", job, {"active": 0})
    doc = status(work, rd, kube)
    assert doc["status"] == "retrying"
    assert doc["cluster"]["preemptions"] == 1
    assert doc["cluster"]["pods"][0]["state"] == "preempted"
    text = cli("status", rd, cwd=work, env=kube.env).stdout
    assert "pod p1 preempted on gke-spot-1 (exit 75): TerminationByKubelet" in text

    kube.put("pods", pod("p2", run_id, "Running", node="gke-spot-2"))
    kube.set_status("jobs", "default", job, {"active": 1})
    w2 = worker(work, rd, "p2", "gke-spot-2", kube)
    _, err = w2.communicate(timeout=120)
    assert w2.returncode == 0, err
    kube.log("default", "p2", "tick 2", "done")
    kube.put(
        "pods", pod("p2", run_id, "Succeeded", node="gke-spot-2", containerStatuses=terminated(0))
    )
    kube.set_status(
        "jobs",
        "default",
        job,
        {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]},
    )
    _, werr = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, werr
    for line in (
        "pod p1 pending: waiting for a node",
        "pod p1 running on gke-spot-1",
        "pod p1 preempted on gke-spot-1",
        "pod p2 running on gke-spot-2",
        "succeeded",
        "9/9 cells",
    ):
        assert line in werr, (line, werr)

    doc = status(work, rd, kube)
    assert doc["status"] == "succeeded" and doc["preemptions"] == 1
    assert [a["pod"] for a in doc["attempts"]] == ["p1", "p2"]
    logs = cli("logs", rd, cwd=work, env=kube.env)
    assert logs.returncode == 0 and logs.stdout == "tick 2\ndone\n", logs
    every = cli("logs", rd, "--all", cwd=work, env=kube.env).stdout
    assert every.index("==> pod p1") < every.index("tick 0") < every.index("==> pod p2")
    listing = cli("runs", "--cluster", cwd=work, env=kube.env)
    assert run_id in listing.stdout and "succeeded" in listing.stdout
    rows = json.loads(cli("runs", "--cluster", "--json", cwd=work, env=kube.env).stdout)
    # the preempted pod is not counted as failed (the failure policy ignores a disruption)
    assert [(r["run"], r["state"], r["failed_pods"]) for r in rows] == [(run_id, "succeeded", 0)]

    # the dashboard finds it through its Job, and shows the pod's log
    from spotbook.view.dashboard import Sources, create_app

    with pytest.MonkeyPatch.context() as mp:
        for k, v in kube.env.items():
            mp.setenv(k, v)
        client = create_app(Sources(local=False, cluster=True)).test_client()
        (place,) = client.get("/api/runs").get_json()
        assert place["where"] == "cluster fake/default" and not place["errors"]
        assert [(r["run_id"], r["status"]) for r in place["runs"]] == [(run_id, "succeeded")]
        assert place["runs"][0]["cluster"]["job"] == job
        page = client.get(f"/run/{place['runs'][0]['key']}").get_data(as_text=True)
        assert "tick 2\ndone" in page and "gke-spot-2" in page


def test_wait_exits_with_the_runs_code_when_the_job_fails(work: Path, kube: FakeKube) -> None:
    rd = f"file://{work}/runs/fail"
    waiter = start_cli(*submit_args(rd, "--wait"), cwd=work, env=kube.env)
    wait_for(lambda: kube.objects("jobs"), timeout=60, what="the Job")
    run_id = RunStore(rd).require_run()["spec"]["run_id"]
    kube.put("pods", pod("p1", run_id, "Failed", node="n1", containerStatuses=terminated(1)))
    kube.expire_watches()  # the watch must survive a 410 Gone and list again
    wait_for(lambda: kube.state()["gone"] >= 1, timeout=30, what="a watch answered 410")
    relists = sum(1 for q in kube.state()["requests"] if q.startswith("GET") and "watch" not in q)
    wait_for(
        lambda: sum(1 for q in kube.state()["requests"] if "watch=true" in q) >= 2,
        timeout=30,
        what="a new watch after the 410",
    )
    assert relists >= 1
    kube.set_status(
        "jobs",
        "default",
        f"sb-{run_id}",
        {
            "failed": 1,
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "PodFailurePolicy",
                    "message": "Container notebook for pod default/p1 failed with exit code 1",
                }
            ],
        },
    )
    _, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 1, err
    assert "job sb-" in err and "failed" in err


def test_logs_follow_streams_until_the_pod_ends(work: Path, kube: FakeKube) -> None:
    rd = f"file://{work}/runs/logs"
    assert cli(*submit_args(rd), cwd=work, env=kube.env).returncode == 0
    run_id = RunStore(rd).require_run()["spec"]["run_id"]
    pending = cli("logs", rd, cwd=work, env=kube.env)
    assert pending.returncode == 0 and "no pods" in pending.stderr
    kube.put("pods", pod("p1", run_id, "Running", node="n1"))
    follower = start_cli("logs", rd, "-f", cwd=work, env=kube.env)
    kube.log("default", "p1", "one")
    # "two" is logged once the follower is following (its request reached the server)
    wait_for(
        lambda: any("/pods/p1/log" in q and "follow=true" in q for q in kube.state()["requests"]),
        timeout=60,
        what="the follow request",
    )
    kube.log("default", "p1", "two")
    kube.put("pods", pod("p1", run_id, "Succeeded", node="n1", containerStatuses=terminated(0)))
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    assert out == "one\ntwo\n"


def test_cancel_deletes_the_job_and_the_worker_refuses_to_start(work: Path, kube: FakeKube) -> None:
    rd = f"file://{work}/runs/cancel"
    assert cli(*submit_args(rd), cwd=work, env=kube.env).returncode == 0
    run_id = RunStore(rd).require_run()["spec"]["run_id"]
    kube.put("pods", pod("p1", run_id, "Running", node="n1"))
    r = cli("cancel", rd, cwd=work, env=kube.env)
    assert r.returncode == 0, r.stderr
    assert kube.objects("jobs") == [] and kube.objects("pods") == []
    assert any(
        "DELETE /apis/batch/v1/namespaces/default/jobs/sb-" in q for q in kube.state()["requests"]
    )
    doc = status(work, rd, kube)
    assert doc["status"] == "cancelled" and doc["cluster"]["state"] == "gone"
    w = cli("worker", cwd=work, env={**kube.env, "SPOTBOOK_RUN_DIR": rd})
    assert w.returncode == 2 and "cancelled" in w.stderr
    again = cli("cancel", rd, cwd=work, env=kube.env)
    assert again.returncode == 3 and "no Job" in again.stderr


def test_a_changed_or_moved_job_record_is_refused_before_the_cluster_is_touched(
    work: Path, kube: FakeKube
) -> None:
    """job.json says where the Job is and how to make it again (the fallback recreates it
    with the user's credentials): a writer of the store who changes it (another image,
    service account, namespace) or puts another run's there gets exit 2 naming it from
    `wait`, `cancel`, `logs`, `status`, `drill` and `recover`, and the cluster is neither
    asked to delete nor to create anything."""
    rd, other = f"file://{work}/runs/a", f"file://{work}/runs/b"
    for where in (rd, other):
        r = cli(*submit_args(where, "--fallback-after-preemptions", "1"), cwd=work, env=kube.env)
        assert r.returncode == 0, r.stderr
    record = Path(work, "runs", "a", "job.json")
    sealed = record.read_bytes()
    doc = json.loads(sealed)
    assert doc["mac"] and doc["key_id"]
    doc["options"]["image"] = "evil:1"
    doc["options"]["service_account"] = "cluster-admin"
    doc["namespace"] = "kube-system"
    changed = json.dumps(doc).encode()
    moved = Path(work, "runs", "b", "job.json").read_bytes()
    for forged in (changed, moved):
        record.write_bytes(forged)
        before = len(kube.state()["requests"])
        for argv in (["wait", rd], ["cancel", rd], ["logs", rd], ["status", rd],
                     ["drill", rd], ["recover", rd]):  # fmt: skip
            r = cli(*argv, cwd=work, env=kube.env)
            assert r.returncode == 2, (argv, r.stderr)
            assert "job.json" in r.stderr and "integrity check" in r.stderr, (argv, r.stderr)
        writes = [
            q for q in kube.state()["requests"][before:] if q.split()[0] in ("POST", "DELETE")
        ]
        assert writes == [], writes
    assert {j["spec"]["template"]["spec"]["containers"][0]["image"]
            for j in kube.objects("jobs")} == {"img:1"}  # fmt: skip
    record.write_bytes(sealed)  # the record as submit wrote it: followed as before
    assert cli("status", rd, cwd=work, env=kube.env).returncode == 0


def test_status_by_run_id_finds_the_job_on_the_cluster(work: Path, kube: FakeKube) -> None:
    rd = f"file://{work}/runs/byid"
    assert cli(*submit_args(rd), cwd=work, env=kube.env).returncode == 0
    run_id = RunStore(rd).require_run()["spec"]["run_id"]
    doc = json.loads(cli("status", run_id, "--json", cwd=work, env=kube.env).stdout)
    assert doc["run_dir"] == rd and doc["cluster"]["job"] == f"sb-{run_id}"
    missing = cli("status", "20200101-000000-000000", cwd=work, env=kube.env)
    assert missing.returncode == 2 and "no run" in missing.stderr


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (
            {
                "method": "POST",
                "path": "/jobs",
                "status": 403,
                "times": 1,
                "message": 'jobs.batch is forbidden: User "tester" cannot create resource "jobs"',
            },
            "kubectl auth can-i create jobs",
        ),
        (
            {
                "method": "POST",
                "path": "/jobs",
                "status": 500,
                "times": 1,
                "message": "etcdserver: request timed out",
            },
            "the API server failed",
        ),
        (
            {
                "method": "POST",
                "path": "/jobs",
                "status": 401,
                "times": 1,
                "message": "Unauthorized",
            },
            "refresh them",
        ),
        (
            {
                "method": "POST",
                "path": "/jobs",
                "status": 502,
                "times": 1,
                "message": "upstream connect error",
                "html": True,
            },
            "Bad Gateway (HTTP 502); the API server failed",
        ),
    ],
)
def test_api_errors_on_submit_say_what_to_do(
    work: Path, kube: FakeKube, fault: dict[str, Any], message: str
) -> None:
    kube.fault(**fault)
    r = cli(*submit_args(f"file://{work}/runs/err"), cwd=work, env=kube.env)
    assert r.returncode == 3, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    # the server answered the dry run so: no run store was made (a resubmit is clean)
    assert "(a dry run)" in r.stderr and not (work / "runs" / "err").exists()


def test_a_job_the_api_server_refuses_leaves_nothing_behind(work: Path, kube: FakeKube) -> None:
    """Admission (a policy webhook, a quota) refuses what no local check can know: the
    server-side dry run asks before the store, the key Secret or the Job is written."""
    denied = (
        'admission webhook "gpu-policy.example.com" denied the request: '
        "GPU Jobs need the label team"
    )
    kube.fault("POST", "/jobs", 422, times=1, message=denied, reason="Invalid")
    posts = len(kube.state()["requests"])
    rd = work / "runs" / "refused"
    r = cli(*submit_args(f"file://{rd}"), cwd=work, env=kube.env)
    assert r.returncode == 3, r.stderr
    assert denied in r.stderr and "the API server refused the manifest" in r.stderr, r.stderr
    assert not rd.exists()
    new = [q for q in kube.state()["requests"][posts:] if q.startswith("POST")]
    assert len(new) == 1 and "dryRun=All" in new[0], new  # no Secret, no Job
    # accepted: the dry run of the Job as it will be, then the Job itself
    seen = len(kube.state()["dry_runs"])
    r = cli(*submit_args(f"file://{rd}"), cwd=work, env=kube.env)
    assert r.returncode == 0, r.stderr
    (checked,) = kube.state()["dry_runs"][seen:]
    run_id = RunStore(f"file://{rd}").require_run()["spec"]["run_id"]
    assert checked.startswith("jobs/default/sb-") and checked != f"jobs/default/sb-{run_id}"
    assert f"jobs/default/sb-{run_id}" in kube.state()["objects"]


def test_a_queued_run_says_kueue_holds_it(work: Path, kube: FakeKube) -> None:
    rd = f"file://{work}/runs/queued"
    r = cli(*submit_args(rd, "--queue", "team-a"), cwd=work, env=kube.env)
    assert r.returncode == 0, r.stderr
    (job,) = kube.objects("jobs")
    assert job["spec"]["suspend"] is True
    assert status(work, rd, kube)["status"] == "queued"
    text = cli("status", rd, cwd=work, env=kube.env).stdout
    assert "waiting for Kueue to admit it from LocalQueue team-a" in text


def test_transient_500_on_reads_is_retried(work: Path, kube: FakeKube) -> None:
    rd = f"file://{work}/runs/retry"
    assert cli(*submit_args(rd), cwd=work, env=kube.env).returncode == 0
    kube.fault("GET", "/jobs/sb-", 500, times=2)
    kube.fault("GET", "/pods", 503, times=1, html=True)  # a load balancer's page
    doc = status(work, rd, kube)
    assert doc["cluster"]["state"] == "pending"
    assert "error" not in doc["cluster"]


def test_unknown_namespace_and_missing_config(work: Path, kube: FakeKube) -> None:
    r = cli(*submit_args(f"file://{work}/runs/ns", "--namespace", "nope"), cwd=work, env=kube.env)
    assert r.returncode == 3 and 'namespaces "nope" not found' in r.stderr
    r = cli(*submit_args(f"file://{work}/runs/ns2", "--context", "fake-ml"), cwd=work, env=kube.env)
    assert r.returncode == 0, r.stderr
    assert [j["metadata"]["namespace"] for j in kube.objects("jobs")] == ["ml"]
    r = cli(
        *submit_args(f"file://{work}/runs/none"),
        cwd=work,
        env={"KUBECONFIG": str(work / "missing"), "HOME": str(work)},
    )
    assert r.returncode == 2 and "KUBECONFIG" in r.stderr
    assert not (work / "runs" / "none").exists()  # nothing written before the check


def test_submit_keeps_secrets_in_secrets(work: Path, kube: FakeKube) -> None:
    """The run key goes to the pod through a Secret that submit creates (then reuses);
    --secret-env is a reference; --env with a secret-looking name warns; no secret value
    is in the Job, its annotations, the run store or the notebook."""
    rd = f"file://{work}/runs/sec"
    r = cli(
        *submit_args(rd),
        "--secret-env",
        "AWS_SECRET_ACCESS_KEY=aws-creds:secret-key",
        "--env",
        "HF_TOKEN=hf-plain-value",
        cwd=work,
        env=kube.env,
    )
    assert r.returncode == 0, r.stderr
    assert "--env HF_TOKEN=... puts its value in the Job spec" in r.stderr
    assert "hf-plain-value" not in r.stderr
    (secret,) = kube.objects("secrets")
    assert secret["metadata"]["name"] == "spotbook-run-key"
    key = base64.b64decode(secret["data"]["key"])
    from spotbook.store.integrity import load_key

    assert key == load_key().secret  # made from this machine's key: it can resume here
    (job,) = kube.objects("jobs")
    text = json.dumps(job)
    assert key.decode() not in text and "secretKeyRef" in text
    assert key.decode() not in json.dumps(job["metadata"].get("annotations", {}))
    for p in Path(work, "runs", "sec").rglob("*"):
        if p.is_file():
            assert key not in p.read_bytes(), p
    # a second submit reuses the Secret, even when this machine's key differs
    other = {**kube.env, "SPOTBOOK_SNAPSHOT_KEY": "another-machine" * 3}
    r = cli(*submit_args(f"file://{work}/runs/sec2"), cwd=work, env=other)
    assert r.returncode == 0, r.stderr
    assert len(kube.objects("secrets")) == 1
    # ... and seals that run with the Secret's key, which the pod will have
    env = {**os.environ, "SPOTBOOK_SNAPSHOT_KEY": key.decode()}
    store = RunStore(f"file://{work}/runs/sec2")
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        store.unseal()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_worker_in_a_pod_without_the_run_key_says_how(work: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "SPOTBOOK_RUN_DIR": f"file://{work}/x"}
    r = cli("worker", cwd=work, env=env)
    assert r.returncode == 2 and "kubectl create secret generic" in r.stderr, r.stderr


def test_a_pod_stuck_terminating_on_a_dead_node_is_named_and_recovered(
    work: Path, kube: FakeKube
) -> None:
    """The node died without a graceful shutdown: its pod stays Terminating (only its
    kubelet could confirm it stopped), and with podReplacementPolicy Failed no replacement
    starts. `status` says so with the remedy; `recover` deletes the pod with grace 0."""
    rd = f"file://{work}/runs/stuck"
    assert cli(*submit_args(rd), cwd=work, env=kube.env).returncode == 0
    run_id = RunStore(rd).require_run()["spec"]["run_id"]
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gke-spot-9"},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
    }
    kube.put("nodes", node)
    gone = "2026-01-01T00:00:00Z"  # its deletion (plus its grace) is long past
    stuck = pod("p1", run_id, "Running", node="gke-spot-9")
    stuck["metadata"].update(deletionTimestamp=gone, deletionGracePeriodSeconds=16)
    kube.put("pods", stuck)
    r = cli("status", rd, cwd=work, env=kube.env)
    assert r.returncode == 0, r.stderr
    assert "cluster  stuck" in r.stdout and "not Ready" in r.stdout, r.stdout
    assert "spotbook recover RUN" in r.stdout and "out-of-service" in r.stdout
    doc = json.loads(cli("status", rd, "--json", cwd=work, env=kube.env).stdout)
    assert doc["cluster"]["state"] == "stuck"
    # a Terminating pod on a Ready node is only terminating: recover leaves it alone
    node["status"]["conditions"][0]["status"] = "True"
    kube.put("nodes", node)
    r = cli("recover", rd, cwd=work, env=kube.env)
    assert r.returncode == 0 and "no stuck pod" in r.stderr, r.stderr
    assert any("pods/p1" in q for q in kube.state()["requests"]) is False
    node["status"]["conditions"][0]["status"] = "Unknown"
    kube.put("nodes", node)
    r = cli("recover", rd, cwd=work, env=kube.env)
    assert r.returncode == 0 and "deleted pod p1" in r.stderr, r.stderr
    deletes = [q for q in kube.state()["requests"] if q.startswith("DELETE ") and "/pods/p1" in q]
    assert len(deletes) == 1 and "gracePeriodSeconds=0" in deletes[0], deletes
    assert "pods/default/p1" not in kube.state()["objects"]
    # an account that may not read nodes: status says what it cannot tell (not an
    # error for the whole cluster view), and recover still deletes the pod
    kube.put("pods", stuck)
    kube.fault("GET", "/nodes/gke-spot-9", 403, times=2)
    r = cli("status", rd, cwd=work, env=kube.env)
    assert r.returncode == 0 and "may not read nodes" in r.stdout, r.stdout
    r = cli("recover", rd, cwd=work, env=kube.env)
    assert r.returncode == 0 and "deleted pod p1" in r.stderr, r.stderr
