"""The ``spotbook`` command. The only place that prints and maps errors to exit codes."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from . import __version__
from ._api import prepare_run
from ._errors import (
    CellError,
    ExecutionTimeoutError,
    PreemptionBudgetError,
    SnapshotIntegrityError,
    SpotbookError,
    StorageError,
    Terminated,
    UsageError,
)
from ._models import Limits, SnapshotPolicy
from ._parameters import collect_parameters
from ._runner import Runner, RunnerOptions
from ._status import describe, local_runs
from ._store import RunStore, resolve_run

log = logging.getLogger("spotbook")

# DESIGN.md's contract with the Job controller; most specific class first.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (Terminated, 75),
    (PreemptionBudgetError, 5),
    (ExecutionTimeoutError, 4),
    (StorageError, 3),
    (SnapshotIntegrityError, 2),
    (UsageError, 2),
    (CellError, 1),
)


def exit_code(exc: BaseException) -> int:
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return 3


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """papermill's flags, same names and meaning, plus spotbook's own."""
    p.add_argument("input", metavar="INPUT", help="notebook path or fsspec URL")
    p.add_argument("output", metavar="OUTPUT", nargs="?", help="where to write the result")
    g = p.add_argument_group("parameters (as papermill)")
    g.add_argument(
        "-p",
        "--parameters",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="typed: ints, floats, True/False/None",
    )
    g.add_argument(
        "-r",
        "--parameters_raw",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="kept as a string",
    )
    g.add_argument("-y", "--parameters_yaml", action="append", default=[], metavar="YAML")
    g.add_argument("-f", "--parameters_file", action="append", default=[], metavar="FILE")
    e = p.add_argument_group("execution (as papermill)")
    e.add_argument("-k", "--kernel", help="kernel name (default: the notebook's)")
    e.add_argument("--cwd", help="working directory of the kernel")
    e.add_argument("--log-output", action="store_true", help="echo cell output to stderr")
    e.add_argument("--progress-bar", action=argparse.BooleanOptionalAction, default=True)
    e.add_argument("--execution-timeout", type=float, metavar="S", help="limit per cell")
    e.add_argument("--start-timeout", type=float, default=60.0, metavar="S")
    e.add_argument(
        "--prepare-only",
        action="store_true",
        help="write the parameterised notebook without running it",
    )
    e.add_argument(
        "--request-save-on-cell-execute",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="accepted for papermill compatibility; progress is always saved per cell",
    )
    s = p.add_argument_group("spotbook")
    s.add_argument("--run-dir", metavar="URL", help="run store (default .spotbook/runs/ID)")
    s.add_argument("--timeout", type=float, metavar="S", help="limit for the whole run")
    s.add_argument(
        "--snapshot",
        default="auto",
        metavar="MODE",
        help="kernel-state snapshots: every-cell, auto (cost-aware), off",
    )
    s.add_argument(
        "--snapshot-interval",
        type=float,
        metavar="S",
        help="with auto: also snapshot after this much compute",
    )
    s.add_argument("--max-preemptions", type=int, metavar="N")
    s.add_argument(
        "--max-output-bytes",
        type=int,
        default=Limits().max_output_bytes,
        metavar="N",
        help="stream text kept per cell in the notebook",
    )
    s.add_argument(
        "--checkpoint-interval",
        type=float,
        default=Limits().checkpoint_interval,
        metavar="S",
        help="object-store runs: sync spotbook.checkpoint_dir() to the store this often",
    )
    s.add_argument(
        "--restart", action="store_true", help="discard what --run-dir holds and start over"
    )
    _add_common(p)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--grace",
        type=float,
        metavar="S",
        help=f"on SIGTERM, how long the running cell may take to finish (default "
        f"{Limits().grace:g}, or what the run was started with)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spotbook",
        description="Run notebooks as batch jobs that survive preemption.",
    )
    parser.add_argument("--version", action="version", version=f"spotbook {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run a notebook (papermill's flags), saving progress")
    _add_run_flags(run)
    res = sub.add_parser("resume", help="continue a killed run after its last saved cell")
    res.add_argument("run", metavar="RUN", help="run id or run store URL")
    res.add_argument("--log-output", action="store_true")
    res.add_argument("--progress-bar", action=argparse.BooleanOptionalAction, default=True)
    _add_common(res)
    st = sub.add_parser("status", help="where a run stands")
    st.add_argument("run", metavar="RUN", help="run id or run store URL")
    st.add_argument("--json", action="store_true", help="machine-readable")
    sub.add_parser("runs", help="list the runs under ./.spotbook/runs")
    wk = sub.add_parser(
        "worker",
        help="the container entrypoint: run or resume the run in SPOTBOOK_RUN_DIR",
        description="Run one attempt of a run, as a container does: the run store comes "
        "from --run-dir or SPOTBOOK_RUN_DIR, or from the classic BUCKET_NAME / "
        "DOWNLOAD_FILE_PATH / UPLOAD_FILE_PATH variables. Exits with DESIGN.md's codes.",
    )
    wk.add_argument("--run-dir", metavar="URL", help="run store (default $SPOTBOOK_RUN_DIR)")
    wk.add_argument(
        "--log-output",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("SPOTBOOK_LOG_OUTPUT", "1") not in ("0", "false", ""),
        help="echo cell output to stderr, for the pod's log (default on)",
    )
    wk.add_argument("--progress-bar", action=argparse.BooleanOptionalAction, default=True)
    _add_common(wk)
    return parser


class _Progress:
    """A one-line progress display on stderr, throttled like tqdm's."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < (0.1 if self.tty else 2.0) and done < total):
            return
        self.last = now
        end = "\r" if self.tty and done < total else "\n"
        sys.stderr.write(f"Executing: {done}/{total} cells{end}")
        sys.stderr.flush()


