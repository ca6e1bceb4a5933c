"""spotbook: run Jupyter notebooks as batch jobs that survive preemption.

Inside a notebook run by spotbook, :func:`preempted` and :func:`checkpoint_dir`
help a long cell save its own progress before the node goes away.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._api import execute_notebook, prepare_run, resume_run
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
    RunNotFoundError,
    RunTimeoutError,
    SnapshotIntegrityError,
    SpotbookError,
    StorageError,
    SupersededError,
    Terminated,
    UsageError,
)
from ._in_kernel import checkpoint_dir, preempted
from ._models import Limits, RunStatus, SnapshotMode, SnapshotPolicy

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
    "RunNotFoundError",
    "RunStatus",
    "RunTimeoutError",
    "SnapshotIntegrityError",
    "SnapshotMode",
    "SnapshotPolicy",
    "SpotbookError",
    "StorageError",
    "SupersededError",
    "Terminated",
    "UsageError",
    "checkpoint_dir",
    "execute_notebook",
    "preempted",
    "prepare_run",
    "resume_run",
]
