"""The Kubernetes Job that runs one spotbook run: built here, as plain dicts, no I/O.

Every field that decides whether a preemptible run survives is set on purpose:

- ``restartPolicy: Never`` and ``podReplacementPolicy: Failed``: each attempt is a new
  pod, and a new pod starts only after the old one has fully stopped, so two attempts
  never write the run store at once (the store's fence handles the rest).
- ``podFailurePolicy``: a disruption (spot reclaim, drain, eviction) is ignored, i.e. not
  counted against ``backoffLimit``; spotbook's exit codes for problems a retry cannot fix
  (``_models.EXIT_CODES_FAIL_JOB``: a cell error, bad input, a timeout, the preemption
  budget, a refused resume, a dead kernel) fail the Job at once; everything else
  (3 storage/infrastructure, 75 stopped without a DisruptionTarget, OOM kills) counts
  against a small ``backoffLimit``.
- Tolerations and node affinity for the provider's spot and GPU labels and taints, a
  GPU limit, and short ``tolerationSeconds`` for unreachable/not-ready nodes, so a node
  that vanished without notice is given up on in about a minute instead of five.
- ``terminationGracePeriodSeconds`` from the run's --grace plus the save budget and the
  exit watchdog's margin; on spot nodes ``--grace`` is refused when the pod would need
  more than the provider gives it of a reclaim (GKE: about 15 s).
- A pod that passes Pod Security "restricted" (non-root, no capabilities, the runtime's
  seccomp profile), and the annotations both autoscalers read before moving a pod
  (the cluster autoscaler's ``safe-to-evict``, Karpenter's ``do-not-disrupt``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from .._errors import UsageError
from .._models import EXIT_CODES_FAIL_JOB, EXIT_MARGIN, SAVE_BUDGET, Limits
from ..store.runstore import LEGACY_ENV
from . import gpus as gpus

CONTAINER = "notebook"
LABEL_RUN = "spotbook.dev/run-id"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
ANNOTATION_RUN_DIR = "spotbook.dev/run-dir"
ANNOTATION_SOURCE = "spotbook.dev/source"
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
GPU_RESOURCE = "nvidia.com/gpu"
NODE_GONE_SECONDS = 60  # default is 300: a dead node's pod waits 5 min to be replaced
DEFAULT_TTL = 7 * 24 * 3600
DEFAULT_BACKOFF = 3
# Submitted runs stop after this many preemptions unless --max-preemptions says otherwise:
# DisruptionTarget also marks node-pressure evictions, which a notebook that exhausts its
# node's memory meets again on every fresh node.
DEFAULT_MAX_PREEMPTIONS = 20
# The run key (see store/integrity.py): a Secret that `submit` creates or reuses, mounted as a
# file the runner reads; never an environment variable the notebook could see.
DEFAULT_KEY_SECRET = "spotbook-run-key"
KEY_SECRET_ITEM = "key"
KEY_MOUNT = "/var/run/secrets/spotbook"
# The notebook's working directory in the pod: an emptyDir at the same path in every
# attempt, with HOME and TMPDIR inside it (the worker makes them), so every file the
# run writes lies where spotbook looks for it and the image's root may stay read-only.
# It goes with the node (as its disk does): the run store brings back what a resume needs.
WORK_MOUNT = "/spotbook/work"
_STORAGE = re.compile(r"^[1-9][0-9]{0,15}(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
WORK_VOLUME = "spotbook-work"
DEFAULT_WORK_STORAGE = "20Gi"


@dataclass(frozen=True)
class Provider:
    """Where a provider puts spot nodes and GPU types (labels and taints)."""

    name: str
    # (label, value) marking spot capacity, and the label that names the GPU type on
    # those nodes: a node matching any one pair will do (node selector terms are ORed)
    spot_kinds: tuple[tuple[str, str, str], ...]
    # taints spot nodes carry that the pod must tolerate
    spot_taints: tuple[tuple[str, str], ...]
    gpu_type_label: str  # where no spot kind says: the node label naming the GPU type
    pod_notice: int | None  # seconds a pod gets of a spot reclaim (None: unknown)
    notice: str


PROVIDERS: dict[str, Provider] = {
    "gke": Provider(
        "gke",
        spot_kinds=(
            ("cloud.google.com/gke-spot", "true", gpus.LABEL_GKE_ACCELERATOR),
            ("cloud.google.com/gke-preemptible", "true", gpus.LABEL_GKE_ACCELERATOR),
        ),
        spot_taints=(
            ("cloud.google.com/gke-spot", "true"),
            ("cloud.google.com/gke-preemptible", "true"),
        ),
        gpu_type_label=gpus.LABEL_GKE_ACCELERATOR,
        pod_notice=15,
        notice="30 s notice; GKE's graceful node shutdown gives a pod about 15 s of it",
    ),
    "eks": Provider(
        "eks",
        spot_kinds=(
            # managed node groups: the plan labels the group with spotbook's GPU label
            ("eks.amazonaws.com/capacityType", "SPOT", gpus.LABEL_SPOTBOOK_GPU),
            ("karpenter.sh/capacity-type", "spot", gpus.LABEL_KARPENTER_GPU),
        ),
        spot_taints=(),
        gpu_type_label=gpus.LABEL_SPOTBOOK_GPU,
        pod_notice=120,
        notice="2 min notice",
    ),
    "aks": Provider(
        "aks",
        spot_kinds=(("kubernetes.azure.com/scalesetpriority", "spot", gpus.LABEL_SPOTBOOK_GPU),),
        spot_taints=(("kubernetes.azure.com/scalesetpriority", "spot"),),
        gpu_type_label=gpus.LABEL_SPOTBOOK_GPU,
        pod_notice=30,
        notice="at least 30 s notice",
    ),
    "generic": Provider(
        "generic",
        spot_kinds=(),
        spot_taints=(),
        gpu_type_label=gpus.LABEL_GFD_PRODUCT,
        pod_notice=None,
        notice="unknown notice",
    ),
}


def stop_seconds(grace: float) -> int:
    """How long a runner with this --grace may take to stop after SIGTERM: the cell's
    grace, the save budget and the exit watchdog's margin."""
    return math.ceil(grace + SAVE_BUDGET + EXIT_MARGIN)


