"""Opt-in: a real run on a real cluster. Runs only when these are set:

KUBECONFIG               a kubeconfig whose current context is the cluster
SPOTBOOK_LIVE_RUN_DIR    a bucket URL the cluster's pods can write (e.g. gs://b/ci)
SPOTBOOK_LIVE_IMAGE      an image built from docker/Dockerfile
SPOTBOOK_LIVE_ARGS       optional extra submit flags (e.g. "--gpu nvidia-l4 --spot")

.venv/bin/python -m pytest -m cluster tests/test_live_cluster.py
"""

from __future__ import annotations

import os
import secrets
import shlex
from pathlib import Path

import pytest

from .conftest import cli

NEEDED = ("KUBECONFIG", "SPOTBOOK_LIVE_RUN_DIR", "SPOTBOOK_LIVE_IMAGE")
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        not all(os.environ.get(v) for v in NEEDED),
        reason=f"opt-in: set {', '.join(NEEDED)} to run against a live cluster",
    ),
]


def test_submit_wait_on_a_live_cluster(work: Path) -> None:
    rd = f"{os.environ['SPOTBOOK_LIVE_RUN_DIR'].rstrip('/')}/live-{secrets.token_hex(4)}"
    extra = shlex.split(os.environ.get("SPOTBOOK_LIVE_ARGS", "--on-demand"))
    r = cli(
        "submit",
        "params.ipynb",
        "--run-dir",
        rd,
        "--image",
        os.environ["SPOTBOOK_LIVE_IMAGE"],
        "--wait",
        *extra,
        cwd=work,
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr
    status = cli("status", rd, cwd=work)
    assert "succeeded" in status.stdout
