"""Commands that run a notebook here: run, resume, inspect and the container's worker."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import stat
import sys
from collections.abc import Iterator
from typing import Any

from .._api import (
    OutputHandler,
    RunStarted,
    inspect_notebook,
    notebook_parameters,
    output_line,
    outputs_to,
    resume_run,
    run_here,
)
from .._errors import (
    UsageError,
)
from .._models import (
    EXIT_STOPPED,
    Limits,
    RunRequest,
)
from ..attempt.context import RunnerOptions
from ..attempt.progress import ProgressBar
from ..attempt.runner import RunResult
from ..notebook.parameters import Parameter, collect_parameters
from ..store.runstore import (
    LOCAL_RUNS,
)
from .parser import snapshot_policy

log = logging.getLogger("spotbook")


def _echo_output(kind: str, content: dict[str, Any]) -> None:
    line = output_line(kind, content)
    if line:
        sys.stderr.write(line)
        sys.stderr.flush()


def _exit_now(why: str) -> None:
    """The runner's exit watchdog: the time to exit after a notice ran out."""
    print(f"spotbook: {why}", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(EXIT_STOPPED)


def _check_stream_files(args: argparse.Namespace) -> None:
    """--stdout-file and --stderr-file, checked before anything is written: a file in a
    folder that is there, and not a folder itself."""
    for flag, name in (("--stdout-file", "stdout_file"), ("--stderr-file", "stderr_file")):
        path = getattr(args, name, None)
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise UsageError(f"{flag} {path} is a folder: give a file's path")
        if not os.path.isdir(folder):
            raise UsageError(
                f"{flag} {path}: the folder {folder} does not exist; make it first "
                f"(mkdir -p {folder}) or give another path"
            )
        if not os.access(folder, os.W_OK):
            raise UsageError(f"{flag} {path}: this user cannot write in {folder}")


@contextlib.contextmanager
def _stream_files(args: argparse.Namespace) -> Iterator[OutputHandler | None]:
    """The run's output handler, while it runs: --log-output to stderr, --stdout-file and
    --stderr-file appended to (--prepare-only runs nothing: they are not opened)."""
    with contextlib.ExitStack() as files:
        to = {
            name: files.enter_context(open(path, "a", encoding="utf-8"))
            for name, path in (
                ("stdout", getattr(args, "stdout_file", None)),
                ("stderr", getattr(args, "stderr_file", None)),
            )
            if path and not getattr(args, "prepare_only", False)
        }
        yield outputs_to(
            _echo_output if args.log_output else None, to.get("stdout"), to.get("stderr")
        )


def runner_options(args: argparse.Namespace, on_output: Any = None) -> RunnerOptions:
    """The attempt's options from the run flags (grace, strict resume, progress bar)."""
    return RunnerOptions(
        grace=args.grace,
        strict_resume=bool(getattr(args, "strict_resume", False)),
        on_output=on_output,
        progress=ProgressBar(
            not args.log_output if args.progress_bar is None else args.progress_bar,
            describe_cells=not args.log_output,
        ),
        on_overrun=_exit_now,
    )


def say_result(result: RunResult) -> None:
    """The line that ends a run: its status, cells done, and where the notebook is."""
    print(
        f"spotbook: run {result.run_id} {result.status.value}: "
        f"{result.cells_done}/{result.cells_total} cells; output in {result.notebook}",
        file=sys.stderr,
    )


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(
        execution_timeout=args.execution_timeout,
        run_timeout=args.timeout,
        start_timeout=args.start_timeout,
        grace=Limits().grace if args.grace is None else args.grace,
        max_preemptions=args.max_preemptions,
        max_output_bytes=args.max_output_bytes,
        checkpoint_interval=args.checkpoint_interval,
    )


def _parameters(args: argparse.Namespace) -> dict[str, Any]:
    """The parameters, merged as papermill merges them: the injected paths, -b, -f, -y,
    -p, -r."""
    paths = {}
    if args.inject_input_path or args.inject_paths:
        paths["PAPERMILL_INPUT_PATH"] = args.input
    if args.inject_output_path or args.inject_paths:
        paths["PAPERMILL_OUTPUT_PATH"] = args.output or "-"
    return collect_parameters(
        paths=paths,
        base64_yaml=args.parameters_base64,
        files=args.parameters_file,
        yaml_strings=args.parameters_yaml,
        typed=[tuple(p) for p in args.parameters],
        raw=[tuple(p) for p in args.parameters_raw],
    )


def _check_engine(args: argparse.Namespace) -> None:
    if args.engine not in (None, "nbclient", "spotbook"):
        raise UsageError(
            f"--engine {args.engine}: spotbook runs notebooks with its own engine (nbclient "
            "underneath); leave --engine out"
        )
    if args.language not in (None, "python") and not getattr(args, "prepare_only", False):
        raise UsageError(
            f"--language {args.language}: spotbook runs Python notebooks only (it restores a "
            "Python kernel's state); --prepare-only writes the notebook with its parameters "
            "in that language without running it"
        )


def _stdin_notebook(args: argparse.Namespace) -> Any:
    """INPUT, or the notebook read from stdin for ``-``."""
    if args.input != "-":
        return args.input
    data = sys.stdin.buffer.read()
    try:
        doc = json.loads(data)
    except RecursionError:
        raise UsageError("stdin (INPUT -) is not a notebook: nested too deeply") from None
    except ValueError as exc:
        if getattr(args, "output_from_pipe", False):
            raise UsageError(
                f"stdin is a pipe, so the notebook was read from it and {args.output!r} "
                f"taken as OUTPUT (as papermill does), but stdin is not a notebook ({exc}); "
                "give INPUT and OUTPUT both, or run with stdin from /dev/null"
            ) from exc
        raise UsageError(f"stdin (INPUT -) is not a notebook: {exc}") from exc
    if not isinstance(doc, dict):
        raise UsageError("stdin (INPUT -) is not a notebook: not a JSON object")
    return doc


def _named(args: argparse.Namespace) -> None:
    """--name NAME: the run's store is .spotbook/runs/NAME."""
    from ..store.index import valid_name

    name = getattr(args, "name", None)
    if name is None:
        return
    if args.run_dir:
        raise UsageError(
            "give --name or --run-dir, not both (--name puts the run in .spotbook/runs/NAME)"
        )
    if not valid_name(name):
        raise UsageError(
            f"--name {name!r}: letters, digits, '.', '_' and '-', starting with a letter or "
            "a digit, at most 64 characters"
        )
    args.run_dir = os.path.join(LOCAL_RUNS, name)


def run_request(
    args: argparse.Namespace, notebook: Any = None, parameters: dict[str, Any] | None = None
) -> RunRequest:
    """The run the flags ask for, made and checked once (run, submit and sweep pass it
    down whole). ``notebook``: INPUT as already read, if it was; ``parameters``: the
    parameters, if not the flags' (a sweep's points each have their own)."""
    return RunRequest(
        _stdin_notebook(args) if notebook is None else notebook,
        None if args.output == "-" else args.output,
        parameters=_parameters(args) if parameters is None else parameters,
        kernel_name=args.kernel,
        language=args.language,
        report_mode=args.report_mode,
        cwd=getattr(args, "cwd", None),
        limits=_limits(args),
        snapshot=snapshot_policy(args),
        run_dir=args.run_dir,
        restart=args.restart,
        strict_resume=args.strict_resume,
        allow_errors=bool(getattr(args, "allow_errors", False)),
        prepare_only=bool(getattr(args, "prepare_only", False)),
    )


def _show_parameters(where: str, found: list[Parameter] | None) -> None:
    """papermill's --help-notebook listing: name, type, default, and the help comment
    in a column of its own."""
    print(f"Parameters inferred for notebook '{where}':")
    if found is None:
        print("  No cell tagged 'parameters'")
    elif not found:
        print("  No parameters assigned in the cell tagged 'parameters'")
    for p in found or []:
        head = f"  {p.name}: {p.shown_type()} (default {p.default})"
        if not p.help:
            print(head)
        elif len(head) < 34:
            print(f"{head:<34}{p.help}")
        else:
            print(f"{head}\n{'':<34}{p.help}")


def _cmd_inspect(args: argparse.Namespace) -> int:
    params = _parameters(args)
    if args.json:
        print(json.dumps(inspect_notebook(_stdin_notebook(args), params), indent=2))
        return 0
    _show_parameters(args.input, notebook_parameters(_stdin_notebook(args), params))
    return 0


def _stdin_is_a_pipe() -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(0).st_mode)
    except OSError:  # no stdin at all
        return False


