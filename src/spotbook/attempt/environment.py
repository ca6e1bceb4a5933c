"""Where an attempt runs: host, pod and node (Kubernetes downward API), image, GPUs."""

from __future__ import annotations

import csv
import io
import os
import shutil
import socket
import subprocess
import time

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


def where() -> AttemptRecord:
    """Host, pid and the Kubernetes placement, as far as the environment tells."""
    out: AttemptRecord = {"host": socket.gethostname(), "pid": os.getpid()}
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
