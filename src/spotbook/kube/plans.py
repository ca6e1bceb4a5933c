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
from collections.abc import Sequence
from dataclasses import dataclass

from .._errors import UsageError
from . import gpus as gpus

KSA_DEFAULT = "spotbook-runner"
REPOSITORY_DEFAULT = "spotbook"  # the image repository (Artifact Registry, ECR)
IMAGE_TAG = "1"
# NVIDIA's device plugin, for clusters whose GPU nodes do not get one (AKS)
DEVICE_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"


def shell_join(argv: tuple[str, ...] | list[str]) -> str:
    """``argv`` as one line a POSIX shell reads back as the same words."""
    # "$(...)" is a lookup the shell must run: double quotes keep it working
    return " ".join(f'"{a}"' if "$(" in a else shlex.quote(a) for a in argv)


@dataclass(frozen=True)
class Step:
    """One step of a cluster plan: what it does and the command that does it."""

    what: str
    argv: tuple[str, ...]
    stdin: str | None = None  # a file body the command reads from stdin (-f -)
    # a read-only command that succeeds when what this step creates exists already:
    # `up` then skips the step, so running it again after a partial setup is safe
    done_if: tuple[str, ...] | None = None

    def shell(self) -> str:
        line = shell_join(self.argv)
        if self.stdin is None:
            return line
        return f"{line} <<'EOF'\n{self.stdin.rstrip()}\nEOF"


@dataclass(frozen=True)
class PlanOptions:
    """What a plan is for; the flags of ``spotbook gke|eks|aks plan``."""

    cluster: str = "spotbook"
    location: str = ""  # GKE zone or region, AWS region, Azure region
    project: str = ""  # GKE project, Azure resource group
    gpu: str = ""  # spotbook's GPU type name; "" is the provider's default
    gpu_count: int = 1
    machine_type: str | None = None
    system_machine_type: str | None = None
    max_nodes: int = 4
    bucket: str = ""
    namespace: str = "default"
    service_account: str = KSA_DEFAULT
    # GKE regional clusters: the zones the GPU pool's nodes go in (not every zone of a
    # region has every GPU)
    node_locations: tuple[str, ...] = ()
    registry: str = ""  # the image repository (ACR: the registry's name)

    def gpu_name(self, cloud: str) -> str:
        return gpus.canonical(self.gpu) if self.gpu else gpus.DEFAULT_GPU[cloud]

    def machine(self, cloud: str) -> str:
        """--machine-type, or the machine that carries gpu_count of the GPU type."""
        return self.machine_type or gpus.machine_for(
            cloud, self.gpu or self.gpu_name(cloud), self.gpu_count
        )

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


def _gke_region(o: PlanOptions) -> str:
    return o.location.rsplit("-", 1)[0] if _is_zone(o.location) else o.location


def _gke_pool_size(o: PlanOptions, gpu: str) -> list[str]:
    """Autoscaling limits: per zone in a zonal cluster; in a regional one, the total over
    the pool's --node-locations (min/max-nodes there would count per zone)."""
    if _is_zone(o.location):
        if o.node_locations:
            raise UsageError("--node-locations is for regional plans (--region)")
        return ["--num-nodes=0", "--min-nodes=0", f"--max-nodes={o.max_nodes}"]
    if not o.node_locations:
        raise UsageError(
            f"a regional plan needs --node-locations ZONE[,ZONE...]: the zones of "
            f"{o.location} the GPU pool may use (not every zone has every GPU; list them "
            f'with `gcloud compute accelerator-types list --filter="zone~{o.location} '
            f'AND name={gpu}"`)'
        )
    bad = [z for z in o.node_locations if not (_is_zone(z) and z.startswith(o.location + "-"))]
    if bad:
        raise UsageError(f"--node-locations {','.join(bad)}: not zones of {o.location}")
    return [
        f"--node-locations={','.join(o.node_locations)}",
        "--num-nodes=0",
        "--total-min-nodes=0",
        f"--total-max-nodes={o.max_nodes}",
    ]


def gke_image(o: PlanOptions) -> str:
    """The worker image's name in the GKE project's Artifact Registry."""
    repo = o.registry or REPOSITORY_DEFAULT
    return f"{_gke_region(o)}-docker.pkg.dev/{o.project}/{repo}/spotbook:{IMAGE_TAG}"


