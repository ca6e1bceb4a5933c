"""Cluster setup plans: every gcloud command is accepted by the installed gcloud's own
parser (offline: with no account it stops at authentication, after parsing), every az
command by the az CLI's where it is installed (opt-in), kubectl commands by kubectl's
client-side dry run, manifests by the Kubernetes schemas, machines by the GPU tables, and
each provider's plan matches its reviewed snapshot (tests/snapshots/; rewrite with
SPOTBOOK_UPDATE_SNAPSHOTS=1)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import utils as kv

from spotbook._errors import UsageError
from spotbook.kube import gpus as gpus
from spotbook.kube.plans import (
    PlanOptions,
    aks_device_plugin,
    aks_plan,
    eks_config,
    eks_plan,
    gke_down,
    gke_plan,
    image_for,
    submit_hint,
)

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
    node_locations=("europe-west4-a", "europe-west4-b"),
)
EKS = PlanOptions(location="us-west-2", bucket="my-runs")
AKS = PlanOptions(project="nb-rg", location="eastus", bucket="myruns")
PAIRS = [
    (cloud, g.name, n, machine)
    for g in gpus.GPUS
    for cloud, table in g.machines.items()
    for n, machine in table.items()
]
needs_gcloud = pytest.mark.skipif(
    shutil.which("gcloud") is None, reason="gcloud is not installed on this machine"
)


def _gcloud(argv: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CLOUDSDK_CONFIG": str(tmp / "gcloud"),
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "HOME": str(tmp),  # configure-docker writes ~/.docker/config.json
    }
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)


def _parsed(r: subprocess.CompletedProcess[str]) -> bool:
    """gcloud exits 2 on argument errors; past parsing, with no account, 1 and says so
    (configure-docker needs no account: it succeeds)."""
    if r.returncode == 0:
        return "Docker configuration file updated" in r.stderr
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
    assert checked >= 18  # 13 commands and the 5 checks `up` runs before creating


@needs_gcloud
@pytest.mark.parametrize(
    ("gpu", "count", "machine"),
    [(g, n, m) for c, g, n, m in PAIRS if c == "gke"],
    ids=lambda v: str(v),
)
def test_gcloud_accepts_the_gpu_pool_of_every_gke_machine(
    gpu: str, count: int, machine: str, tmp_path: Path
) -> None:
    opts = PlanOptions(**{**GKE.__dict__, "gpu": gpu, "gpu_count": count})
    (pool,) = [
        s.argv for s in gke_plan(opts) if s.argv[1:4] == ("container", "node-pools", "create")
    ]
    assert f"--machine-type={machine}" in pool
    assert f"--accelerator=type={gpu},count={count},gpu-driver-version=latest" in pool
    r = _gcloud(list(pool), tmp_path)
    assert _parsed(r), f"{shlex.join(pool)}\n{r.stderr[-800:]}"


def _machine_in_plan(cloud: str, opts: PlanOptions) -> str:
    if cloud == "gke":
        (flag,) = [a for s in gke_plan(opts) for a in s.argv if a.startswith("--machine-type=")][1:]
        return flag.split("=", 1)[1]
    if cloud == "eks":
        (types,) = [
            g["instanceTypes"]
            for g in yaml.safe_load(eks_config(opts))["managedNodeGroups"]
            if "instanceTypes" in g
        ]
        return str(types[0])
    (pool,) = [s.argv for s in aks_plan(opts) if s.argv[1:4] == ("aks", "nodepool", "add")]
    return pool[pool.index("--node-vm-size") + 1]


@pytest.mark.parametrize(("cloud", "gpu", "count", "machine"), PAIRS, ids=lambda v: str(v))
def test_every_pair_in_the_tables_gets_its_machine(
    cloud: str, gpu: str, count: int, machine: str
) -> None:
    base = {"gke": GKE, "eks": EKS, "aks": AKS}[cloud]
    opts = PlanOptions(**{**base.__dict__, "gpu": gpu, "gpu_count": count})
    assert _machine_in_plan(cloud, opts) == machine


def test_the_machines_the_review_found_wrong() -> None:
    """A2 and G2 machines carry a fixed number of GPUs; EC2 and Azure types one kind."""

    def machine(cloud: str, gpu: str, n: int) -> str:
        base = {"gke": GKE, "eks": EKS, "aks": AKS}[cloud]
        return _machine_in_plan(cloud, PlanOptions(**{**base.__dict__, "gpu": gpu, "gpu_count": n}))

    assert machine("gke", "nvidia-tesla-a100", 8) == "a2-highgpu-8g"
    assert machine("gke", "nvidia-l4", 2) == "g2-standard-24"
    assert machine("eks", "nvidia-tesla-t4", 4) == "g4dn.12xlarge"
    assert machine("aks", "nvidia-a100-80gb", 2) == "Standard_NC48ads_A100_v4"
    assert machine("aks", "t4", 1) == "Standard_NC4as_T4_v3"  # aliases


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "gke",
                "plan",
                "--project",
                "p",
                "--zone",
                "us-central1-a",
                "--bucket",
                "b",
                "--gpu",
                "nvidia-tesla-a100:3",
            ],
            "GKE machines carry 1, 2, 4, 8, 16 x nvidia-tesla-a100 (no machine has 3)",
        ),
        (
            ["eks", "plan", "--region", "us-west-2", "--bucket", "b", "--gpu", "nvidia-tesla-t4:2"],
            "EKS machines carry 1, 4, 8 x nvidia-tesla-t4",
        ),
        (
            [
                "aks",
                "plan",
                "--resource-group",
                "g",
                "--location",
                "eastus",
                "--bucket",
                "b",
                "--gpu",
                "nvidia-a100:2",
            ],
            "2 per machine: nvidia-tesla-v100, nvidia-a100-80gb",
        ),
        (
            ["eks", "plan", "--region", "us-west-2", "--bucket", "b", "--gpu", "nvidia-tesla-p100"],
            "spotbook has no EKS machine for this GPU type",
        ),
        (
            ["gke", "plan", "--project", "p", "--region", "europe-west4", "--bucket", "b"],
            "a regional plan needs --node-locations",
        ),
        (
            [
                "gke",
                "plan",
                "--project",
                "p",
                "--region",
                "europe-west4",
                "--bucket",
                "b",
                "--node-locations",
                "us-east1-b",
            ],
            "not zones of europe-west4",
        ),
    ],
    ids=["gke-a100-3", "eks-t4-2", "aks-a100-2", "eks-p100", "regional", "bad-zone"],
)
def test_plans_refuse_what_no_machine_or_zone_offers(
    args: list[str], message: str, tmp_path: Path
) -> None:
    r = cli(*args, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_machine_type_overrides_the_table(tmp_path: Path) -> None:
    opts = PlanOptions(**{**GKE.__dict__, "gpu": "nvidia-tesla-a100", "gpu_count": 3})
    with pytest.raises(UsageError):
        gke_plan(opts)
    mine = PlanOptions(**{**opts.__dict__, "machine_type": "a2-custom-3g"})
    assert _machine_in_plan("gke", mine) == "a2-custom-3g"


def test_a_count_alone_keeps_the_providers_gpu_type() -> None:
    """`aks plan --gpu 4` is four T4s, labelled as such (not nvidia-l4)."""
    opts = PlanOptions(**{**AKS.__dict__, "gpu_count": 4})
    (pool,) = [s.argv for s in aks_plan(opts) if s.argv[1:4] == ("aks", "nodepool", "add")]
    assert pool[pool.index("--node-vm-size") + 1] == "Standard_NC64as_T4_v3"
    assert "spotbook.dev/gpu=nvidia-tesla-t4" in pool
    assert "--gpu nvidia-tesla-t4:4" in submit_hint(opts, "aks")


def test_regional_gke_pools_name_their_zones_and_count_in_total() -> None:
    (pool,) = [
        s.argv
        for s in gke_plan(GKE_REGIONAL_T4)
        if s.argv[1:4] == ("container", "node-pools", "create")
    ]
    assert "--node-locations=europe-west4-a,europe-west4-b" in pool
    assert "--total-max-nodes=8" in pool and "--total-min-nodes=0" in pool
    assert not any(a.startswith(("--max-nodes", "--min-nodes")) for a in pool)


def test_every_plan_has_a_registry_the_nodes_can_pull_from() -> None:
    gke = {s.argv[1:4]: s.argv for s in gke_plan(GKE)}
    create = gke[("artifacts", "repositories", "create")]
    assert "--repository-format=docker" in create and "--location=us-central1" in create
    grant = gke[("artifacts", "repositories", "add-iam-policy-binding")]
    assert "--role=roles/artifactregistry.reader" in grant
    assert any("-compute@developer.gserviceaccount.com" in a for a in grant)
    assert image_for(GKE, "gke") == "us-central1-docker.pkg.dev/my-proj/spotbook/spotbook:1"
    eks = [s.argv for s in eks_plan(EKS)]
    assert eks[1][:5] == ("aws", "ecr", "create-repository", "--repository-name", "spotbook")
    aks = {s.argv[1:3]: s.argv for s in aks_plan(AKS)}
    assert aks[("acr", "create")][3:5] == ("--name", "spotbookmyruns")
    assert aks[("aks", "update")][-2:] == ("--attach-acr", "spotbookmyruns")
    for plan, provider in ((GKE, "gke"), (EKS, "eks"), (AKS, "aks")):
        assert image_for(plan, provider) in submit_hint(plan, provider)


def test_eks_groups_scale_from_zero_with_an_autoscaler() -> None:
    doc = yaml.safe_load(eks_config(EKS))
    system, gpu = doc["managedNodeGroups"]
    assert system["iam"]["withAddonPolicies"]["autoScaler"] is True
    assert gpu["propagateASGTags"] is True
    assert gpu["labels"] == {"spotbook.dev/gpu": "nvidia-l4"}
    tags = gpu["tags"]
    assert tags["k8s.io/cluster-autoscaler/node-template/label/spotbook.dev/gpu"] == "nvidia-l4"
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == "1"
    assert tags["k8s.io/cluster-autoscaler/enabled"] == "true"
    assert "k8s.amazonaws.com/accelerator" not in eks_config(EKS)
    helm = [s.argv for s in eks_plan(EKS) if s.argv[0] == "helm"]
    assert helm[-1][:5] == (
        "helm",
        "upgrade",
        "--install",
        "cluster-autoscaler",
        "autoscaler/cluster-autoscaler",
    )
    assert "autoDiscovery.clusterName=spotbook" in helm[-1]


def test_aks_gets_a_device_plugin_that_tolerates_spot() -> None:
    doc = yaml.safe_load(aks_device_plugin(AKS))
    for version in ("1.29.0", kv.latest_version()):
        kv.validate(doc, version, strict=True)
    spec = doc["spec"]["template"]["spec"]
    tolerated = {(t["key"], t.get("value")) for t in spec["tolerations"]}
    assert ("kubernetes.azure.com/scalesetpriority", "spot") in tolerated
    assert ("nvidia.com/gpu", None) in tolerated
    (selector,) = spec["nodeSelector"].items()
    steps = aks_plan(AKS)
    (pool,) = [s.argv for s in steps if s.argv[1:4] == ("aks", "nodepool", "add")]
    assert f"{selector[0]}={selector[1]}" in pool  # the plugin lands on the GPU pool
    (apply,) = [s for s in steps if s.argv[:2] == ("kubectl", "apply")]
    assert apply.stdin == aks_device_plugin(AKS)
    names = [s.argv[:3] for s in steps]
    assert names.index(("az", "aks", "get-credentials")) < names.index(("kubectl", "apply", "-f"))


def test_aks_storage_needs_no_data_plane_role_and_the_hint_names_the_account() -> None:
    steps = aks_plan(AKS)
    (container,) = [s.argv for s in steps if "container" in s.argv[2] and s.argv[3] == "create"]
    assert container[:4] == ("az", "storage", "container-rm", "create")
    assert "--auth-mode" not in container
    hint = submit_hint(AKS, "aks")
    assert "--run-dir az://runs/NAME" in hint and "AZURE_STORAGE_ACCOUNT_NAME=myruns" in hint


needs_az = pytest.mark.skipif(
    shutil.which("az") is None, reason="opt-in: the az CLI is not installed (pip install azure-cli)"
)


@needs_az
def test_az_accepts_every_generated_command(tmp_path: Path) -> None:
    env = {**os.environ, "AZURE_CONFIG_DIR": str(tmp_path / "az")}
    checked = 0
    for step in aks_plan(
        PlanOptions(**{**AKS.__dict__, "gpu": "nvidia-a100-80gb", "gpu_count": 2})
    ):
        if step.argv[0] != "az":
            continue
        r = subprocess.run(list(step.argv), capture_output=True, text=True, env=env, check=False)
        # past parsing, with no account, az exits 1 and asks for `az login`; 2 is a bad flag
        assert r.returncode == 1 and "az login" in r.stderr, (step.argv, r.stderr[-500:])
        checked += 1
    assert checked >= 11
    bad = [
        "az",
        "aks",
        "nodepool",
        "add",
        "--resource-group",
        "g",
        "--cluster-name",
        "c",
        "--name",
        "p",
        "--priority",
        "Spotty",
    ]
    assert subprocess.run(bad, capture_output=True, env=env, check=False).returncode == 2


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
                "--node-locations",
                "europe-west4-a,europe-west4-b",
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
    # the plan is a shell script a reviewer may run as printed: it must parse as one
    syntax = subprocess.run(["bash", "-n"], input=r.stdout, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


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
    for n in (2, 4, 12):
        assert f"step {n}: already done" in r.stderr
    creates = [line.split()[:2] for line in log.read_text().splitlines() if "create" in line]
    assert creates == [
        ["container", "node-pools"],
        ["iam", "service-accounts"],
        ["artifacts", "repositories"],
    ]
    assert log.read_text().splitlines()[-1].startswith("annotate serviceaccount")
