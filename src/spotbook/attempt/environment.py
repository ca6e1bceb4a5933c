"""Where an attempt runs: host, pod and node (Kubernetes downward API), image, GPUs."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping

from .._models import AttemptRecord

# Environment variables the Job manifest sets from the downward API (and the image).
POD_ENV = {
    "pod": "POD_NAME",
    "namespace": "POD_NAMESPACE",
    "node": "NODE_NAME",
    "image": "SPOTBOOK_IMAGE",
}
_GPU_FIELDS = ("index", "name", "memory.total", "driver_version", "uuid")


def process_started(pid: int | str = "self") -> float | None:
    """When process ``pid`` started (wall clock, ~10 ms), from /proc; None where there is
    none (no /proc, or no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str | None:
    """This machine's boot id (Linux): another one means another machine, or a reboot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read(64).strip() or None
    except OSError:
        return None


def where() -> AttemptRecord:
    """Host, pid and the Kubernetes placement, as far as the environment tells."""
    out: AttemptRecord = {"host": socket.gethostname(), "pid": os.getpid()}
    boot = boot_id()
    if boot:
        out["boot_id"] = boot
    started = process_started()
    if started is not None:
        out["process_started"] = round(started, 3)
    for key, var in POD_ENV.items():
        value = os.environ.get(var)
        if value:
            out[key] = value  # type: ignore[literal-required]  # POD_ENV's keys are fields
    if "pod" not in out and os.environ.get("KUBERNETES_SERVICE_HOST"):
        out["pod"] = socket.gethostname()  # a pod's hostname is its name
    return out


def nvidia_gpus(timeout: float = 10.0) -> list[dict[str, str]] | None:
    """GPUs as ``nvidia-smi`` lists them; None when it is not installed or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, f"--query-gpu={','.join(_GPU_FIELDS)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    rows = csv.reader(io.StringIO(proc.stdout), skipinitialspace=True)
    return [dict(zip(_GPU_FIELDS, row, strict=False)) for row in rows if row]


# Set by the Job (kube.manifest) so every attempt records where it ran, for `cost`.
MACHINE_ENV = {
    "provider": "SPOTBOOK_PROVIDER",
    "capacity": "SPOTBOOK_CAPACITY",  # spot | on-demand
    "machine_type": "SPOTBOOK_MACHINE_TYPE",
    "region": "SPOTBOOK_REGION",
}
_METADATA_HOST = {
    "gke": "http://metadata.google.internal",
    "eks": "http://169.254.169.254",
    "aks": "http://169.254.169.254",
}


def machine(env: Mapping[str, str] | None = None, timeout: float = 1.0) -> dict[str, str]:
    """The machine an attempt runs on: provider and capacity from the Job's variables,
    machine type, region and capacity from the cloud's metadata server (in a pod of a
    known provider only; ``SPOTBOOK_METADATA_URL`` points elsewhere, for tests). Empty
    where nothing is known (a local run)."""
    env = os.environ if env is None else env
    out = {k: env[v] for k, v in MACHINE_ENV.items() if env.get(v)}
    provider = out.get("provider")
    if provider in _METADATA_HOST and not ("machine_type" in out and "region" in out):
        base = env.get("SPOTBOOK_METADATA_URL") or _METADATA_HOST[provider]
        try:
            found = _ask_metadata(provider, base.rstrip("/"), timeout)
        except (OSError, ValueError, KeyError) as exc:
            found = {"metadata_error": f"{type(exc).__name__}: {exc}"[:200]}
        for k, v in found.items():
            out.setdefault(k, v)
    return out


def _get(url: str, timeout: float, headers: dict[str, str], method: str = "GET") -> str:
    import urllib.request

    req = urllib.request.Request(url, headers=headers, method=method)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return str(resp.read().decode())


def _ask_metadata(provider: str, base: str, timeout: float) -> dict[str, str]:
    if provider == "gke":
        h = {"Metadata-Flavor": "Google"}
        root = f"{base}/computeMetadata/v1/instance"
        zone = _get(f"{root}/zone", timeout, h).rsplit("/", 1)[-1]
        model = _get(f"{root}/scheduling/provisioning-model", timeout, h).strip().upper()
        return {
            "machine_type": _get(f"{root}/machine-type", timeout, h).rsplit("/", 1)[-1],
            "zone": zone,
            "region": zone.rsplit("-", 1)[0],
            "capacity": "spot" if model in ("SPOT", "PREEMPTIBLE") else "on-demand",
        }
    if provider == "eks":  # IMDSv2: a session token first
        token = _get(
            f"{base}/latest/api/token",
            timeout,
            {"X-aws-ec2-metadata-token-ttl-seconds": "60"},
            method="PUT",
        )
        h = {"X-aws-ec2-metadata-token": token}
        life = _get(f"{base}/latest/meta-data/instance-life-cycle", timeout, h).strip()
        return {
            "machine_type": _get(f"{base}/latest/meta-data/instance-type", timeout, h).strip(),
            "zone": _get(f"{base}/latest/meta-data/placement/availability-zone", timeout, h),
            "region": _get(f"{base}/latest/meta-data/placement/region", timeout, h).strip(),
            "capacity": "spot" if life == "spot" else "on-demand",
        }
    url = f"{base}/metadata/instance/compute?api-version=2021-02-01"
    compute = json.loads(_get(url, timeout, {"Metadata": "true"}))
    return {
        "machine_type": str(compute["vmSize"]),
        "region": str(compute["location"]),
        "zone": str(compute.get("zone") or ""),
        "capacity": "spot" if str(compute.get("priority")).lower() == "spot" else "on-demand",
    }
