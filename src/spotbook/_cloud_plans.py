"""Cluster setup plans: the exact commands for a cluster that runs notebooks on spot GPUs.

Each plan is a list of :class:`Step` (a sentence and an argv), printed for review by
``spotbook gke|eks|aks plan`` and run in order by ``spotbook gke up`` / ``down``. The
shape is the same everywhere: a small on-demand pool for system pods (a preempted system
node costs minutes), an autoscaled spot GPU pool that starts at zero nodes and is tainted
so only GPU jobs land there, GPU drivers, a bucket for run stores, and an identity for
the pods that may read and write that bucket and nothing else.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from ._errors import UsageError

KSA_DEFAULT = "spotbook-runner"

# GKE machine families that carry each accelerator (the default --machine-type)
GKE_MACHINES = {
    "nvidia-l4": "g2-standard-8",
    "nvidia-tesla-t4": "n1-standard-8",
    "nvidia-tesla-v100": "n1-standard-8",
    "nvidia-tesla-a100": "a2-highgpu-1g",
    "nvidia-a100-80gb": "a2-ultragpu-1g",
}


@dataclass(frozen=True)
class Step:
    what: str
    argv: tuple[str, ...]
    stdin: str | None = None  # a file body the command reads from stdin (-f -)
    # a read-only command that succeeds when what this step creates exists already:
    # `up` then skips the step, so running it again after a partial setup is safe
    done_if: tuple[str, ...] | None = None

    def shell(self) -> str:
        # "$(...)" is a lookup the shell must run: double quotes keep it working
        line = " ".join(f'"{a}"' if "$(" in a else shlex.quote(a) for a in self.argv)
        if self.stdin is None:
            return line
        return f"{line} <<'EOF'\n{self.stdin.rstrip()}\nEOF"


@dataclass(frozen=True)
class PlanOptions:
    """What a plan is for; the flags of ``spotbook gke|eks|aks plan``."""

    cluster: str = "spotbook"
    location: str = ""  # GKE zone or region, AWS region, Azure region
    project: str = ""  # GKE project, Azure resource group
    gpu: str = "nvidia-l4"
    gpu_count: int = 1
    machine_type: str | None = None
    system_machine_type: str | None = None
    max_nodes: int = 4
    bucket: str = ""
    namespace: str = "default"
    service_account: str = KSA_DEFAULT

    def check(self, needs: dict[str, str]) -> None:
        missing = [flag for attr, flag in needs.items() if not getattr(self, attr)]
        if missing:
            raise UsageError(f"the plan needs {', '.join(missing)}")
        if self.max_nodes < 1:
            raise UsageError("--max-nodes must be at least 1")
        if self.gpu_count < 1:
            raise UsageError("--gpu COUNT must be at least 1")
        if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", self.cluster):
            raise UsageError(f"--cluster {self.cluster!r}: lower-case letters, digits and -")


def _is_zone(location: str) -> bool:
    return bool(re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z]", location))


# -- GKE ---------------------------------------------------------------------------------


def _gke_where(o: PlanOptions) -> list[str]:
    flag = "--zone" if _is_zone(o.location) else "--region"
    return [f"--project={o.project}", f"{flag}={o.location}"]


def _gsa(o: PlanOptions) -> str:
    return f"{o.service_account}@{o.project}.iam.gserviceaccount.com"


def _service_account_steps(o: PlanOptions, tied_to: str, annotation: str) -> list[Step]:
    """Create the pods' Kubernetes service account and tie it to a cloud identity."""
    return [
        Step(
            "Create the Kubernetes service account",
            (
                "kubectl",
                "create",
                "serviceaccount",
                o.service_account,
                f"--namespace={o.namespace}",
            ),
            done_if=(
                "kubectl",
                "get",
                "serviceaccount",
                o.service_account,
                f"--namespace={o.namespace}",
            ),
        ),
        Step(
            f"Tie it to {tied_to}",
            (
                "kubectl",
                "annotate",
                "serviceaccount",
                o.service_account,
                f"--namespace={o.namespace}",
                annotation,
                "--overwrite",  # running it again is harmless
            ),
        ),
    ]


