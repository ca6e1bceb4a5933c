"""The ``spotbook`` command: the exit-code table, the commands, and ``main``."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Sequence

from .._errors import (
    CellError,
    CommandFailedError,
    ExecutionTimeoutError,
    KernelDiedError,
    PreemptionBudgetError,
    ResumeRefusedError,
    SpotbookError,
    StorageError,
    StoreIntegrityError,
    SupersededError,
    Terminated,
    UsageError,
)
from .._models import (
    EXIT_BUDGET,
    EXIT_CELL_ERROR,
    EXIT_KERNEL_DIED,
    EXIT_RESUME_REFUSED,
    EXIT_STOPPED,
    EXIT_STORAGE,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)
from .cluster import _cmd_cancel, _cmd_logs, _cmd_recover, _cmd_submit, _cmd_wait
from .drill import _cmd_drill
from .economics import _cmd_chaos, _cmd_cost, _cmd_simulate
from .parser import SWEEP_VERBS, build_parser
from .plans import _cmd_cluster_plan
from .run import _cmd_inspect, _cmd_resume, _cmd_run, _cmd_worker
from .status import _cmd_runs, _cmd_status
from .sweep import _cmd_sweep, _cmd_sweep_results, _cmd_sweep_resume, _cmd_sweep_status
from .view import _cmd_report, _cmd_ui

log = logging.getLogger("spotbook")


# DESIGN.md's contract with the Job controller; most specific class first.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (Terminated, EXIT_STOPPED),
    (PreemptionBudgetError, EXIT_BUDGET),
    (ExecutionTimeoutError, EXIT_TIMEOUT),
    (StorageError, EXIT_STORAGE),
    (CommandFailedError, EXIT_STORAGE),
    (SupersededError, EXIT_STORAGE),
    (ResumeRefusedError, EXIT_RESUME_REFUSED),
    (StoreIntegrityError, EXIT_USAGE),
    (UsageError, EXIT_USAGE),
    (KernelDiedError, EXIT_KERNEL_DIED),
    (CellError, EXIT_CELL_ERROR),
)


def exit_code(exc: BaseException) -> int:
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return EXIT_STORAGE


COMMANDS = {
    "run": _cmd_run,
    "inspect": _cmd_inspect,
    "resume": _cmd_resume,
    "status": _cmd_status,
    "runs": _cmd_runs,
    "worker": _cmd_worker,
    "submit": _cmd_submit,
    "logs": _cmd_logs,
    "wait": _cmd_wait,
    "cancel": _cmd_cancel,
    "recover": _cmd_recover,
    "drill": _cmd_drill,
    "cost": _cmd_cost,
    "simulate": _cmd_simulate,
    "chaos": _cmd_chaos,
    "sweep": _cmd_sweep,
    "sweep-resume": _cmd_sweep_resume,
    "sweep-status": _cmd_sweep_status,
    "sweep-results": _cmd_sweep_results,
    "report": _cmd_report,
    "ui": _cmd_ui,
    "gke": _cmd_cluster_plan,
    "eks": _cmd_cluster_plan,
    "aks": _cmd_cluster_plan,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    if len(words) > 1 and words[0] == "sweep" and words[1] in SWEEP_VERBS:
        words = [f"sweep-{words[1]}", *words[2:]]  # `sweep status URL`, not a notebook
    args = parser.parse_args(words)
    level = getattr(args, "log_level", "WARNING")
    logging.basicConfig(format="spotbook: %(message)s", stream=sys.stderr)
    logging.getLogger("spotbook").setLevel(level)
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        # against a GCS emulator there are no Google credentials to find; say nothing
        logging.getLogger("google.auth").setLevel(logging.ERROR)
    try:
        return COMMANDS[args.command](args)
    except SpotbookError as exc:
        code = exit_code(exc)
        prefix = "" if isinstance(exc, Terminated) else "error: "
        print(f"spotbook: {prefix}{exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print("spotbook: interrupted", file=sys.stderr)
        return 75
    except Exception:
        # Not a user error: show where, and use the "may pass on retry" code rather
        # than 1, which tells a Job controller the notebook itself is broken.
        traceback.print_exc()
        print(
            "spotbook: internal error: this is a bug in spotbook; please report it with "
            "the traceback above",
            file=sys.stderr,
        )
        return 3