def gke_plan(o: PlanOptions) -> list[Step]:
    """The commands that make a GKE cluster with a spot GPU pool for spotbook."""
    o.check({"project": "--project", "location": "--zone or --region", "bucket": "--bucket"})
    gpu = o.gpu_name("gke")
    machine = o.machine("gke")
    size = _gke_pool_size(o, gpu)
    where = _gke_where(o)
    region = _gke_region(o)
    pool = "gpu-spot"
    gsa = _gsa(o)
    repo = o.registry or REPOSITORY_DEFAULT
    nodes_sa = (
        f"$(gcloud projects describe {o.project} --format='value(projectNumber)')"
        "-compute@developer.gserviceaccount.com"
    )
    spread = f" in {', '.join(o.node_locations)}" if o.node_locations else ""
    return [
        Step(
            "Enable the Kubernetes Engine, Cloud Storage and Artifact Registry APIs",
            (
                "gcloud",
                "services",
                "enable",
                "container.googleapis.com",
                "storage.googleapis.com",
                "artifactregistry.googleapis.com",
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
            f"Add the Spot GPU pool: {machine} machines with {o.gpu_count} x {gpu} each, "
            f"drivers installed by GKE, 0 to {o.max_nodes} nodes{spread}, tainted so only "
            "pods that tolerate Spot land there",
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
                f"--accelerator=type={gpu},count={o.gpu_count},gpu-driver-version=latest",
                "--enable-autoscaling",
                *size,
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
            f"Create the image repository {repo} (Artifact Registry, Docker format)",
            (
                "gcloud",
                "artifacts",
                "repositories",
                "create",
                repo,
                "--repository-format=docker",
                f"--location={region}",
                f"--project={o.project}",
            ),
            done_if=(
                "gcloud",
                "artifacts",
                "repositories",
                "describe",
                repo,
                f"--location={region}",
                f"--project={o.project}",
            ),
        ),
        Step(
            "Let the nodes pull from it (they act as the Compute Engine default service "
            "account unless the cluster was given another)",
            (
                "gcloud",
                "artifacts",
                "repositories",
                "add-iam-policy-binding",
                repo,
                f"--location={region}",
                f"--project={o.project}",
                f"--member=serviceAccount:{nodes_sa}",
                "--role=roles/artifactregistry.reader",
            ),
        ),
        Step(
            "Let this machine's docker push to it",
            ("gcloud", "auth", "configure-docker", f"{region}-docker.pkg.dev", "--quiet"),
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
    """The commands that delete what ``gke_plan`` made."""
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


def image_for(o: PlanOptions, provider: str) -> str:
    """Where the plan's registry step puts the worker image."""
    if provider == "gke":
        return gke_image(o)
    if provider == "eks":
        return eks_image(o)
    return f"{acr_name(o)}.azurecr.io/spotbook:{IMAGE_TAG}"


def image_hint(o: PlanOptions, provider: str) -> list[str]:
    """The commands that build and push the worker image (from a spotbook checkout)."""
    image = image_for(o, provider)
    login = {
        "gke": [],  # the plan's configure-docker step
        "eks": [
            f"aws ecr get-login-password --region {o.location} | docker login --username "
            f"AWS --password-stdin {image.split('/', 1)[0]}"
        ],
        "aks": [f"az acr login --name {acr_name(o)}"],
    }[provider]
    return [
        *login,
        f"docker build -f docker/Dockerfile.cuda -t {image} .",
        f"docker push {image}",
    ]


def submit_hint(o: PlanOptions, provider: str) -> str:
    """The ``spotbook submit`` command to run on the cluster a plan made."""
    gpu = o.gpu_name(provider)
    gpu = gpu if o.gpu_count == 1 else f"{gpu}:{o.gpu_count}"
    if provider == "aks":
        where = ["--run-dir", "az://runs/NAME", "--env", f"AZURE_STORAGE_ACCOUNT_NAME={account(o)}"]
    else:
        where = ["--run-dir", f"{'gs' if provider == 'gke' else 's3'}://{o.bucket}/runs/NAME"]
    return shell_join(
        [
            "spotbook",
            "submit",
            "NOTEBOOK.ipynb",
            *where,
            "--image",
            image_for(o, provider),
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

CLUSTER_AUTOSCALER_CHART = "https://kubernetes.github.io/autoscaler"


def eks_image(o: PlanOptions) -> str:
    """The worker image's name in the AWS account's ECR."""
    repo = o.registry or REPOSITORY_DEFAULT
    account_id = "$(aws sts get-caller-identity --query Account --output text)"
    return f"{account_id}.dkr.ecr.{o.location}.amazonaws.com/{repo}:{IMAGE_TAG}"


def eks_config(o: PlanOptions) -> str:
    """An eksctl ClusterConfig: system group on demand, spot GPU group from zero."""
    o.check({"location": "--region", "bucket": "--bucket"})
    gpu = o.gpu_name("eks")
    machine = o.machine("eks")
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
    template = "k8s.io/cluster-autoscaler/node-template"
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
                # the cluster autoscaler runs here (the GPU group is tainted)
                "iam": {"withAddonPolicies": {"autoScaler": True}},
            },
            {
                "name": "gpu-spot",
                "spot": True,
                "instanceTypes": [machine],
                "minSize": 0,
                "maxSize": o.max_nodes,
                "desiredCapacity": 0,
                # managed node groups have no GPU-type label of their own: the Job
                # selects this one (Karpenter's nodes carry instance-gpu-name instead)
                "labels": {gpus.LABEL_SPOTBOOK_GPU: gpu},
                "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
                # the tags reach the Auto Scaling group only with propagateASGTags; the
                # autoscaler reads them to scale the group up from zero for a GPU pod
                "propagateASGTags": True,
                "tags": {
                    "k8s.io/cluster-autoscaler/enabled": "true",
                    f"k8s.io/cluster-autoscaler/{o.cluster}": "owned",
                    f"{template}/label/{gpus.LABEL_SPOTBOOK_GPU}": gpu,
                    f"{template}/taint/nvidia.com/gpu": "true:NoSchedule",
                    f"{template}/resources/nvidia.com/gpu": str(o.gpu_count),
                },
            },
        ],
    }
    import yaml

    text: str = yaml.safe_dump(doc, sort_keys=False)
    return text


def eks_plan(o: PlanOptions) -> list[Step]:
    """The commands that make an EKS cluster with a spot GPU node group for spotbook."""
    config = eks_config(o)
    repo = o.registry or REPOSITORY_DEFAULT
    region = ("--region", o.location)
    create_bucket = ["aws", "s3api", "create-bucket", "--bucket", o.bucket, *region]
    if o.location != "us-east-1":
        create_bucket += ["--create-bucket-configuration", f"LocationConstraint={o.location}"]
    return [
        Step(
            "Create the bucket for run stores",
            tuple(create_bucket),
            done_if=("aws", "s3api", "head-bucket", "--bucket", o.bucket, *region),
        ),
        Step(
            f"Create the image repository {repo} (ECR; eksctl's node groups may pull from "
            "it: their role has AmazonEC2ContainerRegistryReadOnly)",
            ("aws", "ecr", "create-repository", "--repository-name", repo, *region),
            done_if=("aws", "ecr", "describe-repositories", "--repository-names", repo, *region),
        ),
        Step(
            "Create the cluster: system group on demand, Spot GPU group from 0 nodes "
            "(eksctl installs the NVIDIA device plugin), an IAM role for the pods' service "
            "account limited to the bucket",
            ("eksctl", "create", "cluster", "-f", "-"),
            stdin=config,
            done_if=("eksctl", "get", "cluster", "--name", o.cluster, *region),
        ),
        Step(
            "Point kubectl at the cluster",
            ("aws", "eks", "update-kubeconfig", "--name", o.cluster, *region),
        ),
        Step(
            "Add the cluster autoscaler's chart repository",
            ("helm", "repo", "add", "autoscaler", CLUSTER_AUTOSCALER_CHART, "--force-update"),
        ),
        Step(
            "Install the cluster autoscaler: it finds both groups by their tags and scales "
            "the GPU group up from 0 when a GPU pod waits, and back down",
            (
                "helm",
                "upgrade",
                "--install",
                "cluster-autoscaler",
                "autoscaler/cluster-autoscaler",
                "--namespace",
                "kube-system",
                "--set",
                f"autoDiscovery.clusterName={o.cluster}",
                "--set",
                f"awsRegion={o.location}",
            ),
        ),
    ]


# -- AKS ---------------------------------------------------------------------------------


def account(o: PlanOptions) -> str:
    """The storage account's name: --bucket, as Azure allows (3-24 lower-case letters
    and digits)."""
    return re.sub(r"[^a-z0-9]", "", o.bucket.lower())[:24]


def acr_name(o: PlanOptions) -> str:
    """The container registry's name: --registry, or one made from the cluster and the
    storage account (5-50 letters and digits, unique in Azure)."""
    name = o.registry or f"{o.cluster}{account(o)}"
    return re.sub(r"[^a-zA-Z0-9]", "", name)[:50]


def aks_device_plugin(o: PlanOptions) -> str:
    """NVIDIA's device plugin as a DaemonSet for the spot GPU pool: AKS installs the
    driver but no plugin, so without it no node advertises nvidia.com/gpu; NVIDIA's own
    manifest does not tolerate AKS's spot taint."""
    doc = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "nvidia-device-plugin", "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"name": "nvidia-device-plugin"}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": {"name": "nvidia-device-plugin"}},
                "spec": {
                    "priorityClassName": "system-node-critical",
                    "nodeSelector": {gpus.LABEL_SPOTBOOK_GPU_POOL: "true"},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {
                            "key": "kubernetes.azure.com/scalesetpriority",
                            "operator": "Equal",
                            "value": "spot",
                            "effect": "NoSchedule",
                        },
                    ],
                    "containers": [
                        {
                            "name": "nvidia-device-plugin",
                            "image": DEVICE_PLUGIN_IMAGE,
                            "env": [{"name": "FAIL_ON_INIT_ERROR", "value": "false"}],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [
                                {
                                    "name": "device-plugin",
                                    "mountPath": "/var/lib/kubelet/device-plugins",
                                }
                            ],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "device-plugin",
                            "hostPath": {"path": "/var/lib/kubelet/device-plugins"},
                        }
                    ],
                },
            },
        },
    }
    import yaml

    text: str = yaml.safe_dump(doc, sort_keys=False)
    return text