def gke_plan(o: PlanOptions) -> list[Step]:
    o.check({"project": "--project", "location": "--zone or --region", "bucket": "--bucket"})
    machine = o.machine_type or GKE_MACHINES.get(o.gpu)
    if machine is None:
        raise UsageError(
            f"no default machine type for {o.gpu}; pass --machine-type (one that carries it)"
        )
    where = _gke_where(o)
    region = o.location.rsplit("-", 1)[0] if _is_zone(o.location) else o.location
    pool = "gpu-spot"
    gsa = _gsa(o)
    return [
        Step(
            "Enable the Kubernetes Engine and Cloud Storage APIs",
            (
                "gcloud",
                "services",
                "enable",
                "container.googleapis.com",
                "storage.googleapis.com",
                f"--project={o.project}",
            ),
        ),
        Step(
            "Create the cluster; its default pool is the small on-demand pool for system "
            "pods, with workload identity on",
            (
                "gcloud",
                "container",
                "clusters",
                "create",
                o.cluster,
                *where,
                "--release-channel=regular",
                f"--workload-pool={o.project}.svc.id.goog",
                f"--machine-type={o.system_machine_type or 'e2-standard-4'}",
                "--num-nodes=1",
                "--workload-metadata=GKE_METADATA",
            ),
            done_if=("gcloud", "container", "clusters", "describe", o.cluster, *where),
        ),
        Step(
            f"Add the Spot GPU pool: {o.gpu_count} x {o.gpu} per node, drivers installed by "
            f"GKE, 0 to {o.max_nodes} nodes, tainted so only pods that tolerate Spot land there",
            (
                "gcloud",
                "container",
                "node-pools",
                "create",
                pool,
                f"--cluster={o.cluster}",
                *where,
                "--spot",
                f"--machine-type={machine}",
                f"--accelerator=type={o.gpu},count={o.gpu_count},gpu-driver-version=latest",
                "--enable-autoscaling",
                "--num-nodes=0",
                "--min-nodes=0",
                f"--max-nodes={o.max_nodes}",
                "--node-taints=cloud.google.com/gke-spot=true:NoSchedule",
                "--workload-metadata=GKE_METADATA",
            ),
            done_if=(
                "gcloud",
                "container",
                "node-pools",
                "describe",
                pool,
                f"--cluster={o.cluster}",
                *where,
            ),
        ),
        Step(
            "Create the bucket for run stores",
            (
                "gcloud",
                "storage",
                "buckets",
                "create",
                f"gs://{o.bucket}",
                f"--project={o.project}",
                f"--location={region}",
                "--uniform-bucket-level-access",
            ),
            done_if=(
                "gcloud",
                "storage",
                "buckets",
                "describe",
                f"gs://{o.bucket}",
                f"--project={o.project}",
            ),
        ),
        Step(
            "Create the Google service account the pods act as",
            (
                "gcloud",
                "iam",
                "service-accounts",
                "create",
                o.service_account,
                f"--project={o.project}",
                "--display-name=spotbook notebook runs",
            ),
            done_if=(
                "gcloud",
                "iam",
                "service-accounts",
                "describe",
                gsa,
                f"--project={o.project}",
            ),
        ),
        Step(
            "Let it read and write objects in that bucket only (objectUser: create, read, "
            "list, overwrite; no bucket or IAM changes)",
            (
                "gcloud",
                "storage",
                "buckets",
                "add-iam-policy-binding",
                f"gs://{o.bucket}",
                f"--member=serviceAccount:{gsa}",
                "--role=roles/storage.objectUser",
            ),
        ),
        Step(
            "Let the Kubernetes service account act as it (workload identity)",
            (
                "gcloud",
                "iam",
                "service-accounts",
                "add-iam-policy-binding",
                gsa,
                f"--project={o.project}",
                "--role=roles/iam.workloadIdentityUser",
                f"--member=serviceAccount:{o.project}.svc.id.goog"
                f"[{o.namespace}/{o.service_account}]",
            ),
        ),
        Step(
            "Point kubectl at the cluster",
            ("gcloud", "container", "clusters", "get-credentials", o.cluster, *where),
        ),
        *_service_account_steps(
            o, "the Google service account", f"iam.gke.io/gcp-service-account={gsa}"
        ),
    ]


