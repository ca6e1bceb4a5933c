"""The worker image the container tests run (tests/test_podman.py), built with rootful podman.

No container registry is reachable here, so the base is made locally: `debootstrap`
(Debian's minimal bookworm with python3, from this machine's own apt mirror) imported
with `podman import`, and cached under .cache/containers/. The CPU image is built from
the checkout on that base (docker/Dockerfile's BASE argument).

scripts/check.sh starts this module in the background as soon as podman is installed
(`python -m tests.container_image`), so the base and the image are made while the rest of
the setup and the linters run, on a core they leave idle. The tests' fixture calls the
same `build_image`: an exclusive lock on .cache/containers/build.lock makes it wait for a
build under way (an event, not a guess), after which its own `podman build` finds every
layer cached. A background build that failed is simply done again by the fixture, which
then fails with podman's own message.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parent.parent
CONF = Path(__file__).parent / "containers.conf"
CACHE = ROOT / ".cache" / "containers"
BASE = "localhost/spotbook-base:bookworm"
IMAGE = "localhost/spotbook:test"
CA = "/etc/ssl/certs/ca-certificates.crt"


def podman(
    *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "CONTAINERS_CONF": str(CONF)},
        timeout=timeout,
        check=False,
    )
    if check and r.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r


def podman_works() -> str:
    """Why podman cannot run containers here, or ""."""
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/check.sh installs it where it runs as root)"
    if os.geteuid() != 0:
        return "the container tests use rootful podman"
    r = podman("info", check=False, timeout=120)
    return "" if r.returncode == 0 else f"`podman info` fails: {r.stderr.strip()[-300:]}"


def _apt_mirror() -> str:
    """This machine's Debian mirror, from its own apt sources."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    for line in Path("/etc/apt/sources.list").read_text().splitlines():
        if line.startswith("deb ") and "security" not in line:
            return line.split()[1]
    raise AssertionError("no Debian mirror in /etc/apt sources for debootstrap")


def _base_image() -> None:
    """The local base (Debian bookworm minbase with python3 and venv), made once."""
    if podman("image", "exists", BASE, check=False).returncode == 0:
        return
    cached = CACHE / "base-bookworm.tar"
    if cached.exists():
        podman("load", "-i", str(cached))
        return
    assert shutil.which("debootstrap"), "debootstrap is installed by scripts/check.sh"
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv,ca-certificates",
                "bookworm",
                str(rootfs),
                _apt_mirror(),
            ],
            check=True,
            capture_output=True,
            timeout=900,
        )
        archive = Path(tmp) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".")
        podman("import", str(archive), BASE)
    CACHE.mkdir(parents=True, exist_ok=True)
    podman("save", "-o", str(cached), BASE)


def build_image() -> float:
    """Build the CPU worker image from this checkout (waiting first for a build another
    process has under way); the seconds this call's own build took."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _base_image()
        t0 = time.monotonic()
        podman(
            "build",
            "--network",
            "host",
            "-v",
            f"{CA}:{CA}:ro",  # pip inside the build reaches the package index over TLS
            "--build-arg",
            f"BASE={BASE}",
            "-f",
            "docker/Dockerfile",
            "-t",
            IMAGE,
            str(ROOT),
            timeout=1800,
        )
        return time.monotonic() - t0


if __name__ == "__main__":
    why = podman_works()
    if why:
        print(f"container image: not built ({why})")
        sys.exit(0)
    t0 = time.monotonic()
    build_image()
    print(f"container image: base and image built in {time.monotonic() - t0:.1f} s")
