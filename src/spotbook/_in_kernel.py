"""Helpers for the notebook itself, used inside a kernel that spotbook runs."""

from __future__ import annotations

import os
import tempfile


def preempted() -> bool:
    """True once the runner has received a termination notice (SIGTERM).

    A long training loop polls this, saves its state into :func:`checkpoint_dir`
    and returns; the runner then commits the cell and exits with code 75.
    Outside spotbook it is always False.
    """
    path = os.environ.get("SPOTBOOK_NOTICE_FILE")
    return bool(path) and os.path.exists(path)  # type: ignore[arg-type]


def checkpoint_dir() -> str:
    """A directory for the notebook's own checkpoints during this run.

    Outside spotbook, a fresh temporary directory.
    """
    path = os.environ.get("SPOTBOOK_CHECKPOINT_DIR")
    if not path:
        path = os.environ.setdefault("SPOTBOOK_CHECKPOINT_DIR", tempfile.mkdtemp(prefix="ckpt-"))
    os.makedirs(path, exist_ok=True)
    return path
