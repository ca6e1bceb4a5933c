"""spotbook: run Jupyter notebooks as batch jobs that survive preemption.

Inside a notebook run by spotbook, :func:`preempted` and :func:`checkpoint_dir`
help a long cell save its own progress before the node goes away.
"""

from __future__ import annotations

__version__ = "0.1.0"

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import (
    CellError,
    CellExecutionError,
    CellTimeoutError,
    ExecutionTimeoutError,
    InputChangedError,
    InputNotFoundError,
    KernelDiedError,
    KernelNotFoundError,
    NotebookFormatError,
    ParameterError,
    PreemptionBudgetError,
    ResumeRefusedError,
    RunNotFoundError,
    RunTimeoutError,
    SnapshotIntegrityError,
    SpotbookError,
    StorageError,
    StoreIntegrityError,
    SupersededError,
    Terminated,
    UsageError,
)
from ._models import Limits, RunStatus, SnapshotMode, SnapshotPolicy
from .kernel.helpers import checkpoint_dir, preempted

if TYPE_CHECKING:
    from ._api import execute_notebook, inspect_notebook, prepare_run, resume_run

# The runner side (nbclient, jupyter_client) loads on first use: a kernel that imports
# spotbook for preempted()/checkpoint_dir(), or for snapshots, must not pay for it
# (importing jupyter_client into a kernel slows every later cell).
_LAZY = {
    "execute_notebook": "._api",
    "inspect_notebook": "._api",
    "prepare_run": "._api",
    "resume_run": "._api",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spotbook' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "CellError",
    "CellExecutionError",
    "CellTimeoutError",
    "ExecutionTimeoutError",
    "InputChangedError",
    "InputNotFoundError",
    "KernelDiedError",
    "KernelNotFoundError",
    "Limits",
    "NotebookFormatError",
    "ParameterError",
    "PreemptionBudgetError",
    "ResumeRefusedError",
    "RunNotFoundError",
    "RunStatus",
    "RunTimeoutError",
    "SnapshotIntegrityError",
    "SnapshotMode",
    "SnapshotPolicy",
    "SpotbookError",
    "StorageError",
    "StoreIntegrityError",
    "SupersededError",
    "Terminated",
    "UsageError",
    "checkpoint_dir",
    "execute_notebook",
    "inspect_notebook",
    "preempted",
    "prepare_run",
    "resume_run",
]
