"""Every error spotbook raises, under one root.

::

    SpotbookError
    ├── UsageError                      bad usage: flags, parameters, input notebook
    │   ├── ParameterError              a parameter that does not parse
    │   ├── NotebookFormatError         not a notebook, truncated, nbformat 3
    │   ├── KernelNotFoundError         unknown kernel name
    │   ├── InputNotFoundError          input path or URL that does not exist
    │   ├── InputChangedError           resume of a run whose notebook changed
    │   └── RunNotFoundError            no run at that id / URL
    ├── CellError                       the notebook itself failed (will fail again)
    │   ├── CellExecutionError          a cell raised
    │   └── KernelDiedError             the kernel process died during a cell
    ├── StorageError                    run store / output location        [retryable]
    │   └── KernelStartError            the kernel did not start           [retryable]
    ├── SupersededError                 a newer attempt took over this run [retryable]
    ├── ExecutionTimeoutError           (also a builtin TimeoutError)
    │   ├── CellTimeoutError            one cell exceeded --execution-timeout
    │   └── RunTimeoutError             the run exceeded --timeout
    ├── PreemptionBudgetError           more preemptions than the run allows
    ├── StoreIntegrityError             an object in the run store failed its check
    │   └── SnapshotIntegrityError      a snapshot (manifest or blob) failed its check
    ├── ResumeRefusedError              --strict-resume: the resumed run could differ
    ├── CommandFailedError              a cloud command spotbook ran failed [retryable]
    ├── ClusterError                    the Kubernetes API refused or failed [retryable]
    └── Terminated                      stopped on a signal, progress saved [retryable]

``retryable`` says, on every class, whether the same command may pass when run again
(a Job's next pod, a ``spotbook resume``): it is an attribute, not a base class, so an
error is placed in the tree by what it is about. Only the CLI maps these to exit codes
(``cli.main.EXIT_CODES``), and a test checks that the retryable ones are exactly those
the Job retries.
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar


class SpotbookError(Exception):
    """Root of every spotbook error. ``str()`` is a message for the user."""

    #: whether running the same command again may pass (storage trouble, a newer
    #: attempt, a stop on a notice); False: it would fail the same way
    retryable: ClassVar[bool] = False

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take keyword-only arguments, which pickle's default (``cls(*args)``)
        # cannot pass: rebuild from the message and the attributes instead, so the errors
        # cross process boundaries (multiprocessing pools of execute_notebook).
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type[SpotbookError], args: tuple[Any, ...], attrs: dict[str, Any]) -> Any:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(attrs)
    return err


class UsageError(SpotbookError):
    """The command, its parameters or its input notebook are wrong."""


class ParameterError(UsageError, ValueError):
    """A parameter value or parameters file could not be parsed."""


class NotebookFormatError(UsageError, ValueError):
    """The input is not a notebook spotbook can run."""


class KernelNotFoundError(UsageError, LookupError):
    """No kernelspec of that name is installed."""

    def __init__(self, name: str, available: list[str]) -> None:
        self.name = name
        self.available = available
        have = ", ".join(sorted(available)) or "none"
        super().__init__(
            f"no Jupyter kernel named {name!r} is installed (installed: {have}); "
            "pass one of those with -k/--kernel, or install the kernel "
            "(e.g. `python -m ipykernel install --user --name NAME`)"
        )


class InputNotFoundError(UsageError, FileNotFoundError):
    """The input notebook path or URL does not exist."""


class InputChangedError(UsageError):
    """A run store holds an unfinished run of a different notebook or parameters."""


class RunNotFoundError(UsageError, LookupError):
    """No run exists at that run id or URL."""


class CellError(SpotbookError):
    """The notebook failed in a way a retry would repeat."""

    def __init__(self, message: str, *, cell_index: int, execution_count: int | None) -> None:
        self.cell_index = cell_index
        self.execution_count = execution_count
        super().__init__(message)


class CellExecutionError(CellError):
    """A cell raised an exception. Carries what papermill's PapermillExecutionError
    carries (``cell_index``, ``exec_count``, ``source``, ``ename``, ``evalue``,
    ``traceback``); the Python API raises it as one where papermill is loaded
    (:func:`papermill_compatible`)."""

    def __init__(
        self,
        *,
        cell_index: int,
        execution_count: int | None,
        ename: str,
        evalue: str,
        source: str = "",
        traceback: list[str] | None = None,
    ) -> None:
        self.ename = ename
        self.evalue = evalue
        #: the run store of the run (set where the Python API raises it)
        self.run_dir: str | None = None
        self.exec_count = execution_count
        self.source = source
        self.traceback = list(traceback or [])
        where = f"cell {cell_index}" + (
            f" (In [{execution_count}])" if execution_count is not None else ""
        )
        super().__init__(
            f"{where} raised {ename}: {evalue}",
            cell_index=cell_index,
            execution_count=execution_count,
        )

    def __str__(self) -> str:  # ours, also where papermill's class follows in the MRO
        return str(self.args[0]) if self.args else ""


_COMPAT: dict[type[BaseException], type[CellExecutionError]] = {}


def papermill_compatible(err: CellExecutionError) -> CellExecutionError:
    """``err``, also an instance of papermill's PapermillExecutionError when papermill is
    loaded (code that catches papermill's class imported papermill first), so a
    papermill user's ``except PapermillExecutionError`` keeps working; spotbook never
    imports papermill itself (it takes most of a second)."""
    module = sys.modules.get("papermill.exceptions")
    base = getattr(module, "PapermillExecutionError", None)
    if base is None or isinstance(err, base):
        return err
    cls = _COMPAT.get(base)
    if cls is None:
        cls = _COMPAT[base] = type(
            "CellExecutionError",
            (CellExecutionError, base),
            {"__module__": __name__, "__reduce__": _compat_reduce},
        )
    out = cls.__new__(cls)
    Exception.__init__(out, *err.args)
    out.__dict__.update(err.__dict__)
    return out


def _compat_reduce(self: CellExecutionError) -> tuple[Any, ...]:
    return (_rebuild_compat, (self.args, dict(self.__dict__)))


def _rebuild_compat(args: tuple[Any, ...], attrs: dict[str, Any]) -> CellExecutionError:
    plain = _rebuild(CellExecutionError, args, attrs)
    assert isinstance(plain, CellExecutionError)
    return papermill_compatible(plain)


class KernelDiedError(CellError):
    """The kernel process exited while a cell ran (os._exit, a crash, out of memory)."""

    def __init__(
        self, *, cell_index: int, execution_count: int | None, during: str | None = None
    ) -> None:
        self.during = during
        if during is None:
            message = (
                f"the kernel died while running cell {cell_index}: the cell called "
                "os._exit, crashed the interpreter, or ran out of memory; fix the cell and "
                "run again"
            )
        else:
            message = (
                f"the kernel died {during}: most likely it ran out of memory (the state is "
                "pickled in the kernel's own process); progress up to that point is saved. "
                "Give the run more memory, or --snapshot off to resume by replaying cells"
            )
        super().__init__(message, cell_index=cell_index, execution_count=execution_count)


class StorageError(SpotbookError):
    """Reading or writing the run store or the output location failed."""

    retryable = True


class KernelStartError(StorageError):
    """The kernel did not start (infrastructure; a retry may pass)."""


class SupersededError(SpotbookError):
    """Another, newer attempt took over this run; this one must stop writing."""

    retryable = True


class ExecutionTimeoutError(SpotbookError, TimeoutError):
    """A time limit was exceeded."""


class CellTimeoutError(ExecutionTimeoutError):
    """One cell ran longer than ``--execution-timeout``."""

    def __init__(self, *, cell_index: int, timeout: float) -> None:
        self.cell_index = cell_index
        self.timeout = timeout
        super().__init__(
            f"cell {cell_index} ran longer than its {timeout:g} s limit "
            "(--execution-timeout); raise the limit or make the cell faster"
        )


class RunTimeoutError(ExecutionTimeoutError):
    """The whole run ran longer than ``--timeout``."""

    def __init__(self, *, cell_index: int, timeout: float) -> None:
        self.cell_index = cell_index
        self.timeout = timeout
        super().__init__(
            f"the run exceeded its {timeout:g} s limit (--timeout) during cell {cell_index}; "
            "progress up to the previous cell is saved"
        )


class PreemptionBudgetError(SpotbookError):
    """The run was preempted more often than ``--max-preemptions`` allows."""


class StoreIntegrityError(SpotbookError):
    """Something the runner would trust in a run store failed its check (HMAC, hash,
    place, path); nothing of it was used."""


class SnapshotIntegrityError(StoreIntegrityError):
    """A kernel-state snapshot failed verification and was not loaded."""


class ResumeRefusedError(SpotbookError):
    """``--strict-resume``: the resumed run could differ from an uninterrupted one."""


class CommandFailedError(SpotbookError):
    """A command spotbook ran for the user (a cloud plan's step, a drill's ``gcloud``)
    failed, or what it set off did not happen in time: fix the cause and run again."""

    retryable = True


class ClusterError(SpotbookError):
    """The Kubernetes API refused or failed a request (exit 3: may pass on retry)."""

    retryable = True


class Terminated(SpotbookError):
    """The runner stopped on a signal after committing its progress."""

    retryable = True

    def __init__(self, signame: str, resume_hint: str) -> None:
        self.signame = signame
        super().__init__(f"stopped on {signame} after saving progress; {resume_hint}")
