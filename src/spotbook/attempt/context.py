"""What the owners of an attempt's concerns may ask of the attempt they serve.

The runner implements :class:`Attempt`; the cell loop, the snapshots and the restorer
are given one and use nothing else of it. (So they never import the runner, and a
test could hand them another implementation.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .._models import RunSpec
from ..store.runstore import RunStore
from .executor import KernelSession
from .in_cell import InCell
from .journal import Journal
from .kernel_ops import KernelOps
from .notice import Notice
from .progress import Progress

T = TypeVar("T")


@dataclass(frozen=True)
class RunnerOptions:
    """How the runner behaves, apart from what the run spec fixes."""

    # output.ipynb and OUTPUT are rewritten after a committed cell at most this often (and
    # never more often than 20 times a write's cost); one skipped is written this long
    # after the last, while the next cell runs
    output_refresh: float = 1.0
    on_output: Callable[[str, dict[str, Any]], None] | None = None
    progress: Progress | None = None  # the CLI's and the API's tqdm bar
    handle_signals: bool = True
    grace: float | None = None  # overrides the run's --grace for this attempt
    strict_resume: bool = False  # refuse to resume when the result could differ
    # Called from a watchdog thread when the process is still here EXIT_MARGIN after
    # the notice's deadline; it must end the process (the CLI exits with 75). None: no
    # watchdog (the Python API never ends its caller's process).
    on_overrun: Callable[[str], None] | None = None
    # What starts the kernel, given KernelSession's arguments: KernelSession itself, or
    # anything with its surface (the tests' fake kernel drives the real cell loop with it)
    kernel_factory: Callable[..., KernelSession] | None = None


class Attempt(Protocol):
    """One attempt at a run, as its collaborators see it."""

    store: RunStore
    spec: RunSpec
    nb: Any  # the frozen notebook (a NotebookNode) the kernel runs
    opts: RunnerOptions
    session: KernelSession | None  # the kernel, once started (None before)
    notice: Notice | None  # the termination notice, once the attempt has begun
    grace: float  # how long a running cell may take to finish after the notice
    tmp: str  # the attempt's private directory
    journal: Journal
    in_cell: InCell  # checkpoints inside cells (a loop's iteration boundary)

    @property
    def kernel(self) -> KernelSession:
        """The kernel that runs now (asked for before one started: a bug, not a None)."""
        ...

    @property
    def ops(self) -> KernelOps:
        """What the runner may ask of the kernel that runs now (the typed seam)."""
        ...

    def race(
        self, coro: Awaitable[T], *, grace: float, index: int, cell_timeout: float | None = None
    ) -> Awaitable[T]:
        """``coro`` raced against the time limits and the notice."""
        ...

    def start_kernel(self, index: int) -> Awaitable[None]:
        """A fresh kernel with spotbook's watchers in it (replacing any before)."""
        ...

    def kernel_may_die(self, index: int, during: str) -> AbstractAsyncContextManager[None]:
        """The kernel dying in the block: exit 75 after a notice, else KernelDiedError."""
        ...

    def save_checkpoint_dir(self, index: int) -> Awaitable[None]:
        """Upload the checkpoint directory now (object stores), before cell ``index``'s
        record commits."""
        ...

    def resume_hint(self) -> str:
        """What to tell the user to continue the run."""
        ...
