"""The Job manifest: valid against the Kubernetes OpenAPI schema of every version from 1.29
on that kubernetes-validate ships, and the fields that decide whether a spot run survives."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv

from spotbook._errors import UsageError
from spotbook.kube.manifest import (
    PROVIDERS,
    JobOptions,
    build_job,
    job_name,
    parse_duration,
    parse_env,
    parse_gpu,
    parse_secret_env,
    secret_looking,
)

from .conftest import cli

VERSIONS = sorted(set(kv.all_versions()), key=lambda v: tuple(int(x) for x in v.split(".")))
SUPPORTED = [v for v in VERSIONS if tuple(int(x) for x in v.split("."))[:2] >= (1, 29)]
CURRENT = VERSIONS[-1]
RUN = "20261129-101500-a1b2c3"


def job(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"run_id": RUN, "run_dir": "gs://bucket/runs/r1", "image": "img:1"}
    return build_job(JobOptions(**{**base, **kw}))


def pod_spec(j: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = j["spec"]["template"]["spec"]
    return spec


def terms(j: dict[str, Any]) -> list[list[dict[str, Any]]]:
    aff = pod_spec(j).get("affinity")
    if not aff:
        return []
    sel = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [t["matchExpressions"] for t in sel["nodeSelectorTerms"]]


def tolerations(j: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["key"]: t for t in pod_spec(j)["tolerations"]}


CASES = [
    pytest.param(dict(provider=p, spot=spot, gpu_type=g, gpu_count=n), id=f"{p}-{s}-{i}")
    for p in PROVIDERS
    for spot, s in ((True, "spot"), (False, "ondemand"))
    for g, n, i in ((None, 0, "cpu"), ("nvidia-l4", 2, "gpu"))
]


def test_the_supported_versions_are_all_there() -> None:
    assert SUPPORTED[0] == "1.29.0" and len(SUPPORTED) >= 6, SUPPORTED


@pytest.mark.parametrize("version", SUPPORTED)
@pytest.mark.parametrize("kw", CASES)
def test_every_manifest_validates_strictly(kw: dict[str, Any], version: str) -> None:
    j = job(cpu="4", memory="16Gi", queue="team-a", deadline_seconds=3600, env=(("A", "1"),), **kw)
    kv.validate(j, version, strict=True)  # raises on any schema violation


def test_a_condition_rule_without_status_is_refused_by_older_schemas() -> None:
    """Servers default onPodConditions' status; the schemas of 1.29-1.34 (and policy
    engines built on them) require it: the manifest says it."""
    bad = copy.deepcopy(job())
    bad["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"] = [{"type": "DisruptionTarget"}]
    with pytest.raises(Exception, match="status"):
        kv.validate(bad, "1.29.0", strict=True)
    kv.validate(job(), "1.29.0", strict=True)


def test_the_validator_does_reject_a_bad_manifest() -> None:
    bad = copy.deepcopy(job())
    pod_spec(bad)["restartPolicy"] = 7  # wrong type
    with pytest.raises(Exception, match=r"restartPolicy|is not of type"):
        kv.validate(bad, CURRENT, strict=True)
    unknown = copy.deepcopy(job())
    unknown["spec"]["backofLimit"] = 3  # a typo: strict validation catches it
    with pytest.raises(Exception, match=r"backofLimit|Additional properties"):
        kv.validate(unknown, CURRENT, strict=True)


def test_failure_policy_retries_preemption_and_fails_fast_on_real_errors() -> None:
    j = job()
    spec = j["spec"]
    assert pod_spec(j)["restartPolicy"] == "Never"
    assert spec["podReplacementPolicy"] == "Failed"
    assert 1 <= spec["backoffLimit"] <= 6
    ignore, fail = spec["podFailurePolicy"]["rules"]
    assert ignore == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert fail["action"] == "FailJob"
    assert fail["onExitCodes"] == {
        "containerName": "notebook",
        "operator": "In",
        "values": [1, 2, 4, 5, 6, 138],
    }
    # 3 (storage) and 75 (SIGTERM without a DisruptionTarget) count against backoffLimit
    assert 3 not in fail["onExitCodes"]["values"] and 75 not in fail["onExitCodes"]["values"]
    assert spec["ttlSecondsAfterFinished"] == 7 * 24 * 3600
    assert "activeDeadlineSeconds" not in spec
    assert job(deadline_seconds=7200, ttl_seconds=60)["spec"]["activeDeadlineSeconds"] == 7200


def test_gke_spot_gpu() -> None:
    j = job(provider="gke", gpu_type="nvidia-l4", gpu_count=1)
    assert terms(j) == [
        [
            {"key": "cloud.google.com/gke-spot", "operator": "In", "values": ["true"]},
            {"key": "cloud.google.com/gke-accelerator", "operator": "In", "values": ["nvidia-l4"]},
        ],
        [
            {"key": "cloud.google.com/gke-preemptible", "operator": "In", "values": ["true"]},
            {"key": "cloud.google.com/gke-accelerator", "operator": "In", "values": ["nvidia-l4"]},
        ],
    ]
    tol = tolerations(j)
    assert tol["cloud.google.com/gke-spot"] == {
        "key": "cloud.google.com/gke-spot",
        "operator": "Equal",
        "value": "true",
        "effect": "NoSchedule",
    }
    assert tol["nvidia.com/gpu"]["operator"] == "Exists"
    assert pod_spec(j)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # the runner's --grace (8 s) + 6 s to save + the watchdog's 2 s
    assert pod_spec(j)["terminationGracePeriodSeconds"] == 16
    assert job(grace=2)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 10


def test_a_grace_longer_than_the_providers_notice_is_refused() -> None:
    """GKE gives a pod about 15 s of a spot reclaim: --grace 60 would be killed before it
    saved. On-demand nodes and clusters of unknown notice take any grace."""
    with pytest.raises(UsageError, match=r"--grace 60: .* give --grace 9 or less"):
        job(provider="gke", grace=60)
    job(provider="gke", grace=9)
    job(provider="eks", grace=60)  # AWS: two minutes
    assert (
        pod_spec(job(provider="gke", grace=60, spot=False))["terminationGracePeriodSeconds"] == 68
    )
    job(provider="generic", grace=600)


def test_the_pod_passes_pod_security_restricted() -> None:
    """The checks of the Pod Security Standards' "restricted" profile, one by one."""
    spec = pod_spec(job(gpu_type="nvidia-l4", gpu_count=1))
    (c,) = spec["containers"]
    sc, psc = c["securityContext"], spec["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and "add" not in sc["capabilities"]
    assert True in (sc.get("runAsNonRoot"), psc.get("runAsNonRoot"))
    assert sc.get("runAsUser", 1) != 0 and psc.get("runAsUser", 1) != 0
    profile = (sc.get("seccompProfile") or psc.get("seccompProfile"))["type"]
    assert profile in ("RuntimeDefault", "Localhost")
    assert not sc.get("privileged") and "hostPath" not in json.dumps(spec["volumes"])
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert all(v.get("secret") or v.get("emptyDir") for v in spec["volumes"])


def test_both_autoscalers_are_told_not_to_move_a_running_notebook() -> None:
    annotations = job()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert annotations["karpenter.sh/do-not-disrupt"] == "true"


def test_node_loss_is_noticed_in_a_minute() -> None:
    tol = tolerations(job())
    for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"):
        assert tol[key]["effect"] == "NoExecute" and tol[key]["tolerationSeconds"] == 60


def test_eks_spot_selects_managed_groups_or_karpenter() -> None:
    """Each kind of spot node with the GPU label it carries: the plan's managed group has
    spotbook.dev/gpu; Karpenter's nodes have instance-gpu-name, in Karpenter's spelling."""
    j = job(provider="eks", gpu_type="nvidia-tesla-t4", gpu_count=4)
    assert terms(j) == [
        [
            {"key": "eks.amazonaws.com/capacityType", "operator": "In", "values": ["SPOT"]},
            {"key": "spotbook.dev/gpu", "operator": "In", "values": ["nvidia-tesla-t4"]},
        ],
        [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
            {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["t4"]},
        ],
    ]
    assert "k8s.amazonaws.com/accelerator" not in json.dumps(j)  # no autoscaler knows it
    ondemand = terms(job(provider="eks", spot=False, gpu_type="t4", gpu_count=1))
    assert [t[-1]["key"] for t in ondemand] == [
        "spotbook.dev/gpu",
        "karpenter.k8s.aws/instance-gpu-name",
    ]
    assert all(e["operator"] == "NotIn" for t in ondemand for e in t[:-1])
    with pytest.raises(UsageError, match="Karpenter's name"):
        job(provider="eks", gpu_type="nvidia-tesla-p100", gpu_count=1)


def test_generic_matches_gpu_feature_discoverys_product_names() -> None:
    """GFD labels nodes nvidia.com/gpu.product=NVIDIA-L4 / Tesla-T4, not nvidia-l4."""
    (term,) = terms(job(provider="generic", gpu_type="nvidia-l4", gpu_count=1))
    assert term == [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}]
    (term,) = terms(job(provider="generic", gpu_type="t4", gpu_count=1))
    assert term[0]["values"] == ["Tesla-T4"]
    (term,) = terms(job(provider="generic", gpu_type="NVIDIA-H200", gpu_count=1))
    assert term[0]["values"] == ["NVIDIA-H200"]  # unknown: taken as the label's value


