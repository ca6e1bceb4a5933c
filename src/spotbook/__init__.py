"""spotbook: run Jupyter notebooks as batch jobs that survive preemption.

Inside a notebook run by spotbook, :func:`preempted` and :func:`checkpoint_dir`
help a long cell save its own progress before the node goes away.
"""

from __future__ import annotations

from ._early import catch_if_command

catch_if_command()  # the `spotbook` command: a stop in its first instants is exit 75

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import (
    CellError,
    CellExecutionError,
    CellTimeoutError,
    ClusterError,
    CommandFailedError,
    ExecutionTimeoutError,
    InputChangedError,
    InputNotFoundError,
    KernelDiedError,
    KernelNotFoundError,
    KernelStartError,
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
from ._models import (
    AttemptRecord,
    CellStatus,
    Limits,
    Outcome,
    RunRequest,
    RunStatus,
    SnapshotMode,
    SnapshotPolicy,
)
from ._models import __version__ as __version__
from .kernel.helpers import checkpoint_dir, preempted, record

if TYPE_CHECKING:
    from ._api import (
        RunStarted,
        execute_notebook,
        inspect_notebook,
        prepare,
        prepare_run,
        resume_run,
        run_here,
    )
    from ._status import RunReport
    from .ops.drill import DrillReport, drill
    from .ops.plans import PlanRun, run_plan
    from .ops.runs import (
        Cancelled,
        ClusterJobs,
        LocalRunner,
        LogEvent,
        Recovered,
        Removed,
        RunListing,
        Trusted,
        cancel_run,
        cluster_jobs,
        cluster_runs,
        find_runs,
        gc_runs,
        list_runs,
        recover_run,
        remove_run,
        run_logs,
        run_notebook,
        run_outputs,
        run_status,
        stop_local_run,
        stream_logs,
        trust_run,
        wait_for_job,
        wait_run,
    )
    from .ops.submit import Submitted, job_manifest, submit, submit_notebook
    from .ops.sweep import (
        PointRow,
        SweepTable,
        resume_sweep,
        submit_sweep,
        sweep,
        sweep_status,
    )
    from .view.report import render_report

# The runner side (nbclient, jupyter_client) loads on first use: a kernel that imports
# spotbook for preempted()/checkpoint_dir(), or for snapshots, must not pay for it
# (importing jupyter_client into a kernel slows every later cell).
_LAZY = {
    "execute_notebook": "._api",
    "inspect_notebook": "._api",
    "prepare": "._api",
    "prepare_run": "._api",
    "resume_run": "._api",
    "run_here": "._api",
    "RunStarted": "._api",
    # what the commands do, as calls that return typed results (the CLI renders them)
    "RunReport": "._status",
    "run_status": ".ops.runs",
    "cancel_run": ".ops.runs",
    "recover_run": ".ops.runs",
    "Cancelled": ".ops.runs",
    "Recovered": ".ops.runs",
    "run_notebook": ".ops.runs",
    "run_logs": ".ops.runs",
    "run_outputs": ".ops.runs",
    "stream_logs": ".ops.runs",
    "LogEvent": ".ops.runs",
    "wait_run": ".ops.runs",
    "stop_local_run": ".ops.runs",
    "trust_run": ".ops.runs",
    "Trusted": ".ops.runs",
    "LocalRunner": ".ops.runs",
    "list_runs": ".ops.runs",
    "remove_run": ".ops.runs",
    "gc_runs": ".ops.runs",
    "Removed": ".ops.runs",
    "find_runs": ".ops.runs",
    "cluster_runs": ".ops.runs",
    "cluster_jobs": ".ops.runs",
    "ClusterJobs": ".ops.runs",
    "RunListing": ".ops.runs",
    # a run as HTML (needs spotbook[ui])
    "render_report": ".view.report",
    "submit": ".ops.submit",
    "submit_notebook": ".ops.submit",
    "job_manifest": ".ops.submit",
    "wait_for_job": ".ops.runs",
    "Submitted": ".ops.submit",
    "drill": ".ops.drill",
    "DrillReport": ".ops.drill",
    "run_plan": ".ops.plans",
    "PlanRun": ".ops.plans",
    "sweep": ".ops.sweep",
    "resume_sweep": ".ops.sweep",
    "sweep_status": ".ops.sweep",
    "submit_sweep": ".ops.sweep",
    "SweepTable": ".ops.sweep",
    "PointRow": ".ops.sweep",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spotbook' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "AttemptRecord",
    "Cancelled",
    "CellError",
    "CellExecutionError",
    "CellStatus",
    "CellTimeoutError",
    "ClusterError",
    "ClusterJobs",
    "CommandFailedError",
    "DrillReport",
    "ExecutionTimeoutError",
    "InputChangedError",
    "InputNotFoundError",
    "KernelDiedError",
    "KernelNotFoundError",
    "KernelStartError",
    "Limits",
    "LocalRunner",
    "LogEvent",
    "NotebookFormatError",
    "Outcome",
    "ParameterError",
    "PlanRun",
    "PointRow",
    "PreemptionBudgetError",
    "Recovered",
    "Removed",
    "ResumeRefusedError",
    "RunListing",
    "RunNotFoundError",
    "RunReport",
    "RunRequest",
    "RunStarted",
    "RunStatus",
    "RunTimeoutError",
    "SnapshotIntegrityError",
    "SnapshotMode",
    "SnapshotPolicy",
    "SpotbookError",
    "StorageError",
    "StoreIntegrityError",
    "Submitted",
    "SupersededError",
    "SweepTable",
    "Terminated",
    "Trusted",
    "UsageError",
    "cancel_run",
    "checkpoint_dir",
    "cluster_jobs",
    "cluster_runs",
    "drill",
    "execute_notebook",
    "find_runs",
    "gc_runs",
    "inspect_notebook",
    "job_manifest",
    "list_runs",
    "preempted",
    "prepare",
    "prepare_run",
    "record",
    "recover_run",
    "remove_run",
    "render_report",
    "resume_run",
    "resume_sweep",
    "run_here",
    "run_logs",
    "run_notebook",
    "run_outputs",
    "run_plan",
    "run_status",
    "stop_local_run",
    "stream_logs",
    "submit",
    "submit_notebook",
    "submit_sweep",
    "sweep",
    "sweep_status",
    "trust_run",
    "wait_for_job",
    "wait_run",
]
