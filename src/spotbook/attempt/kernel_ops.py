"""Every operation the runner asks of the kernel, in one place: the host's side of the
kernel seam.

The kernel's side is :mod:`spotbook.kernel.session`, imported in the kernel by name. The
runner reaches it only through :class:`KernelOps`: each method names one operation of that
module, passes its arguments as literals (``repr`` of str, int and tuples; JSON text for
documents), and decodes its reply (the kernel's functions answer JSON text, or nothing).
No other host module assembles Python source for the kernel. Errors come back typed:
:class:`KernelError` with the kernel's exception class, and :func:`storage_failure` tells an
I/O failure (disk full, store gone) from state that cannot be pickled.

The transport is a :class:`Transport`: the real one is
:class:`spotbook.attempt.executor.KernelSession` (silent execute requests on the shell
channel); anything with its two coroutines can stand in for it.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
from typing import Any, Protocol

# the kernel side, imported under no name of the notebook's (nothing is bound in it)
KERNEL_MODULE = "__import__('spotbook.kernel.session', fromlist=['_'])"


class KernelError(RuntimeError):
    """Code spotbook ran in the kernel raised; ``ename`` is the kernel's exception class."""

    def __init__(self, ename: object, evalue: object) -> None:
        super().__init__(f"{ename}: {evalue}")
        self.ename, self.evalue = str(ename), str(evalue)


def storage_failure(exc: BaseException) -> bool:
    """Whether the kernel's operation failed on I/O (an OSError: disk full, file too big,
    permissions), as opposed to state it could not pickle."""
    ename = exc.ename if isinstance(exc, KernelError) else str(exc).split(":", 1)[0].strip()
    cls = getattr(builtins, ename, None)
    return isinstance(cls, type) and issubclass(cls, OSError)


class Transport(Protocol):
    """How an expression reaches the kernel and its value comes back (a literal)."""

    async def evaluate(self, expression: str, timeout: float | None = None) -> Any: ...

    async def call(self, code: str, result: str, timeout: float | None = None) -> Any: ...


def _call(operation: str, *args: object) -> str:
    """The expression that calls ``operation`` of the kernel side with ``args`` (literals)."""
    for a in args:
        if not isinstance(a, str | int | tuple) or isinstance(a, bool):
            raise TypeError(f"{operation}: {type(a).__name__} is not passed to the kernel")
    return f"{KERNEL_MODULE}.{operation}({', '.join(map(repr, args))})"


# what a cell's execute request asks for when the kernel's replies cannot carry the note
CELL_EFFECTS = _call("cell_effects")


def counter_at(n: int) -> str:
    """The expression that sets IPython's execution counter to ``n`` (works in a kernel
    where spotbook cannot be imported: it names only IPython's shell)."""
    return f"get_ipython().__setattr__('execution_count', {int(n)})"