@dataclass(frozen=True)
class JobOptions:
    """What ``spotbook submit`` asks of the cluster for one run."""

    run_dir: str
    image: str
    run_id: str = ""  # filled in by submit (submit_notebook, job_manifest)
    namespace: str = "default"
    provider: str = "gke"
    spot: bool = True
    gpu_type: str | None = None
    gpu_count: int = 0
    cpu: str | None = None
    memory: str | None = None
    service_account: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    # (NAME, SECRET, KEY): NAME's value is item KEY of Secret SECRET (a secretKeyRef)
    secret_env: tuple[tuple[str, str, str], ...] = ()
    env_from_secrets: tuple[str, ...] = ()
    # the Secret holding the run key (None: the pod gets no key, as in --dry-run of an
    # image that brings its own)
    key_secret: str | None = DEFAULT_KEY_SECRET
    queue: str | None = None
    ttl_seconds: int | None = DEFAULT_TTL
    deadline_seconds: int | None = None
    backoff_limit: int = DEFAULT_BACKOFF
    grace: float = Limits().grace  # the run's --grace
    source: str = ""
    extra_labels: dict[str, str] = field(default_factory=dict)
    # a sweep: an Indexed Job of this many points, pod i running run_dir/points/i, with
    # backoff_limit retries per point and up to max_failed_points failed ones (default
    # all) before the Job stops; None: one run
    points: int | None = None
    parallelism: int | None = None
    max_failed_points: int | None = None
    # the working directory's size: its emptyDir's sizeLimit and the ephemeral-storage
    # the pod requests (the scheduler then picks a node with that much disk)
    work_storage: str = DEFAULT_WORK_STORAGE

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise UsageError(
                f"--provider must be one of {', '.join(PROVIDERS)}, not {self.provider!r}"
            )
        if self.gpu_count < 0:
            raise UsageError("--gpu COUNT must be zero or more")
        if not _STORAGE.match(self.work_storage):
            raise UsageError(
                f"--work-storage {self.work_storage!r} is not a Kubernetes quantity "
                "(e.g. 20Gi, 500Mi, 100G)"
            )
        if not _LABEL_VALUE.match(self.run_id):
            raise UsageError(f"run id {self.run_id!r} cannot be a Kubernetes label value")
        # what the API server would refuse, or a pod that could never run: said here,
        # before the store is written or a manifest is printed
        if not self.image or not _IMAGE.match(self.image):
            raise UsageError(
                f"--image {self.image!r} is not an image reference (such as "
                "us-docker.pkg.dev/p/r/spotbook:1 or ghcr.io/org/img@sha256:...)"
            )
        for flag, value in (("--cpu", self.cpu), ("--memory", self.memory)):
            if value is not None and not (_QUANTITY.match(value) and float_quantity(value) > 0):
                raise UsageError(
                    f"{flag} {value!r} is not a positive Kubernetes quantity (cpu: 4, 500m; "
                    "memory: 16Gi, 512Mi)"
                )
        if self.service_account is not None and not _DNS_SUBDOMAIN.match(self.service_account):
            raise UsageError(
                f"--service-account {self.service_account!r} is not a valid name (a DNS "
                "subdomain: lowercase letters, digits, '-' and '.')"
            )
        if self.gpu_count > MAX_GPUS:
            raise UsageError(f"--gpu: {self.gpu_count} GPUs is more than any node has")
        if self.ttl_seconds is not None and not 0 <= self.ttl_seconds <= _INT32:
            raise UsageError(
                f"--ttl: {self.ttl_seconds} s is out of Kubernetes' range (0 to 68 years)"
            )
        # the API server takes a positive activeDeadlineSeconds only (0 would end the Job at once)
        if self.deadline_seconds is not None and not 1 <= self.deadline_seconds <= _INT32:
            raise UsageError(
                f"--deadline: {self.deadline_seconds} s is out of Kubernetes' range (1 s to "
                "68 years); leave it out for no deadline"
            )
        if not 0 <= self.backoff_limit <= _INT32:
            raise UsageError(
                f"--backoff-limit {self.backoff_limit} is out of range (0 to 2147483647)"
            )
        if not _DNS_LABEL.match(self.namespace):
            raise UsageError(f"--namespace {self.namespace!r} is not a valid namespace name")
        for name in (*self.env_from_secrets, *(s for _, s, _ in self.secret_env)):
            if not _DNS_SUBDOMAIN.match(name):
                raise UsageError(f"{name!r} is not a valid Secret name (a DNS subdomain)")
        if self.key_secret is not None and not _DNS_SUBDOMAIN.match(self.key_secret):
            raise UsageError(f"--key-secret {self.key_secret!r} is not a valid Secret name")
        if self.queue is not None and not _LABEL_VALUE.match(self.queue):
            raise UsageError(f"--queue {self.queue!r} is not a valid Kueue queue name")
        if self.points is not None and not 1 <= self.points <= MAX_INDEXED_POINTS:
            raise UsageError(
                f"a sweep Job holds 1 to {MAX_INDEXED_POINTS} points, not {self.points}"
            )
        if self.parallelism is not None and self.parallelism < 1:
            raise UsageError("--parallel must be 1 or more")
        if self.max_failed_points is not None and not (
            self.points is not None and 0 <= self.max_failed_points <= self.points
        ):
            raise UsageError("--max-failed-points must be between 0 and the number of points")
        provider = PROVIDERS[self.provider]
        notice = provider.pod_notice
        if self.spot and notice is not None and self.grace + SAVE_BUDGET > notice:
            most = max(notice - SAVE_BUDGET, 0)
            raise UsageError(
                f"--grace {self.grace:g}: on {self.provider.upper()} spot nodes a pod gets "
                f"about {notice} s of a reclaim ({provider.notice}), and after the grace "
                f"spotbook needs up to {SAVE_BUDGET:g} s to save: the pod would be killed "
                f"before it saved; give --grace {most:g} or less"
            )


