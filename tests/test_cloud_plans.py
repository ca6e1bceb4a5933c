"""Cluster setup plans: every gcloud command is accepted by the installed gcloud's own
parser (offline: with no account it stops at authentication, after parsing), kubectl
commands by kubectl's client-side dry run, and each provider's plan matches its
reviewed snapshot (tests/snapshots/; rewrite with SPOTBOOK_UPDATE_SNAPSHOTS=1)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from spotbook._cloud_plans import PlanOptions, eks_config, gke_down, gke_plan

from .conftest import cli

SNAPSHOTS = Path(__file__).parent / "snapshots"
GKE = PlanOptions(project="my-proj", location="us-central1-a", bucket="my-runs")
GKE_REGIONAL_T4 = PlanOptions(
    project="my-proj",
    location="europe-west4",
    bucket="b2",
    gpu="nvidia-tesla-t4",
    gpu_count=2,
    max_nodes=8,
    cluster="nb",
    namespace="ml",
)
needs_gcloud = pytest.mark.skipif(
    shutil.which("gcloud") is None, reason="gcloud is not installed on this machine"
)


def _gcloud(argv: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CLOUDSDK_CONFIG": str(tmp / "gcloud"),
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
    }
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)


def _parsed(r: subprocess.CompletedProcess[str]) -> bool:
    """gcloud exits 2 on argument errors; past parsing, with no account, 1 and says so."""
    return r.returncode == 1 and "account" in r.stderr.lower()


@needs_gcloud
@pytest.mark.parametrize("opts", [GKE, GKE_REGIONAL_T4], ids=["zonal-l4", "regional-t4"])
def test_gcloud_accepts_every_generated_command(opts: PlanOptions, tmp_path: Path) -> None:
    steps = gke_plan(opts) + gke_down(opts, delete_bucket=True)
    commands = [s.argv for s in steps] + [s.done_if for s in steps if s.done_if]
    checked = 0
    for argv in commands:
        if argv[0] != "gcloud":
            continue
        r = _gcloud(list(argv), tmp_path)
        assert _parsed(r), f"{shlex.join(argv)}\n{r.returncode}\n{r.stderr[-800:]}"
        checked += 1
    assert checked >= 14  # 10 commands and the 4 checks `up` runs before creating


@needs_gcloud
def test_the_gcloud_check_has_teeth(tmp_path: Path) -> None:
    bad = list(gke_plan(GKE)[2].argv)
    bad[bad.index("--spot")] = "--spot-instance"  # a flag gcloud does not have
    assert not _parsed(_gcloud(bad, tmp_path))
    wrong = [a.replace("count=1", "count=one") for a in gke_plan(GKE)[2].argv]
    assert not _parsed(_gcloud(wrong, tmp_path))


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_accepts_the_service_account_step(tmp_path: Path) -> None:
    step = next(s for s in gke_plan(GKE) if s.argv[:2] == ("kubectl", "create"))
    r = subprocess.run(
        [*step.argv, "--dry-run=client", "-o", "json"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "KUBECONFIG": str(tmp_path / "none")},
    )
    assert r.returncode == 0, r.stderr
    meta = json.loads(r.stdout)["metadata"]
    assert (meta["name"], meta["namespace"]) == ("spotbook-runner", "default")
    annotate = next(s for s in gke_plan(GKE) if s.argv[:2] == ("kubectl", "annotate"))
    (tmp_path / "sa.json").write_text(r.stdout)
    # the same arguments on the local object: kubectl parses them without a server
    local = [
        "kubectl",
        "annotate",
        "-f",
        str(tmp_path / "sa.json"),
        "--local",
        "-o",
        "json",
        *annotate.argv[4:],
    ]
    r2 = subprocess.run(local, capture_output=True, text=True, check=False)
    assert r2.returncode == 0, r2.stderr
    annotations = json.loads(r2.stdout)["metadata"]["annotations"]
    assert annotations == {
        "iam.gke.io/gcp-service-account": "spotbook-runner@my-proj.iam.gserviceaccount.com"
    }


def test_gke_plan_has_the_pools_the_recipe_needs() -> None:
    steps = {s.argv[1:4]: s.argv for s in gke_plan(GKE)}
    pool = steps[("container", "node-pools", "create")]
    assert "--spot" in pool and "--min-nodes=0" in pool and "--enable-autoscaling" in pool
    assert "--accelerator=type=nvidia-l4,count=1,gpu-driver-version=latest" in pool
    assert "--node-taints=cloud.google.com/gke-spot=true:NoSchedule" in pool
    assert "--workload-metadata=GKE_METADATA" in pool
    cluster = steps[("container", "clusters", "create")]
    assert "--workload-pool=my-proj.svc.id.goog" in cluster and "--spot" not in cluster
    binding = steps[("storage", "buckets", "add-iam-policy-binding")]
    assert "--role=roles/storage.objectUser" in binding  # not admin: objects in one bucket


def _snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("SPOTBOOK_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no snapshot {path}; create it with SPOTBOOK_UPDATE_SNAPSHOTS=1"
    assert text == path.read_text(), f"plan changed; review and update {path}"


@pytest.mark.parametrize(
    ("name", "args"),
    [
        (
            "gke-plan.txt",
            [
                "gke",
                "plan",
                "--project",
                "my-proj",
                "--zone",
                "us-central1-a",
                "--bucket",
                "my-runs",
            ],
        ),
        (
            "gke-plan-regional.txt",
            [
                "gke",
                "plan",
                "--project",
                "my-proj",
                "--region",
                "europe-west4",
                "--bucket",
                "b2",
                "--gpu",
                "nvidia-tesla-t4:2",
                "--max-nodes",
                "8",
                "--cluster",
                "nb",
                "--namespace",
                "ml",
            ],
        ),
        (
            "gke-down.txt",
            [
                "gke",
                "down",
                "--project",
                "my-proj",
                "--zone",
                "us-central1-a",
                "--yes",
                "--from",
                "9",
            ],
        ),
        ("eks-plan.txt", ["eks", "plan", "--region", "us-west-2", "--bucket", "my-runs"]),
        (
            "aks-plan.txt",
            [
                "aks",
                "plan",
                "--resource-group",
                "nb-rg",
                "--location",
                "eastus",
                "--bucket",
                "myruns",
            ],
        ),
    ],
)
def test_plan_snapshots(name: str, args: list[str], tmp_path: Path) -> None:
    r = cli(*args, cwd=tmp_path)
    if args[1] == "down":  # --from beyond the end: nothing runs, the plan still prints
        assert r.returncode == 2 and "the plan has 2 steps" in r.stderr
    else:
        assert r.returncode == 0, r.stderr
    _snapshot(name, r.stdout)


def test_eks_config_is_a_spot_gpu_group_from_zero() -> None:
    doc = yaml.safe_load(eks_config(PlanOptions(location="us-west-2", bucket="my-runs")))
    system, gpu = doc["managedNodeGroups"]
    assert "spot" not in system and system["minSize"] >= 1
    assert gpu["spot"] is True and gpu["minSize"] == 0
    assert gpu["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    (sa,) = doc["iam"]["serviceAccounts"]
    resources = {r for st in sa["attachPolicy"]["Statement"] for r in st["Resource"]}
    assert resources == {"arn:aws:s3:::my-runs", "arn:aws:s3:::my-runs/*"}


def test_plan_usage_errors(tmp_path: Path) -> None:
    r = cli("gke", "plan", "--zone", "us-central1-a", cwd=tmp_path)
    assert r.returncode == 2 and "--project" in r.stderr and "--bucket" in r.stderr
    r = cli(
        "gke",
        "plan",
        "--project",
        "p",
        "--zone",
        "us-central1-a",
        "--bucket",
        "b",
        "--gpu",
        "nvidia-h200",
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "--machine-type" in r.stderr


def _fake_gcloud(tmp_path: Path, script: str) -> tuple[dict[str, str], Path]:
    """A stand-in gcloud on PATH that records its calls, then runs ``script``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.txt"
    fake = bin_dir / "gcloud"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n{script}\n')
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, log