def test_aks_spot_tolerates_the_spot_taint() -> None:
    j = job(provider="aks")
    assert terms(j) == [
        [{"key": "kubernetes.azure.com/scalesetpriority", "operator": "In", "values": ["spot"]}]
    ]
    (term,) = terms(job(provider="aks", gpu_type="nvidia-tesla-t4", gpu_count=1))
    assert term[1] == {"key": "spotbook.dev/gpu", "operator": "In", "values": ["nvidia-tesla-t4"]}
    assert tolerations(j)["kubernetes.azure.com/scalesetpriority"]["value"] == "spot"
    with_identity = job(provider="aks", service_account="spotbook-runner")
    labels = with_identity["spec"]["template"]["metadata"]["labels"]
    assert labels["azure.workload.identity/use"] == "true"


@pytest.mark.parametrize("provider", ["gke", "eks", "aks"])
def test_on_demand_avoids_spot_nodes_and_does_not_tolerate_them(provider: str) -> None:
    j = job(provider=provider, spot=False)
    (only,) = terms(j)
    assert only
    assert all(e["operator"] == "NotIn" for e in only)
    spot_keys = {k for k, _ in PROVIDERS[provider].spot_taints}
    assert not spot_keys & set(tolerations(j))


def test_cpu_only_job_has_no_gpu_limit_or_toleration() -> None:
    j = job()
    assert "nvidia.com/gpu" not in tolerations(j)
    # only the working directory's disk is asked for
    assert pod_spec(j)["containers"][0]["resources"] == {"requests": {"ephemeral-storage": "20Gi"}}


