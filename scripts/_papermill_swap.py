"""pytest plugin for scripts/papermill_suite.py: spotbook in papermill's place.

Loaded with ``-p _papermill_swap`` before papermill's test modules are imported, so
their ``from ..execute import execute_notebook`` picks up spotbook's function.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import click
import papermill
import papermill.execute
import papermill.inspection
import pytest

import spotbook
from spotbook.cli.main import exit_code
from spotbook.cli.parser import build_parser
from spotbook.cli.run import _check_engine, _parameters
from spotbook.notebook.parameters import resolve_type

papermill.execute.execute_notebook = spotbook.execute_notebook
papermill.execute_notebook = spotbook.execute_notebook
papermill.inspection.inspect_notebook = spotbook.inspect_notebook
papermill.inspect_notebook = spotbook.inspect_notebook


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def spotbook_run(argv: tuple[str, ...]) -> None:
    """``papermill ARGS`` as ``spotbook run ARGS``: spotbook's parser reads the command
    line; what it read goes to papermill's (patched) ``execute_notebook`` under
    papermill's argument names."""
    import papermill.cli

    try:
        args = build_parser().parse_args(["run", *argv])
    except SystemExit as exc:
        sys.exit(exc.code)
    try:
        _check_engine(args)
    except spotbook.SpotbookError as exc:
        # spotbook refuses what it cannot honour (exit 2) where papermill passes it on
        click.echo(f"spotbook: error: {exc}", err=True)
        sys.exit(exit_code(exc))
    if args.help_notebook:
        # spotbook lists the parameters (notebook_parameters) and runs nothing: papermill's
        # counterpart of that call is display_notebook_help
        papermill.cli.display_notebook_help(
            click.get_current_context(), args.input, _parameters(args)
        )
        return
    papermill.cli.execute_notebook(
        input_path=args.input,
        output_path=args.output,
        parameters=_parameters(args),
        engine_name=args.engine,
        request_save_on_cell_execute=args.request_save_on_cell_execute,
        autosave_cell_every=args.autosave_cell_every,
        prepare_only=args.prepare_only,
        kernel_name=args.kernel,
        language=args.language,
        log_output=args.log_output,
        progress_bar=not args.log_output if args.progress_bar is None else args.progress_bar,
        start_timeout=args.start_timeout,
        execution_timeout=args.execution_timeout,
        report_mode=args.report_mode,
        cwd=args.cwd,
        stdout_file=args.stdout_file,
        stderr_file=args.stderr_file,
    )


def spotbook_cli(papermill_args: list[str] | None = None, **kwargs: Any) -> Any:
    """``python -m papermill ARGS`` as ``python -m spotbook run ARGS``."""
    args = list(papermill_args or [])
    if args == ["--version"]:
        return subprocess.Popen([sys.executable, "-m", "spotbook", "--version"], **kwargs)
    return subprocess.Popen([sys.executable, "-m", "spotbook", "run", *args], **kwargs)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__.endswith("test_cli"):
            module.papermill = spotbook_run
            module.papermill_cli = spotbook_cli
            module._resolve_type = resolve_type