def gke_down(o: PlanOptions, delete_bucket: bool = False) -> list[Step]:
    o.check({"project": "--project", "location": "--zone or --region"})
    steps = [
        Step(
            "Delete the cluster and its node pools",
            ("gcloud", "container", "clusters", "delete", o.cluster, *_gke_where(o), "--quiet"),
        ),
        Step(
            "Delete the Google service account",
            (
                "gcloud",
                "iam",
                "service-accounts",
                "delete",
                _gsa(o),
                f"--project={o.project}",
                "--quiet",
            ),
        ),
    ]
    if delete_bucket:
        o.check({"bucket": "--bucket"})
        steps.append(
            Step(
                "Delete the bucket and every run store in it",
                ("gcloud", "storage", "rm", "--recursive", f"gs://{o.bucket}"),
            )
        )
    return steps


def submit_hint(o: PlanOptions, provider: str, scheme: str) -> str:
    gpu = o.gpu if o.gpu_count == 1 else f"{o.gpu}:{o.gpu_count}"
    return shlex.join(
        [
            "spotbook",
            "submit",
            "NOTEBOOK.ipynb",
            "--run-dir",
            f"{scheme}://{o.bucket}/runs/NAME",
            "--image",
            "IMAGE",
            "--gpu",
            gpu,
            "--spot",
            "--provider",
            provider,
            "--service-account",
            o.service_account,
            "--namespace",
            o.namespace,
        ]
    )


# -- EKS ---------------------------------------------------------------------------------


def eks_config(o: PlanOptions) -> str:
    """An eksctl ClusterConfig: system group on demand, spot GPU group from zero."""
    o.check({"location": "--region", "bucket": "--bucket"})
    machine = o.machine_type or "g6.xlarge"
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{o.bucket}"],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": [f"arn:aws:s3:::{o.bucket}/*"],
            },
        ],
    }
    doc = {
        "apiVersion": "eksctl.io/v1alpha5",
        "kind": "ClusterConfig",
        "metadata": {"name": o.cluster, "region": o.location},
        "iam": {
            "withOIDC": True,
            "serviceAccounts": [
                {
                    "metadata": {"name": o.service_account, "namespace": o.namespace},
                    "attachPolicy": policy,
                }
            ],
        },
        "managedNodeGroups": [
            {
                "name": "system",
                "instanceType": o.system_machine_type or "m6i.large",
                "minSize": 1,
                "maxSize": 2,
                "desiredCapacity": 1,
            },
            {
                "name": "gpu-spot",
                "spot": True,
                "instanceTypes": [machine],
                "minSize": 0,
                "maxSize": o.max_nodes,
                "desiredCapacity": 0,
                "labels": {"k8s.amazonaws.com/accelerator": o.gpu},
                "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
                "tags": {
                    # lets the cluster autoscaler scale the group up from zero for GPU pods
                    "k8s.io/cluster-autoscaler/node-template/label/"
                    "k8s.amazonaws.com/accelerator": o.gpu,
                    "k8s.io/cluster-autoscaler/node-template/taint/"
                    "nvidia.com/gpu": "true:NoSchedule",
                },
            },
        ],
    }
    import yaml

    text: str = yaml.safe_dump(doc, sort_keys=False)
    return text


def eks_plan(o: PlanOptions) -> list[Step]:
    config = eks_config(o)
    create_bucket = ["aws", "s3api", "create-bucket", "--bucket", o.bucket, "--region", o.location]
    if o.location != "us-east-1":
        create_bucket += ["--create-bucket-configuration", f"LocationConstraint={o.location}"]
    return [
        Step("Create the bucket for run stores", tuple(create_bucket)),
        Step(
            "Create the cluster: system group on demand, Spot GPU group from 0 nodes "
            "(eksctl installs the NVIDIA device plugin), an IAM role for the pods' service "
            "account limited to the bucket",
            ("eksctl", "create", "cluster", "-f", "-"),
            stdin=config,
        ),
        Step(
            "Point kubectl at the cluster",
            ("aws", "eks", "update-kubeconfig", "--name", o.cluster, "--region", o.location),
        ),
    ]


# -- AKS ---------------------------------------------------------------------------------