def _papermill_pipes(args: argparse.Namespace) -> None:
    """papermill's reading of left-out paths: with a pipe on stdin, INPUT is stdin (and a
    single path given is OUTPUT); with stdout not a terminal, a left-out OUTPUT is stdout.
    A run given --run-dir keeps its result in its store instead (spotbook's own use)."""
    if _stdin_is_a_pipe() and args.output is None:
        if args.input is not None and args.input != "-":
            args.input, args.output = "-", args.input
            args.output_from_pipe = True
        else:
            args.input = "-"
    if args.input is None:
        raise UsageError(
            "the following arguments are required: INPUT (usage: spotbook run INPUT "
            "[OUTPUT] [flags]); give the notebook's path or URL, or pipe it in "
            "(spotbook run - OUTPUT < notebook.ipynb)"
        )
    if args.output is None and args.run_dir is None and not sys.stdout.isatty():
        args.output = "-"


class _Started:
    """The line that starts a run (its id and store, and whether it continues one), and,
    for OUTPUT -, the notebook written to stdout when the command ends, also when a cell
    failed."""

    def __init__(self, command: str, to_stdout: str | None = None) -> None:
        self.command = command
        self.to_stdout = to_stdout  # which notebook goes to stdout: input, output or none
        self.run: RunStarted | None = None

    def __call__(self, run: RunStarted) -> None:
        self.run = run
        if self.command == "resume":
            line = f"resuming {run.url}"
        elif self.command == "worker":
            line = f"worker for {run.url}"
        elif run.interrupted_at is not None:
            done, total = run.interrupted_at
            line = (
                f"continuing run {run.run_id}, interrupted with {done} of {total} cells done "
                f"(--restart starts over), store {run.url}"
            )
        else:
            line = f"run {run.run_id}, store {run.url}"
        print(f"spotbook: {line}", file=sys.stderr)

    def __enter__(self) -> _Started:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.to_stdout is None or self.run is None:
            return
        data = self.run.notebook(self.to_stdout)
        if data is not None:
            sys.stdout.write(data.decode())
            sys.stdout.flush()