# a container image reference as the API server takes one: no spaces or control characters
# (the kubelet then parses it; a newline made a Job that could never start)
_IMAGE = re.compile(r"^[^\s\x00-\x1f\x7f]{1,4096}$")
# a Kubernetes resource quantity, as the API server parses it
_QUANTITY = re.compile(
    r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)
_INT32 = 2**31 - 1
MAX_GPUS = 64  # more than any node offers: a pod asking for more could never be scheduled


def float_quantity(text: str) -> float:
    """A quantity's number, units folded in (only to tell zero from more)."""
    m = re.match(r"^([0-9.]+)", text)
    return float(m.group(1)) if m and m.group(1) != "." else 0.0


# Kubernetes' limit on completions of an Indexed Job with backoffLimitPerIndex
MAX_INDEXED_POINTS = 100_000
# the worker runs point $JOB_COMPLETION_INDEX of the sweep in SPOTBOOK_RUN_DIR
SWEEP_ENV = "SPOTBOOK_SWEEP_POINTS"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_DNS_SUBDOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_SECRET_ITEM = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
# names whose values are probably secret: they belong in a Secret, not the Job spec
_SECRET_LOOKING = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def job_name(run_id: str) -> str:
    """The Job's name for a run: ``sb-`` and the run id, as a DNS label."""
    name = "sb-" + re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    return name[:63].rstrip("-")


