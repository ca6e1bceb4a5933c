"""The ``spotbook`` command: the exit-code table, the commands, and ``main``."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from .._errors import (
    CellError,
    ClusterError,
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
from .parser import RUNS_VERBS, SWEEP_VERBS, build_parser

log = logging.getLogger("spotbook")


# DESIGN.md's contract with the Job controller; most specific class first.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (Terminated, EXIT_STOPPED),
    (PreemptionBudgetError, EXIT_BUDGET),
    (ExecutionTimeoutError, EXIT_TIMEOUT),
    (StorageError, EXIT_STORAGE),
    (CommandFailedError, EXIT_STORAGE),
    (ClusterError, EXIT_STORAGE),
    (SupersededError, EXIT_STORAGE),
    (ResumeRefusedError, EXIT_RESUME_REFUSED),
    (StoreIntegrityError, EXIT_USAGE),
    (UsageError, EXIT_USAGE),
    (KernelDiedError, EXIT_KERNEL_DIED),
    (CellError, EXIT_CELL_ERROR),
)


def exit_code(exc: BaseException) -> int:
    """The exit code for ``exc``: the first row of ``EXIT_CODES`` it is an instance of."""
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return EXIT_STORAGE


# command -> (module of spotbook.cli, function): imported when run, so that `spotbook run`
# does not load what `submit`, `ui` or `simulate` need
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "_cmd_run"),
    "inspect": ("run", "_cmd_inspect"),
    "resume": ("run", "_cmd_resume"),
    "status": ("status", "_cmd_status"),
    "runs": ("status", "_cmd_runs"),
    "runs-rm": ("status", "_cmd_runs_rm"),
    "runs-gc": ("status", "_cmd_runs_gc"),
    "worker": ("run", "_cmd_worker"),
    "trust": ("run", "_cmd_trust"),
    "submit": ("cluster", "_cmd_submit"),
    "logs": ("cluster", "_cmd_logs"),
    "wait": ("cluster", "_cmd_wait"),
    "cancel": ("cluster", "_cmd_cancel"),
    "recover": ("cluster", "_cmd_recover"),
    "drill": ("drill", "_cmd_drill"),
    "cost": ("economics", "_cmd_cost"),
    "simulate": ("economics", "_cmd_simulate"),
    "chaos": ("economics", "_cmd_chaos"),
    "sweep": ("sweep", "_cmd_sweep"),
    "sweep-resume": ("sweep", "_cmd_sweep_resume"),
    "sweep-status": ("sweep", "_cmd_sweep_status"),
    "sweep-results": ("sweep", "_cmd_sweep_results"),
    "report": ("view", "_cmd_report"),
    "ui": ("view", "_cmd_ui"),
    "gke": ("plans", "_cmd_cluster_plan"),
    "eks": ("plans", "_cmd_cluster_plan"),
    "aks": ("plans", "_cmd_cluster_plan"),
}


def command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs command ``name``."""
    module, function = COMMANDS[name]
    found: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(f"{__package__}.{module}"), function
    )
    return found


# commands whose attempt takes a SIGTERM or SIGINT that comes before it starts as its notice
_ATTEMPTS = ("run", "resume", "worker")


# jsonschema's optional format checkers (its format-nongpl extra, which jupyter-events
# installs beside JupyterLab): modules it imports on import when they are installed
FORMAT_CHECK_MODULES = (
    "rfc3987_syntax",  # builds a grammar's parser on import: about 2 s of one core
    "rfc3987",
    "rfc3986_validator",
    "rfc3339_validator",
    "isoduration",
    "arrow",
    "webcolors",
    "uri_template",
    "jsonpointer",
    "fqdn",
)


def _without_format_checks() -> None:
    """The command's own process does without jsonschema's optional format checks.

    nbformat imports jsonschema, which imports every format checker's library that is
    installed; ``rfc3987_syntax`` alone builds a parser for its grammar on import (about
    2 s of one core at every command's start, against 0.3 s for the rest), and the others
    add about 0.1 s (bench/bench_cli_start.py). spotbook checks no field's format with
    jsonschema (nbformat validates with fastjsonschema), and nothing of the user's runs in
    this process (their code runs in the kernel), so those imports are made to fail here,
    as if the packages were absent; a process that imported one already keeps it."""
    for name in FORMAT_CHECK_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    """The ``spotbook`` command: parse ``argv``, run the command, return its exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in _ATTEMPTS and argv is None:
        from .._early import catch

        catch()  # (again, where the package's import did not): a stop now is exit 75
    if argv is None:
        _without_format_checks()
    parser = build_parser()
    if len(words) > 1 and words[0] == "sweep" and words[1] in SWEEP_VERBS:
        words = [f"sweep-{words[1]}", *words[2:]]  # `sweep status URL`, not a notebook
    if len(words) > 1 and words[0] == "runs" and words[1] in RUNS_VERBS:
        words = [f"runs-{words[1]}", *words[2:]]
    args = parser.parse_args(words)
    level = getattr(args, "log_level", "WARNING")
    logging.basicConfig(format="spotbook: %(message)s", stream=sys.stderr)
    logging.getLogger("spotbook").setLevel(level)
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        # against a GCS emulator there are no Google credentials to find; say nothing
        logging.getLogger("google.auth").setLevel(logging.ERROR)
    try:
        code = command(args.command)(args)
        sys.stdout.flush()  # a reader that went away is found here, not at exit
        return code
    except BrokenPipeError:
        # the reader stopped reading (`spotbook runs | head`): it had what it wanted
        _stdout_to_devnull()
        return 0
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


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit finds no closed
    pipe (and prints no 'Exception ignored' lines)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no file descriptor
        pass