def _echo_output(kind: str, content: dict[str, Any]) -> None:
    text = content.get("text") or (content.get("data") or {}).get("text/plain", "")
    if kind == "error":
        text = f"{content.get('ename')}: {content.get('evalue')}\n"
    if text:
        sys.stderr.write(text if str(text).endswith("\n") else f"{text}\n")
        sys.stderr.flush()


def _run_runner(store: RunStore, args: argparse.Namespace) -> int:
    opts = RunnerOptions(
        grace=args.grace,
        on_output=_echo_output if args.log_output else None,
        on_progress=_Progress(args.progress_bar),
    )
    result = Runner(store, opts).run()
    print(
        f"spotbook: run {result.run_id} {result.status.value}: "
        f"{result.cells_done}/{result.cells_total} cells; output in {result.url}/output.ipynb",
        file=sys.stderr,
    )
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    params = collect_parameters(
        files=args.parameters_file,
        yaml_strings=args.parameters_yaml,
        typed=[tuple(p) for p in args.parameters],
        raw=[tuple(p) for p in args.parameters_raw],
    )
    limits = Limits(
        execution_timeout=args.execution_timeout,
        run_timeout=args.timeout,
        start_timeout=args.start_timeout,
        grace=Limits().grace if args.grace is None else args.grace,
        max_preemptions=args.max_preemptions,
        max_output_bytes=args.max_output_bytes,
        checkpoint_interval=args.checkpoint_interval,
    )
    store = prepare_run(
        args.input,
        args.output,
        parameters=params,
        kernel_name=args.kernel,
        cwd=args.cwd,
        limits=limits,
        snapshot=SnapshotPolicy.parse(args.snapshot, args.snapshot_interval),
        run_dir=args.run_dir,
        restart=args.restart,
    )
    run_id = store.require_run()["spec"]["run_id"]
    print(f"spotbook: run {run_id}, store {store.url}", file=sys.stderr)
    if args.prepare_only:
        data = store.read("input.ipynb")
        if args.output and data is not None:
            from ._store import write_url

            write_url(args.output, data)
        return 0
    return _run_runner(store, args)


def _cmd_resume(args: argparse.Namespace) -> int:
    store = RunStore(resolve_run(args.run))
    store.require_run()
    print(f"spotbook: resuming {store.url}", file=sys.stderr)
    return _run_runner(store, args)


def _cmd_worker(args: argparse.Namespace) -> int:
    from ._worker import open_target, resolve_target

    target = resolve_target(args.run_dir, os.environ)
    store = open_target(target)
    print(f"spotbook: worker for {store.url}", file=sys.stderr)
    return _run_runner(store, args)


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _cmd_status(args: argparse.Namespace) -> int:
    doc = describe(RunStore(resolve_run(args.run)))
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(f"run      {doc['run_id']}  ({doc['run_dir']})")
    print(f"status   {doc['status']}" + (f": {doc['message']}" if doc["message"] else ""))
    print(f"cells    {doc['cells_done']}/{doc['cells_total']} done")
    if doc["failing_cell"]:
        f = doc["failing_cell"]
        print(f"failed   cell {f['index']}: {f.get('ename')}: {f.get('evalue')}")
    print(f"attempts {len(doc['attempts'])}, preemptions {doc['preemptions']}")
    for a in doc["attempts"]:
        extra = ""
        if a.get("replayed") is not None:
            extra = f", restored in {a.get('restore_seconds', 0):.2f} s, replayed {a['replayed']}"
        place = f"pod {a['pod']}" if a.get("pod") else f"pid {a.get('pid')}"
        print(
            f"  #{a.get('attempt')} {a.get('outcome'):<10} {_when(a.get('started'))} → "
            f"{_when(a.get('ended'))}  from cell {a.get('resumed_from')} "
            f"on {a.get('node') or a.get('host')} {place}{extra}"
        )
        for line in _attempt_details(a):
            print(f"      {line}")
    return 0


def _attempt_details(a: dict[str, Any]) -> list[str]:
    """Image, accelerators and checkpoint traffic of one attempt, when known."""
    out = []
    if a.get("image"):
        out.append(f"image {a['image']}")
    gpus = a.get("gpus")
    if gpus:
        names = ", ".join(f"{g.get('name')} ({g.get('memory.total')} MiB)" for g in gpus)
        out.append(f"gpus {len(gpus)}: {names}")
    for name, info in sorted((a.get("frameworks") or {}).items()):
        seen = info.get("devices") or info.get("error") or "no GPU"
        out.append(f"{name} {info.get('version', '')} sees {seen}")
    if a.get("checkpoint_uploaded_bytes") or a.get("checkpoint_restored_bytes"):
        out.append(
            f"checkpoint files: {a.get('checkpoint_restored_bytes', 0)} bytes restored, "
            f"{a.get('checkpoint_uploaded_bytes', 0)} bytes saved"
        )
    return out


def _cmd_runs(args: argparse.Namespace) -> int:
    runs = local_runs()
    if not runs:
        print("no runs under ./.spotbook/runs (start one with `spotbook run NOTEBOOK`)")
        return 0
    print(f"{'RUN':<24} {'STATUS':<12} {'CELLS':>9} {'TRIES':>5}  SOURCE")
    for r in runs:
        cells = f"{r['cells_done']}/{r['cells_total']}"
        print(
            f"{r['run_id']:<24} {r['status']:<12} {cells:>9} {len(r['attempts']):>5}  {r['source']}"
        )
    return 0


COMMANDS = {
    "run": _cmd_run,
    "resume": _cmd_resume,
    "status": _cmd_status,
    "runs": _cmd_runs,
    "worker": _cmd_worker,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
