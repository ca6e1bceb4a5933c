"""Which machine carries which GPUs, and how each autoscaler names them: one table.

A cloud's GPU machines come with a fixed number of GPUs (a G2 machine with 2 L4s is
``g2-standard-24``; asking for ``g2-standard-8`` with 2 L4s is refused when the pool is
created), so machines are looked up by (GPU type, count), and a pair no machine offers is
refused with the counts that exist. Node labels differ per autoscaler:

- GKE labels GPU nodes ``cloud.google.com/gke-accelerator=<GKE's type name>``; spotbook's
  names are GKE's (``nvidia-l4``, ``nvidia-tesla-t4``);
- Karpenter labels ``karpenter.k8s.aws/instance-gpu-name`` (``l4``, ``t4``, ``a100``);
- GPU Feature Discovery labels ``nvidia.com/gpu.product`` with the driver's device name
  (``NVIDIA-L4``, ``Tesla-T4``);
- EKS managed node groups and AKS node pools have no GPU-type label of their own: the plans
  give them ``spotbook.dev/gpu=<spotbook's name>``, which the Job selects.

Machine types are from the providers' documentation of their GPU machine families
(GKE: G2, A2, A3, N1; EC2: g4dn, g5, g6, g6e, p3, p4d, p4de, p5; Azure: NCasT4_v3,
NCv3, NC_A100_v4, ND A100 v4, ND H100 v5), as of the date in ``CATALOGUE_DATE``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._errors import UsageError

CATALOGUE_DATE = "2026-11"
LABEL_SPOTBOOK_GPU = "spotbook.dev/gpu"
LABEL_SPOTBOOK_GPU_POOL = "spotbook.dev/gpu-pool"  # on the plans' GPU pools (AKS)
LABEL_GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
LABEL_KARPENTER_GPU = "karpenter.k8s.aws/instance-gpu-name"
LABEL_GFD_PRODUCT = "nvidia.com/gpu.product"
CLOUDS = ("gke", "eks", "aks")
# what `plan` uses when --gpu gives a count only, or nothing
DEFAULT_GPU = {"gke": "nvidia-l4", "eks": "nvidia-l4", "aks": "nvidia-tesla-t4"}


@dataclass(frozen=True)
class Gpu:
    """One GPU model: its name on each cloud and its labels."""

    name: str  # spotbook's name: GKE's accelerator type
    aliases: tuple[str, ...]
    karpenter: str | None  # karpenter.k8s.aws/instance-gpu-name
    products: tuple[str, ...]  # nvidia.com/gpu.product values (GPU Feature Discovery)
    # GPUs per machine -> the default machine type, per cloud
    machines: dict[str, dict[int, str]] = field(default_factory=dict)


GPUS: tuple[Gpu, ...] = (
    Gpu(
        "nvidia-l4",
        ("l4",),
        "l4",
        ("NVIDIA-L4",),
        {
            "gke": {
                1: "g2-standard-8",
                2: "g2-standard-24",
                4: "g2-standard-48",
                8: "g2-standard-96",
            },
            "eks": {1: "g6.xlarge", 4: "g6.12xlarge", 8: "g6.48xlarge"},
        },
    ),
    Gpu(
        "nvidia-tesla-t4",
        ("t4", "nvidia-t4"),
        "t4",
        ("Tesla-T4",),
        {
            "gke": {1: "n1-standard-8", 2: "n1-standard-16", 4: "n1-standard-32"},
            "eks": {1: "g4dn.xlarge", 4: "g4dn.12xlarge", 8: "g4dn.metal"},
            "aks": {1: "Standard_NC4as_T4_v3", 4: "Standard_NC64as_T4_v3"},
        },
    ),
    Gpu(
        "nvidia-tesla-v100",
        ("v100", "nvidia-v100"),
        "v100",
        ("Tesla-V100-SXM2-16GB", "Tesla-V100-SXM2-32GB", "Tesla-V100-PCIE-16GB"),
        {
            "gke": {
                1: "n1-standard-8",
                2: "n1-standard-16",
                4: "n1-standard-32",
                8: "n1-standard-64",
            },
            "eks": {1: "p3.2xlarge", 4: "p3.8xlarge", 8: "p3.16xlarge"},
            "aks": {1: "Standard_NC6s_v3", 2: "Standard_NC12s_v3", 4: "Standard_NC24s_v3"},
        },
    ),
    Gpu(
        "nvidia-tesla-p100",
        ("p100", "nvidia-p100"),
        None,
        ("Tesla-P100-PCIE-16GB",),
        {"gke": {1: "n1-standard-8", 2: "n1-standard-16", 4: "n1-standard-32"}},
    ),
    Gpu(
        "nvidia-tesla-a100",
        ("a100", "nvidia-a100", "nvidia-a100-40gb"),
        "a100",
        ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"),
        {
            "gke": {
                1: "a2-highgpu-1g",
                2: "a2-highgpu-2g",
                4: "a2-highgpu-4g",
                8: "a2-highgpu-8g",
                16: "a2-megagpu-16g",
            },
            "eks": {8: "p4d.24xlarge"},
            "aks": {8: "Standard_ND96asr_v4"},
        },
    ),
    Gpu(
        "nvidia-a100-80gb",
        ("a100-80gb",),
        "a100",
        ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"),
        {
            "gke": {
                1: "a2-ultragpu-1g",
                2: "a2-ultragpu-2g",
                4: "a2-ultragpu-4g",
                8: "a2-ultragpu-8g",
            },
            "eks": {8: "p4de.24xlarge"},
            "aks": {
                1: "Standard_NC24ads_A100_v4",
                2: "Standard_NC48ads_A100_v4",
                4: "Standard_NC96ads_A100_v4",
                8: "Standard_ND96amsr_A100_v4",
            },
        },
    ),
    Gpu(
        "nvidia-h100-80gb",
        ("h100", "nvidia-h100"),
        "h100",
        ("NVIDIA-H100-80GB-HBM3",),
        {
            "gke": {1: "a3-highgpu-1g", 2: "a3-highgpu-2g", 4: "a3-highgpu-4g", 8: "a3-highgpu-8g"},
            "eks": {8: "p5.48xlarge"},
            "aks": {8: "Standard_ND96isr_H100_v5"},
        },
    ),
    Gpu(
        "nvidia-h100-mega-80gb",
        ("h100-mega",),
        "h100",
        ("NVIDIA-H100-80GB-HBM3",),
        {"gke": {8: "a3-megagpu-8g"}},
    ),
    Gpu(
        "nvidia-a10g",
        ("a10g",),
        "a10g",
        ("NVIDIA-A10G",),
        {"eks": {1: "g5.xlarge", 4: "g5.12xlarge", 8: "g5.48xlarge"}},
    ),
    Gpu(
        "nvidia-l40s",
        ("l40s",),
        "l40s",
        ("NVIDIA-L40S",),
        {"eks": {1: "g6e.xlarge", 4: "g6e.12xlarge", 8: "g6e.48xlarge"}},
    ),
)

_BY_NAME = {n: g for g in GPUS for n in (g.name, *g.aliases)}


def find(name: str | None) -> Gpu | None:
    """The GPU type spotbook knows by this name or alias (any case), or None."""
    return _BY_NAME.get((name or "").lower())


def canonical(name: str) -> str:
    """spotbook's name for a GPU type (unknown names are kept as given)."""
    gpu = find(name)
    return gpu.name if gpu else name