def parse_gpu(text: str | None) -> tuple[str | None, int]:
    """``--gpu TYPE[:COUNT]`` (or just COUNT) to (type, count)."""
    if not text:
        return None, 0
    kind, _, count = text.partition(":")
    if kind.isdigit() and not count:
        return None, int(kind)
    try:
        n = int(count) if count else 1
    except ValueError:
        raise UsageError(
            f"--gpu {text!r}: COUNT must be a whole number, as in nvidia-l4:2"
        ) from None
    if n < 1:
        raise UsageError(f"--gpu {text!r}: COUNT must be at least 1")
    if not _LABEL_VALUE.match(kind):
        raise UsageError(f"--gpu {text!r}: TYPE must look like a node label value (nvidia-l4)")
    return kind, n


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, flag: str) -> int:
    """Seconds from ``90``, ``90s``, ``15m``, ``6h`` or ``2d``."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text or "")
    if not m:
        raise UsageError(f"{flag} {text!r}: give seconds or a duration such as 90s, 15m, 6h, 2d")
    return int(m.group(1)) * _UNITS[m.group(2) or "s"]


# variables the pod's container gets from spotbook itself (``job_manifest``): a second
# entry from --env or --secret-env would silently override or shadow them
RESERVED_ENV = frozenset(
    {
        "SPOTBOOK_RUN_DIR",
        "SPOTBOOK_IMAGE",
        SWEEP_ENV,
        "POD_NAME",
        "POD_NAMESPACE",
        "NODE_NAME",
        "HOME",
        "TMPDIR",
        "SPOTBOOK_RUN_TMP",
        "SPOTBOOK_PROVIDER",
        "SPOTBOOK_CAPACITY",
        "SPOTBOOK_SNAPSHOT_KEY_FILE",
        "SPOTBOOK_SNAPSHOT_KEY",
    }
)


def _free_name(flag: str, item: str, name: str, seen: set[str]) -> None:
    if name == LEGACY_ENV:
        raise UsageError(
            f"{flag} {item!r}: a pod never trusts a store without seals (it would load "
            "whatever a writer of the bucket put there); resume such a run on your own "
            f"machine, with {LEGACY_ENV}=1 there"
        )
    if name in RESERVED_ENV:
        raise UsageError(
            f"{flag} {item!r}: spotbook sets {name} in the pod itself (the run store, the "
            "work directory, the key: see docs/kubernetes.md); use another name"
            + (" (the run key goes in --key-secret)" if "KEY" in name else "")
        )
    if name in seen:
        raise UsageError(f"{flag} {item!r}: {name} is given twice (--env and --secret-env)")
    seen.add(name)


def parse_env(items: list[str], seen: set[str] | None = None) -> tuple[tuple[str, str], ...]:
    """``NAME=VALUE`` items as pairs, refusing bad or repeated names."""
    out = []
    seen = set() if seen is None else seen
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise UsageError(f"--env {item!r}: give NAME=VALUE")
        _free_name("--env", item, name, seen)
        out.append((name, value))
    return tuple(out)


def secret_looking(names: list[str]) -> list[str]:
    """Names given to --env whose values are probably secret (they land in the Job spec)."""
    return [n for n in names if _SECRET_LOOKING.search(n)]


def parse_secret_env(
    items: list[str], seen: set[str] | None = None
) -> tuple[tuple[str, str, str], ...]:
    """``NAME=SECRET:KEY`` items of --secret-env (``seen``: the names --env took)."""
    out = []
    seen = set() if seen is None else seen
    for item in items:
        name, sep, ref = item.partition("=")
        secret, colon, key = ref.partition(":")
        if not sep or not colon or not _ENV_NAME.match(name) or not _SECRET_ITEM.match(key):
            raise UsageError(
                f"--secret-env {item!r}: give NAME=SECRET:KEY (the variable NAME gets item "
                "KEY of the Kubernetes Secret SECRET)"
            )
        if not _DNS_SUBDOMAIN.match(secret):
            raise UsageError(f"--secret-env {item!r}: {secret!r} is not a valid Secret name")
        _free_name("--secret-env", item, name, seen)
        out.append((name, secret, key))
    return tuple(out)


def gpu_label_values(label: str, gpu_type: str) -> list[str]:
    """What a node label says for this GPU type: each autoscaler spells it its own way."""
    if label == gpus.LABEL_KARPENTER_GPU:
        return [gpus.karpenter_name(gpu_type)]
    if label == gpus.LABEL_GFD_PRODUCT:
        return gpus.products(gpu_type)
    return [gpus.canonical(gpu_type)]


def _affinity(opts: JobOptions, provider: Provider) -> dict[str, Any] | None:
    def gpu(label: str) -> list[dict[str, Any]]:
        if not opts.gpu_type:
            return []
        return [{"key": label, "operator": "In", "values": gpu_label_values(label, opts.gpu_type)}]

    kinds = provider.spot_kinds
    if opts.spot:
        # one term per kind of spot node: a node matching any of them will do
        terms = [[{"key": k, "operator": "In", "values": [v]}, *gpu(g)] for k, v, g in kinds]
        if not terms and opts.gpu_type:
            terms = [gpu(provider.gpu_type_label)]
    else:
        avoid = [{"key": k, "operator": "NotIn", "values": [v]} for k, v, _ in kinds]
        labels = list(dict.fromkeys(g for _, _, g in kinds)) or [provider.gpu_type_label]
        terms = [[*avoid, *gpu(g)] for g in labels] if opts.gpu_type else [avoid]
        terms = [t for t in terms if t]
    if not terms:
        return None
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
            }
        }
    }


def _tolerations(opts: JobOptions, provider: Provider) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if opts.spot:
        out += [
            {"key": k, "operator": "Equal", "value": v, "effect": "NoSchedule"}
            for k, v in provider.spot_taints
        ]
    if opts.gpu_count:
        out.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    out += [
        {
            "key": key,
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": NODE_GONE_SECONDS,
        }
        for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
    ]
    return out


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def build_job(opts: JobOptions) -> dict[str, Any]:
    """The ``batch/v1`` Job for one run."""
    provider = PROVIDERS[opts.provider]
    labels = {
        LABEL_MANAGED: "spotbook",
        "app.kubernetes.io/name": "spotbook",
        LABEL_RUN: opts.run_id,
        **opts.extra_labels,
    }
    pod_labels = dict(labels)
    if opts.provider == "aks" and opts.service_account:
        # AKS's workload identity webhook injects the token only into pods that ask
        pod_labels["azure.workload.identity/use"] = "true"
    job_labels = dict(labels)
    if opts.queue:
        job_labels[LABEL_QUEUE] = opts.queue
    env = [
        {"name": "SPOTBOOK_RUN_DIR", "value": opts.run_dir},
        {"name": "SPOTBOOK_IMAGE", "value": opts.image},
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        _field_env("NODE_NAME", "spec.nodeName"),
        *({"name": k, "value": v} for k, v in opts.env),
        *(
            {"name": n, "valueFrom": {"secretKeyRef": {"name": s, "key": k}}}
            for n, s, k in opts.secret_env
        ),
    ]
    if opts.points is not None:
        env.insert(1, {"name": SWEEP_ENV, "value": "1"})
    else:  # the run this Job is for: the worker refuses a store holding another one
        env.insert(1, {"name": "SPOTBOOK_RUN_ID", "value": opts.run_id})
    # where each attempt runs, recorded for `spotbook cost` (machine type and region
    # come from the node's metadata server)
    env += [
        {"name": "HOME", "value": f"{WORK_MOUNT}/.home"},
        {"name": "TMPDIR", "value": f"{WORK_MOUNT}/.tmp"},
        {"name": "SPOTBOOK_RUN_TMP", "value": f"{WORK_MOUNT}/.tmp"},
    ]
    env.append({"name": "SPOTBOOK_PROVIDER", "value": opts.provider})
    env.append({"name": "SPOTBOOK_CAPACITY", "value": "spot" if opts.spot else "on-demand"})
    if opts.key_secret:
        key_file = f"{KEY_MOUNT}/{KEY_SECRET_ITEM}"
        env.append({"name": "SPOTBOOK_SNAPSHOT_KEY_FILE", "value": key_file})
    requests: dict[str, str] = {"ephemeral-storage": opts.work_storage}
    limits: dict[str, str] = {}
    if opts.cpu:
        requests["cpu"] = opts.cpu
    if opts.memory:
        requests["memory"] = limits["memory"] = opts.memory
    if opts.gpu_count:
        limits[GPU_RESOURCE] = str(opts.gpu_count)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": opts.image,
        "command": ["spotbook", "worker"],
        "env": env,
        # Pod Security "restricted": the image must run as a non-root (numeric) user, as
        # spotbook's images do (USER 1000)
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if opts.env_from_secrets:
        container["envFrom"] = [{"secretRef": {"name": s}} for s in opts.env_from_secrets]
    container["workingDir"] = WORK_MOUNT
    container["volumeMounts"] = [{"name": WORK_VOLUME, "mountPath": WORK_MOUNT}]
    if opts.key_secret:
        container["volumeMounts"].append(
            {"name": "spotbook-run-key", "mountPath": KEY_MOUNT, "readOnly": True}
        )
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": stop_seconds(opts.grace),
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "tolerations": _tolerations(opts, provider),
    }
    affinity = _affinity(opts, provider)
    if affinity:
        pod_spec["affinity"] = affinity
    pod_spec["volumes"] = [{"name": WORK_VOLUME, "emptyDir": {"sizeLimit": opts.work_storage}}]
    if opts.key_secret:
        pod_spec["volumes"] += [
            {
                "name": "spotbook-run-key",
                "secret": {
                    "secretName": opts.key_secret,
                    "items": [{"key": KEY_SECRET_ITEM, "path": KEY_SECRET_ITEM}],
                    # readable by the image's user whatever its uid (the files
                    # are root's unless the pod sets an fsGroup); only this pod's
                    # container sees the volume
                    "defaultMode": 0o444,
                },
            }
        ]
    if opts.service_account:
        pod_spec["serviceAccountName"] = opts.service_account
    spec: dict[str, Any] = {
        "backoffLimit": opts.backoff_limit,
        "podReplacementPolicy": "Failed",
        "podFailurePolicy": {
            "rules": [
                # first match wins: a disrupted pod is never held against the run
                # (status is defaulted by servers, but not by validators and policy
                # engines, which then reject the rule)
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                },
                {
                    # a sweep fails only the point: the other points go on
                    "action": "FailJob" if opts.points is None else "FailIndex",
                    "onExitCodes": {
                        "containerName": CONTAINER,
                        "operator": "In",
                        "values": sorted(EXIT_CODES_FAIL_JOB),
                    },
                },
            ]
        },
        "template": {
            "metadata": {
                "labels": pod_labels,
                # autoscalers must not move a running notebook to save a node: the
                # cluster autoscaler reads the first, Karpenter the second
                "annotations": {
                    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                    "karpenter.sh/do-not-disrupt": "true",
                },
            },
            "spec": pod_spec,
        },
    }
    if opts.points is not None:
        # One pod per point (JOB_COMPLETION_INDEX). backoffLimitPerIndex and
        # maxFailedIndexes (with the FailIndex action above) are beta from Kubernetes
        # 1.29, on by default, and GA in 1.33; completionMode Indexed is GA since 1.24.
        del spec["backoffLimit"]
        spec.update(
            completionMode="Indexed",
            completions=opts.points,
            parallelism=opts.parallelism or opts.points,
            backoffLimitPerIndex=opts.backoff_limit,
            maxFailedIndexes=(
                opts.points if opts.max_failed_points is None else opts.max_failed_points
            ),
        )
    if opts.ttl_seconds is not None:
        spec["ttlSecondsAfterFinished"] = opts.ttl_seconds
    if opts.deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = opts.deadline_seconds
    if opts.queue:
        # Kueue starts the Job by unsuspending it when its queue admits it. Created
        # suspended (as Kueue's own examples are), no pod starts outside the queue even
        # where Kueue's webhook does not see the Job; `status` then says "queued". The
        # deadline does not run while the Job is suspended.
        spec["suspend"] = True
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(opts.run_id),
            "namespace": opts.namespace,
            "labels": job_labels,
            "annotations": {
                ANNOTATION_RUN_DIR: opts.run_dir,
                **({ANNOTATION_SOURCE: opts.source} if opts.source else {}),
            },
        },
        "spec": spec,
    }