class KernelOps:
    """The operations of :mod:`spotbook.kernel.session` the runner uses, over ``kernel``."""

    def __init__(self, kernel: Transport) -> None:
        self.kernel = kernel

    async def _json(self, operation: str, *args: object, timeout: float | None = None) -> Any:
        raw = await self.kernel.evaluate(_call(operation, *args), timeout)
        return json.loads(raw)

    async def _run(self, operation: str, *args: object) -> Any:
        """Run ``operation`` as a cell's code runs (imports see the kernel as a cell's do);
        what it left in ``result()`` (JSON), read in the same request."""
        return json.loads(await self.kernel.call(_call(operation, *args), _call("result")))

    # -- the kernel's start ------------------------------------------------------------
    async def init(self) -> dict[str, Any]:
        """Install spotbook's watchers; says whether replies carry the cell's note."""
        found: dict[str, Any] = await self._json("init")
        return found

    async def accelerators(self, timeout: float | None = None) -> Any:
        """The frameworks and devices the notebook used (for the attempt record)."""
        return await self._json("accelerators", timeout=timeout)

    # -- snapshots ----------------------------------------------------------------------
    async def snapshot_estimate(self) -> dict[str, Any]:
        """The state's size and whether the kernel may fork, before a snapshot."""
        found: dict[str, Any] = await self._json("snapshot_estimate")
        return found

    async def snapshot(self, blob_dir: str) -> dict[str, Any]:
        """A synchronous snapshot into ``blob_dir``; its manifest."""
        found: dict[str, Any] = await self._json("snapshot", blob_dir)
        return found

    async def snapshot_fork(self, blob_dir: str, result_path: str) -> dict[str, Any]:
        """A snapshot written by a fork (its ``pid``), or ``unsafe``: why it may not fork
        (and ``lasting``: never, in this kernel)."""
        found: dict[str, Any] = await self._json("snapshot_fork", blob_dir, result_path)
        return found

    async def snapshot_staged(self, blob_dir: str, result_path: str) -> dict[str, Any]:
        """A snapshot copied now and written by a thread of the kernel."""
        found: dict[str, Any] = await self._json("snapshot_staged", blob_dir, result_path)
        return found

    @staticmethod
    def snapshot_after_cell(blob_dir: str, result_path: str, begun: str, gate: str) -> str:
        """The expression that asks for a staged snapshot with a cell's own execute request
        (one of its user expressions: evaluated after the cell's code, if that raised
        nothing). Its value comes back in the reply: :meth:`expression_answer`. The kernel
        makes the file ``begun`` as it starts: the cell's code had ended. Where the cell
        opened files for writing, its writer writes nothing until :meth:`release_writer`
        lets it go at ``gate`` (elsewhere there is no gate, and releasing it does nothing)."""
        return _call("snapshot_after_cell", blob_dir, result_path, begun, gate)

    @staticmethod
    def release_writer(gate: str, *, go: bool) -> None:
        """Let the writer of a snapshot asked with its cell write (``go``), or drop it.
        Nothing happens where the kernel is gone (the gate has no reader, or is gone)."""
        with contextlib.suppress(OSError):
            fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                os.write(fd, b"g" if go else b"x")
            finally:
                os.close(fd)

    @staticmethod
    def expression_answer(value: Any) -> Any:
        """What a user expression asked with a cell answered (the kernel side's JSON), or
        the :class:`KernelError` it raised (returned, for the caller to raise where it
        handles the same operation asked for on its own); None when it was not evaluated
        (the cell failed)."""
        import ast

        if not isinstance(value, dict) or not value:
            return None
        if value.get("status") != "ok":
            return KernelError(value.get("ename"), value.get("evalue"))
        try:
            return json.loads(ast.literal_eval(value["data"]["text/plain"]))
        except (KeyError, TypeError, ValueError, SyntaxError) as exc:
            return KernelError(type(exc).__name__, f"an answer that is not JSON ({exc})")

    # -- restoring -----------------------------------------------------------------------
    async def restore_env(self, env: dict[str, Any]) -> dict[str, str]:
        """The working directory and environment variables back; what failed, by name."""
        failed: dict[str, str] = await self._json("restore_env", json.dumps(env))
        return failed

    async def missing_modules(self, blob_dir: str, imports: str) -> list[str]:
        """The modules the snapshot's state needs that cannot be imported here."""
        missing: list[str] = await self._json("missing_modules", blob_dir, imports)
        return missing

    async def not_installed(self, packages: list[str]) -> list[str]:
        """Of ``packages``, those not installed in the kernel's environment."""
        lacking: list[str] = await self._json("not_installed", json.dumps(packages))
        return lacking

    async def reimport(self, blob_dir: str, imports: str) -> list[str]:
        """Import the modules the snapshot's state came from (as a cell would); those
        that did not import (the unpickler reports what they leave out)."""
        failed: list[str] = await self._run("reimport", blob_dir, imports)
        return failed

    async def restore(
        self, blob_dir: str, manifest: dict[str, Any], keep: tuple[str, ...]
    ) -> dict[str, Any]:
        """Load the snapshot's variables (``keep``: names left as they are now); what was
        loaded and what failed, or ``integrity``/``missing``: why nothing was."""
        found: dict[str, Any] = await self._run("restore", blob_dir, json.dumps(manifest), keep)
        return found

    async def set_pre(self, pre: dict[str, Any]) -> dict[str, str]:
        """The cwd, environment and generators a replayed cell first started from; what
        could not be set, by part."""
        failed: dict[str, str] = await self._json("set_pre", json.dumps(pre))
        return failed

    async def apply_last(self) -> dict[str, str]:
        """The process state the snapshot recorded last, applied; what failed, by part."""
        failed: dict[str, str] = await self._json("apply_last")
        return failed

    async def set_execution_count(self, n: int) -> None:
        await self.kernel.evaluate(_call("set_execution_count", int(n)))

    async def is_bound(self, name: str) -> bool:
        """Whether the notebook's namespace binds ``name``."""
        return bool(await self.kernel.evaluate(f"{name!r} in get_ipython().user_ns"))