def aks_plan(o: PlanOptions) -> list[Step]:
    o.check({"project": "--resource-group", "location": "--location", "bucket": "--bucket"})
    rg, account = o.project, re.sub(r"[^a-z0-9]", "", o.bucket.lower())[:24]
    machine = o.machine_type or "Standard_NC4as_T4_v3"
    identity = f"{o.cluster}-runner"
    scope = (
        f"$(az storage account show --name {account} --resource-group {rg} --query id -o tsv)"
        f"/blobServices/default/containers/runs"
    )
    return [
        Step(
            "Create the resource group",
            ("az", "group", "create", "--name", rg, "--location", o.location),
        ),
        Step(
            "Create the cluster: one on-demand system node, OIDC issuer and workload identity",
            (
                "az",
                "aks",
                "create",
                "--resource-group",
                rg,
                "--name",
                o.cluster,
                "--node-count",
                "1",
                "--node-vm-size",
                o.system_machine_type or "Standard_D4s_v5",
                "--enable-oidc-issuer",
                "--enable-workload-identity",
                "--generate-ssh-keys",
            ),
        ),
        Step(
            "Add the Spot GPU pool from 0 nodes (AKS taints Spot nodes "
            "kubernetes.azure.com/scalesetpriority=spot:NoSchedule)",
            (
                "az",
                "aks",
                "nodepool",
                "add",
                "--resource-group",
                rg,
                "--cluster-name",
                o.cluster,
                "--name",
                "gpuspot",
                "--priority",
                "Spot",
                "--eviction-policy",
                "Delete",
                "--spot-max-price",
                "-1",
                "--node-vm-size",
                machine,
                "--enable-cluster-autoscaler",
                "--min-count",
                "0",
                "--max-count",
                str(o.max_nodes),
                "--node-count",
                "0",
                "--node-taints",
                "nvidia.com/gpu=present:NoSchedule",
                "--labels",
                f"nvidia.com/gpu.product={o.gpu}",
            ),
        ),
        Step(
            "Create the storage account",
            (
                "az",
                "storage",
                "account",
                "create",
                "--name",
                account,
                "--resource-group",
                rg,
                "--location",
                o.location,
                "--sku",
                "Standard_LRS",
            ),
        ),
        Step(
            "Create the container for run stores",
            (
                "az",
                "storage",
                "container",
                "create",
                "--name",
                "runs",
                "--account-name",
                account,
                "--auth-mode",
                "login",
            ),
        ),
        Step(
            "Create the identity the pods act as",
            ("az", "identity", "create", "--name", identity, "--resource-group", rg),
        ),
        Step(
            "Let it read and write blobs in that container only",
            (
                "az",
                "role",
                "assignment",
                "create",
                "--role",
                "Storage Blob Data Contributor",
                "--assignee",
                f"$(az identity show --name {identity} --resource-group {rg} "
                "--query principalId -o tsv)",
                "--scope",
                scope,
            ),
        ),
        Step(
            "Trust the cluster's service account (workload identity federation)",
            (
                "az",
                "identity",
                "federated-credential",
                "create",
                "--name",
                "spotbook",
                "--identity-name",
                identity,
                "--resource-group",
                rg,
                "--issuer",
                f"$(az aks show --name {o.cluster} --resource-group {rg} "
                "--query oidcIssuerProfile.issuerUrl -o tsv)",
                "--subject",
                f"system:serviceaccount:{o.namespace}:{o.service_account}",
            ),
        ),
        Step(
            "Point kubectl at the cluster",
            ("az", "aks", "get-credentials", "--resource-group", rg, "--name", o.cluster),
        ),
        *_service_account_steps(
            o,
            "the identity",
            f"azure.workload.identity/client-id=$(az identity show --name {identity} "
            f"--resource-group {rg} --query clientId -o tsv)",
        ),
    ]


def render(steps: list[Step], hint: str | None = None, checks: bool = False) -> str:
    """The plan as a shell script; ``checks`` notes the skip checks `up` runs."""
    lines = []
    for n, step in enumerate(steps, 1):
        lines.append(f"# {n}. {step.what}")
        if checks and step.done_if:
            lines.append(
                f"#    (`up` skips this step when this succeeds: {shlex.join(step.done_if)})"
            )
        lines.append(step.shell())
        lines.append("")
    if hint:
        lines.append("# Then run notebooks on the Spot GPU pool:")
        lines.append(f"# {hint}")
        lines.append(
            "# (the first submit creates the Secret spotbook-run-key in the namespace from"
            " this machine's run key and mounts it in every pod; your account needs"
            " create/get on Secrets there. Credentials for the notebook: --secret-env"
            " NAME=SECRET:KEY, not --env.)"
        )
    return "\n".join(lines) + "\n"


def to_json(steps: list[Step]) -> str:
    return json.dumps(
        [
            {
                "what": s.what,
                "argv": list(s.argv),
                "stdin": s.stdin,
                "done_if": list(s.done_if) if s.done_if else None,
            }
            for s in steps
        ],
        indent=2,
    )