def _cmd_run(args: argparse.Namespace) -> int:
    _papermill_pipes(args)
    _check_stream_files(args)
    _check_engine(args)
    if args.help_notebook:
        notebook, parameters = _stdin_notebook(args), _parameters(args)
        _show_parameters(args.input, notebook_parameters(notebook, parameters))
        return 0
    _named(args)
    request = run_request(args)
    # OUTPUT - is this command's stdout: the notebook goes there when the command ends,
    # also when a cell failed (--prepare-only: the notebook it froze)
    to_stdout = ("input" if request.prepare_only else "output") if args.output == "-" else None
    with _stream_files(args) as on_output, _Started("run", to_stdout) as started:
        result = run_here(request, runner_options(args, on_output), on_start=started)
    if not request.prepare_only:
        say_result(result)
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    _check_stream_files(args)
    with _stream_files(args) as on_output:
        result = resume_run(
            args.run, options=runner_options(args, on_output), on_start=_Started("resume")
        )
    say_result(result)
    return 0


def _cmd_trust(args: argparse.Namespace) -> int:
    from ..ops.runs import trust_run

    done = trust_run(args.run, remove=args.remove)
    if not done.trusted:
        said = "no longer" if done.changed else "not"
        print(f"spotbook: {done.url} is {said} trusted", file=sys.stderr)
        return 0
    print(
        f"spotbook: trusting {done.url} (made by an older spotbook: nothing in it is "
        f"sealed) on this machine, for this user ({done.entry}); `spotbook resume {args.run}` "
        f"now resumes it. Take it back with `spotbook trust --remove {args.run}`",
        file=sys.stderr,
    )
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from .._worker import run_worker

    with _stream_files(args) as on_output:
        result = run_worker(
            args.run_dir, os.environ, runner_options(args, on_output), on_start=_Started("worker")
        )
    say_result(result)
    return 0