def aks_plan(o: PlanOptions) -> list[Step]:
    """The commands that make an AKS cluster with a spot GPU node pool for spotbook."""
    o.check({"project": "--resource-group", "location": "--location", "bucket": "--bucket"})
    rg = o.project
    gpu = o.gpu_name("aks")
    machine = o.machine("aks")
    registry = acr_name(o)
    storage = account(o)
    identity = f"{o.cluster}-runner"
    scope = (
        f"$(az storage account show --name {storage} --resource-group {rg} --query id -o tsv)"
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
            f"Add the Spot GPU pool: {machine} machines with {o.gpu_count} x {gpu} each, "
            f"from 0 to {o.max_nodes} nodes (AKS taints Spot nodes "
            "kubernetes.azure.com/scalesetpriority=spot:NoSchedule and installs the driver)",
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
                f"{gpus.LABEL_SPOTBOOK_GPU}={gpu}",
                f"{gpus.LABEL_SPOTBOOK_GPU_POOL}=true",
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
                storage,
                "--resource-group",
                rg,
                "--location",
                o.location,
                "--sku",
                "Standard_LRS",
            ),
        ),
        Step(
            "Create the container for run stores (through the management plane: a new "
            "owner has no data-plane role on the account yet)",
            (
                "az",
                "storage",
                "container-rm",
                "create",
                "--name",
                "runs",
                "--storage-account",
                storage,
                "--resource-group",
                rg,
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
            f"Create the image registry {registry} (ACR)",
            (
                "az",
                "acr",
                "create",
                "--name",
                registry,
                "--resource-group",
                rg,
                "--sku",
                "Basic",
            ),
        ),
        Step(
            "Let the cluster's nodes pull from it (AcrPull for the kubelet identity)",
            (
                "az",
                "aks",
                "update",
                "--name",
                o.cluster,
                "--resource-group",
                rg,
                "--attach-acr",
                registry,
            ),
        ),
        Step(
            "Point kubectl at the cluster",
            ("az", "aks", "get-credentials", "--resource-group", rg, "--name", o.cluster),
        ),
        Step(
            "Install NVIDIA's device plugin on the GPU pool (tolerating the Spot taint), so "
            "its nodes advertise nvidia.com/gpu",
            ("kubectl", "apply", "-f", "-"),
            stdin=aks_device_plugin(o),
        ),
        *_service_account_steps(
            o,
            "the identity",
            f"azure.workload.identity/client-id=$(az identity show --name {identity} "
            f"--resource-group {rg} --query clientId -o tsv)",
        ),
    ]


def render(
    steps: list[Step], hint: str | None = None, checks: bool = False, image: Sequence[str] = ()
) -> str:
    """The plan as a shell script; ``checks`` notes the skip checks `up` runs; ``image``
    the commands that build and push the worker image, ``hint`` the submit command."""
    lines = []
    for n, step in enumerate(steps, 1):
        lines.append(f"# {n}. {step.what}")
        if checks and step.done_if:
            lines.append(
                f"#    (`up` skips this step when this succeeds: {shlex.join(step.done_if)})"
            )
        lines.append(step.shell())
        lines.append("")
    if image:
        lines.append("# Then build the worker image and push it (from a spotbook checkout):")
        lines.extend(f"# {line}" for line in image)
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
    """The steps as JSON (``plan --json``)."""
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