def test_the_notebook_works_in_an_emptydir_at_a_stable_path() -> None:
    """Every attempt's pod sees the same paths, HOME and TMPDIR inside the working
    directory (where spotbook looks for the files the run writes), its size asked for."""
    spec = pod_spec(job(work_storage="50Gi"))
    (c,) = spec["containers"]
    assert c["workingDir"] == "/spotbook/work"
    assert {"name": "spotbook-work", "mountPath": "/spotbook/work"} in c["volumeMounts"]
    assert {"name": "spotbook-work", "emptyDir": {"sizeLimit": "50Gi"}} in spec["volumes"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HOME"] == "/spotbook/work/.home" and env["TMPDIR"] == "/spotbook/work/.tmp"
    assert c["resources"]["requests"]["ephemeral-storage"] == "50Gi"
    with pytest.raises(UsageError, match="--work-storage"):
        job(work_storage="lots")


def test_labels_env_queue_and_identity() -> None:
    j = job(
        queue="team-a",
        service_account="nb-runner",
        env=(("WANDB_MODE", "offline"),),
        namespace="ml",
        memory="8Gi",
        cpu="2",
    )
    assert j["metadata"]["name"] == job_name(RUN) == f"sb-{RUN}"
    assert j["metadata"]["namespace"] == "ml"
    assert j["metadata"]["labels"]["spotbook.dev/run-id"] == RUN
    assert j["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert j["spec"]["suspend"] is True  # Kueue unsuspends it on admission
    assert "suspend" not in job()["spec"]  # without a queue the Job starts at once
    assert j["spec"]["template"]["metadata"]["labels"]["spotbook.dev/run-id"] == RUN
    assert j["metadata"]["annotations"]["spotbook.dev/run-dir"] == "gs://bucket/runs/r1"
    spec = pod_spec(j)
    assert spec["serviceAccountName"] == "nb-runner"
    c = spec["containers"][0]
    assert c["command"] == ["spotbook", "worker"]
    env = {e["name"]: e for e in c["env"]}
    assert env["SPOTBOOK_RUN_DIR"]["value"] == "gs://bucket/runs/r1"
    assert env["SPOTBOOK_IMAGE"]["value"] == "img:1"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["WANDB_MODE"]["value"] == "offline"
    assert c["resources"] == {
        "requests": {"ephemeral-storage": "20Gi", "cpu": "2", "memory": "8Gi"},
        "limits": {"memory": "8Gi"},
    }


def test_flag_parsers() -> None:
    assert parse_gpu("nvidia-l4") == ("nvidia-l4", 1)
    assert parse_gpu("nvidia-tesla-t4:4") == ("nvidia-tesla-t4", 4)
    assert parse_gpu("2") == (None, 2)
    assert parse_gpu(None) == (None, 0)
    for bad in ("nvidia-l4:x", "nvidia-l4:0", "NVIDIA L4"):
        with pytest.raises(UsageError):
            parse_gpu(bad)
    assert parse_duration("90", "--ttl") == 90
    assert parse_duration("15m", "--ttl") == 900
    assert parse_duration("2d", "--ttl") == 172800
    with pytest.raises(UsageError, match="--deadline"):
        parse_duration("soon", "--deadline")
    assert parse_env(["A=1", "B=x=y"]) == (("A", "1"), ("B", "x=y"))
    with pytest.raises(UsageError):
        parse_env(["novalue"])
    with pytest.raises(UsageError, match="--provider"):
        job(provider="gcp")
    with pytest.raises(UsageError, match="namespace"):
        job(namespace="Bad_NS")


def test_submit_dry_run_prints_valid_yaml_and_json(work: Path) -> None:
    args = [
        "submit",
        "params.ipynb",
        "--run-dir",
        "gs://b/runs/x",
        "--image",
        "img:1",
        "--gpu",
        "nvidia-l4",
        "-p",
        "alpha",
        "0.5",
        "--namespace",
        "ml",
        "--dry-run",
    ]
    r = cli(*args, cwd=work, env={"KUBECONFIG": str(work / "none")})
    assert r.returncode == 0, r.stderr
    manifest = yaml.safe_load(r.stdout)
    kv.validate(manifest, CURRENT, strict=True)
    assert manifest["metadata"]["namespace"] == "ml"
    # every value written out where it applies: no YAML anchors or aliases
    assert "&id" not in r.stdout and "*id" not in r.stdout
    # no --memory: said, with what happens without it (and the default preemption budget)
    assert "warning: no --memory" in r.stderr and "20 times" in r.stderr
    r = cli(*args, "--memory", "8Gi", "--max-preemptions", "3", cwd=work)
    assert "--memory" not in r.stderr
    r = cli(*args, "-o", "json", cwd=work)
    assert json.loads(r.stdout)["kind"] == "Job"
    assert not (work / ".spotbook").exists()  # nothing written anywhere


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--run-dir", "runs/local"], "bucket the pods can reach"),
        (["--run-dir", "gs://b/r", "--gpu", "nvidia-l4:zero"], "COUNT"),
        (["--run-dir", "gs://b/r", "--ttl", "forever"], "--ttl"),
        (["out.ipynb", "--run-dir", "gs://b/r"], "local path"),
        (["--run-dir", "gs://b/r", "-p", "alpha"], "expected 2 arguments"),
    ],
)
def test_submit_usage_errors_exit_2(work: Path, extra: list[str], message: str) -> None:
    r = cli("submit", "params.ipynb", *extra, "--image", "img", "--dry-run", cwd=work)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_secrets_reach_the_pod_by_reference_only() -> None:
    """--secret-env is a secretKeyRef, --env-from-secret an envFrom, and the run key a
    mounted Secret: no secret value is in the Job, valid in every checked version."""
    j = job(
        secret_env=(("AWS_SECRET_ACCESS_KEY", "aws-creds", "secret-key"),),
        env_from_secrets=("hf-token",),
    )
    for version in SUPPORTED:
        kv.validate(j, version, strict=True)
    c = pod_spec(j)["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "aws-creds", "key": "secret-key"}
    }
    assert c["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    # the run key: a read-only mount of the Secret, and the runner told where
    assert env["SPOTBOOK_SNAPSHOT_KEY_FILE"]["value"] == "/var/run/secrets/spotbook/key"
    assert "SPOTBOOK_SNAPSHOT_KEY" not in env
    work, volume = pod_spec(j)["volumes"]
    assert work["name"] == "spotbook-work"
    assert volume["secret"]["secretName"] == "spotbook-run-key"
    assert c["volumeMounts"] == [
        {"name": "spotbook-work", "mountPath": "/spotbook/work"},
        {"name": volume["name"], "mountPath": "/var/run/secrets/spotbook", "readOnly": True},
    ]


@pytest.mark.parametrize(
    ("flag", "items"),
    [
        ("--secret-env", ["NOEQUALS"]),
        ("--secret-env", ["A=secret-without-key"]),
        ("--secret-env", ["A=Bad_Name:key"]),
        ("--secret-env", ["1A=s:k"]),
        ("--secret-env", ["A=s:bad/key"]),
    ],
)
def test_bad_secret_references_are_usage_errors(flag: str, items: list[str]) -> None:
    with pytest.raises(UsageError, match="--secret-env"):
        parse_secret_env(items)


def test_secret_looking_env_names() -> None:
    names = ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DB_PASSWORD", "LR", "EPOCHS", "api_key"]
    assert secret_looking(names) == ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DB_PASSWORD", "api_key"]
