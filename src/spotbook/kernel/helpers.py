"""Helpers for the notebook itself, used inside a kernel that spotbook runs."""

from __future__ import annotations

import contextlib
import os
import tempfile


def preempted() -> bool:
    """True once the runner has received a termination notice (SIGTERM).

    A long training loop polls this, saves its state into :func:`checkpoint_dir`
    and returns (or raises). A cell that saw True is not recorded as finished: the
    runner saves the checkpoint directory, exits with code 75, and the resumed run
    executes the cell again, which then picks up from its checkpoint files.
    Outside spotbook it is always False.
    """
    path = os.environ.get("SPOTBOOK_NOTICE_FILE")
    if not path or not os.path.exists(path):
        return False
    with contextlib.suppress(OSError), open(path + ".seen", "w"):
        pass  # tells the runner this cell stopped because of the notice
    return True


def checkpoint_dir() -> str:
    """A directory for the notebook's own checkpoints during this run.

    It holds what the run's earlier attempts saved there. On an object-store run it
    is a local directory that the runner syncs to the store every
    ``--checkpoint-interval`` seconds and after a termination notice. Replace files
    atomically (write a temporary name, then ``os.replace``) so a sync never sees
    half a file. Outside spotbook, a fresh temporary directory.
    """
    path = os.environ.get("SPOTBOOK_CHECKPOINT_DIR")
    if not path:
        path = os.environ.setdefault("SPOTBOOK_CHECKPOINT_DIR", tempfile.mkdtemp(prefix="ckpt-"))
    os.makedirs(path, exist_ok=True)
    return path