UP = ["gke", "up", "--project", "p", "--zone", "us-central1-a", "--bucket", "b", "--yes"]


def test_up_stops_at_the_first_failing_step_and_says_how_to_continue(tmp_path: Path) -> None:
    # nothing exists yet (every describe fails); the GPU pool's create fails
    env, log = _fake_gcloud(
        tmp_path,
        'case "$*" in *describe*) exit 1;; *"node-pools create"*) exit 4;; esac',
    )
    r = cli(*UP, cwd=tmp_path, env=env)
    assert r.returncode == 3, r.stderr
    assert "step 3 failed (exit 4)" in r.stderr and "--from 3" in r.stderr
    calls = [line.split()[:3] for line in log.read_text().splitlines()]
    assert calls == [
        ["services", "enable", "container.googleapis.com"],
        ["container", "clusters", "describe"],
        ["container", "clusters", "create"],
        ["container", "node-pools", "describe"],
        ["container", "node-pools", "create"],
    ]
    r = cli(*UP[:-1], cwd=tmp_path, env=env)  # no --yes and no terminal: nothing runs
    assert r.returncode == 2 and "--yes" in r.stderr
    assert len(log.read_text().splitlines()) == 5


def test_up_again_skips_what_exists(tmp_path: Path) -> None:
    # a first `up` made the cluster, the bucket and the Kubernetes service account
    exists = '"container clusters describe"*|"storage buckets describe"*|"get serviceaccount"*'
    script = f'case "$*" in {exists}) exit 0;; *describe*|get*) exit 1;; esac'
    env, log = _fake_gcloud(tmp_path, script)
    kubectl = tmp_path / "bin" / "kubectl"
    kubectl.write_text((tmp_path / "bin" / "gcloud").read_text())
    kubectl.chmod(0o755)
    r = cli(*UP, "--from", "2", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    for n in (2, 4, 9):
        assert f"step {n}: already done" in r.stderr
    creates = [line.split()[:2] for line in log.read_text().splitlines() if "create" in line]
    assert creates == [["container", "node-pools"], ["iam", "service-accounts"]]
    assert log.read_text().splitlines()[-1].startswith("annotate serviceaccount")
