"""spotbook as a papermill engine: ``papermill IN OUT --engine spotbook -p lr 0.1``, or
``papermill.execute_notebook(..., engine_name="spotbook")``.

papermill does what it always does — reads INPUT through its I/O handlers, injects the
parameters, fills in its metadata, writes OUTPUT, and marks a failed cell and raises its
own ``PapermillExecutionError`` — and hands the cells to this engine, which runs them
through spotbook: every cell's progress saved to a run store, kernel-state snapshots,
and a rerun of the same command after a kill continuing after the last finished cell
(a run is the same when the parameterised notebook, OUTPUT, the kernel and the working
directory are, as for ``spotbook run``).

Options, as engine keyword arguments of ``execute_notebook`` or, for papermill's command
line, from the environment: ``run_dir`` (``SPOTBOOK_ENGINE_RUN_DIR``: the run store, any
fsspec URL; default one per run in the user's cache), ``snapshot``
(``SPOTBOOK_ENGINE_SNAPSHOT``: auto, every-cell, off), ``restart`` and ``strict_resume``.

For tools that call papermill without naming an engine (Airflow's ``PapermillOperator``),
``SPOTBOOK_ENGINE_DEFAULT=1`` in their environment makes spotbook's engine papermill's
default as well (opt-in: nothing changes without it).

Loaded by papermill while papermill itself is being imported: this module imports
neither papermill nor the rest of spotbook until a notebook runs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

ENV_RUN_DIR = "SPOTBOOK_ENGINE_RUN_DIR"
ENV_SNAPSHOT = "SPOTBOOK_ENGINE_SNAPSHOT"
ENV_DEFAULT = "SPOTBOOK_ENGINE_DEFAULT"


class SpotbookEngine:
    """The engine papermill's registry holds under the name ``spotbook``; papermill calls
    its three class methods."""

    @classmethod
    def execute_notebook(
        cls,
        nb: Any,
        kernel_name: str | None,
        output_path: str | None = None,
        progress_bar: bool = True,
        log_output: bool = False,
        autosave_cell_every: int = 30,
        *,
        input_path: Any = None,
        stdout_file: Any = None,
        stderr_file: Any = None,
        start_timeout: float = 60,
        execution_timeout: float | None = None,
        run_dir: str | None = None,
        snapshot: str | None = None,
        restart: bool = False,
        strict_resume: bool = False,
        **nbclient_kwargs: Any,
    ) -> Any:
        """Run the parameterised ``nb``; return it executed, for papermill to check and
        write. A failed cell comes back marked in its outputs (papermill then raises)."""
        import nbclient.exceptions

        from .._api import execute_notebook
        from .._errors import CellExecutionError, CellTimeoutError, KernelDiedError
        from ..notebook import document as nbs
        from ..store.runstore import RunStore

        del autosave_cell_every, input_path  # progress is saved after every cell
        # papermill writes OUTPUT at the end; spotbook writes it as the run goes, too
        # (not to stdout, "-", which papermill alone writes)
        output = None if output_path in (None, "-") else str(output_path)
        try:
            return execute_notebook(
                nb,
                output,
                kernel_name=kernel_name,
                progress_bar=progress_bar,
                log_output=log_output,
                stdout_file=stdout_file,
                stderr_file=stderr_file,
                start_timeout=start_timeout,
                cwd=os.getcwd(),  # papermill has changed into its --cwd
                execution_timeout=execution_timeout,
                run_dir=run_dir or os.environ.get(ENV_RUN_DIR) or None,
                snapshot=snapshot or os.environ.get(ENV_SNAPSHOT) or "auto",
                restart=restart,
                strict_resume=strict_resume,
                **nbclient_kwargs,
            )
        except CellExecutionError as exc:
            # the notebook as the run left it, for papermill to mark, write and raise on
            assert exc.run_dir is not None
            data = RunStore(exc.run_dir).read("output.ipynb")
            assert data is not None
            return nbs.remove_error_markers(nbs.parse(data, "output.ipynb"))
        except KernelDiedError as exc:  # papermill's command line exits 138 on it
            raise nbclient.exceptions.DeadKernelError(str(exc)) from exc
        except CellTimeoutError as exc:
            raise nbclient.exceptions.CellTimeoutError(str(exc)) from exc

    @classmethod
    def nb_kernel_name(cls, nb: Any, name: str | None = None) -> str:
        from papermill.utils import nb_kernel_name

        return str(nb_kernel_name(nb, name))

    @classmethod
    def nb_language(cls, nb: Any, language: str | None = None) -> str:
        from papermill.utils import nb_language

        return str(nb_language(nb, language))


def _take_papermills_default() -> None:
    """With SPOTBOOK_ENGINE_DEFAULT=1, register this engine under papermill's default name
    too: papermill loads this module while it builds its registry, after it registered
    its own default, so this registration is the one that stays."""
    if os.environ.get(ENV_DEFAULT, "").lower() not in ("1", "true", "yes"):
        return
    engines = getattr(sys.modules.get("papermill.engines"), "papermill_engines", None)
    if engines is not None:
        engines.register(None, SpotbookEngine)


_take_papermills_default()