def known_names(cloud: str | None = None) -> list[str]:
    """The GPU names ``--gpu`` accepts (on ``cloud``, or anywhere)."""
    return [g.name for g in GPUS if cloud is None or g.machines.get(cloud)]


def machine_for(cloud: str, name: str, count: int) -> str:
    """The default machine type for ``count`` GPUs of type ``name`` on ``cloud``;
    UsageError naming what exists when no machine carries that many."""
    gpu = find(name)
    table = gpu.machines.get(cloud, {}) if gpu else {}
    flag = "--machine-type"
    if not table:
        offered = ", ".join(known_names(cloud))
        raise UsageError(
            f"--gpu {name}: spotbook has no {cloud.upper()} machine for this GPU type "
            f"(it knows {offered}); pass {flag} with a machine that carries it"
        )
    if count not in table:
        assert gpu is not None
        counts = ", ".join(str(c) for c in sorted(table))
        others = [g.name for g in GPUS if count in g.machines.get(cloud, {}) and g is not gpu]
        also = f"; {count} per machine: {', '.join(others)}" if others else ""
        known_as = "" if name == gpu.name else f" ({gpu.name})"
        raise UsageError(
            f"--gpu {name}:{count}: {cloud.upper()} machines carry {counts} x "
            f"{name}{known_as} (no machine has {count}){also}; or pass {flag} with a "
            "machine that does"
        )
    return table[count]


def karpenter_name(name: str) -> str:
    """The GPU's name as Karpenter's instance-gpu-name label gives it."""
    gpu = find(name)
    if gpu is None or gpu.karpenter is None:
        known = ", ".join(g.name for g in GPUS if g.karpenter)
        raise UsageError(
            f"--gpu {name}: spotbook does not know Karpenter's name for this GPU type "
            f"(it knows {known}); use --provider generic with the node label value "
            "GPU Feature Discovery gives it (e.g. NVIDIA-L4)"
        )
    return gpu.karpenter


def products(name: str) -> list[str]:
    """``nvidia.com/gpu.product`` values for a GPU type; an unknown name is taken as a
    product value itself (so ``--gpu NVIDIA-L4`` works as written)."""
    gpu = find(name)
    return list(gpu.products) if gpu else [name]
