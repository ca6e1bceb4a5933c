"""In-cell resume points, the kernel's side: a cell's top-level ``for`` loops checkpoint
at iteration boundaries, and a resumed cell goes on at the next iteration.

The notebook's source is never changed. :class:`LoopPoints`, one of IPython's AST
transformers, rewrites what the kernel *executes*, and only for a cell whose execute
request asks for it (the runner's request metadata, ``spotbook_loops``; a replay and a
plain Jupyter run never do): each top-level ``for`` of the cell iterates through
:func:`iterate`, which, after an iteration's body has run and before the next item is
drawn, takes a snapshot of the kernel when one is due (the same state a snapshot between
cells saves, the loop's iterator included, so the position comes back with it), hands it
to the runner and waits until the runner has committed it. A resumed cell skips the
statements before the loop it stopped in and iterates the restored iterator
(:func:`resume`): the finished iterations do not run again, the statements after the loop
do.

A loop is a resume point only where its iterator can be saved and iterated on to the same
items: Python's own iterators over ranges, lists, tuples, strings, bytes, dicts and
arrays, and ``enumerate``/``zip``/``reversed`` of those. Any other (a generator, a file, a
data loader) is a loop the cell runs again from its first line after a kill; the first
boundary says which and why, and the runner's report names it.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import select
import sys
import time
from collections.abc import Iterator
from typing import Any

# where the runner's execute request carries what a cell's loops do (its metadata)
REQUEST_KEY = "spotbook_loops"
# the output type of the kernel's message that a checkpoint is written: never the cell's
CHECKPOINT_MIME = "application/vnd.spotbook.loop-checkpoint+json"
# the name the loop's position is kept under in the namespace while a snapshot is taken
POSITION = "__spotbook_loop__"
_MODULE = "spotbook.kernel.loops"

# builtin iterators whose pickled form is their position (CPython pickles them by value)
_SIMPLE = {
    type(iter(range(0))).__name__,
    type(iter(range(1 << 70))).__name__,  # longrange_iterator
    type(iter([])).__name__,
    type(iter(())).__name__,
    type(iter("")).__name__,
    type(iter(b"")).__name__,
    type(iter(bytearray())).__name__,
    type(iter({})).__name__,
    type(iter({}.values())).__name__,
    type(iter({}.items())).__name__,
    type(reversed([])).__name__,
    "iterator",  # the sequence iterator: numpy arrays, any __getitem__ sequence
    "reversed",
}
_COMBINED = {"enumerate", "zip"}

_config: dict[str, Any] = {}  # the running cell's (from its request), while it runs
_state: dict[str, Any] = {"taken": 0, "last": 0.0, "seq": 0, "cell_started": 0.0}
_parent_pid = os.getppid()


class Preempted(Exception):
    """Raised at a loop boundary after the checkpoint taken on the node's notice: the
    cell stops here and goes on from that checkpoint on the next node."""


def why_not_resumable(it: Any) -> str:
    """'' when iterator ``it`` can be saved and iterated on to the same items, else why
    not (in a person's words)."""
    name = type(it).__name__
    if type(it).__module__ != "builtins":
        kind = f"{type(it).__module__}.{type(it).__qualname__}"
        return f"it iterates a {kind}, which cannot be saved mid-way"
    if name in _SIMPLE:
        return ""
    if name in _COMBINED:
        try:
            _, args, *_ = it.__reduce__()
        except Exception as exc:
            return f"its {name} cannot be saved ({exc})"
        inner = args[0] if name == "enumerate" else args
        parts = inner if name == "zip" else (inner,)
        for part in parts:
            why = why_not_resumable(part)
            if why:
                return why
        return ""
    if name == "generator":
        return "it iterates a generator, which cannot be saved mid-way"
    return f"it iterates a {name}, which cannot be saved mid-way"


# -- the transformer ---------------------------------------------------------------------
def _request_meta() -> dict[str, Any] | None:
    """What the execute request running now asks of its loops, or None."""
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
        if kernel is None:
            return None
        try:
            parent = kernel.get_parent("shell")
        except TypeError:
            parent = kernel.get_parent()
        meta = (parent or {}).get("metadata") or {}
        asked = meta.get(REQUEST_KEY)
        return asked if isinstance(asked, dict) else None
    except Exception:
        return None


def _call(func: str, *args: ast.expr) -> ast.Call:
    module = ast.Call(
        func=ast.Name(id="__import__", ctx=ast.Load()),
        args=[ast.Constant(_MODULE)],
        keywords=[ast.keyword(arg="fromlist", value=ast.List([ast.Constant("_")], ast.Load()))],
    )
    return ast.Call(
        func=ast.Attribute(value=module, attr=func, ctx=ast.Load()), args=list(args), keywords=[]
    )


class LoopPoints(ast.NodeTransformer):
    """IPython's AST transformer: the top-level loops of a cell the runner asked for."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        asked = _request_meta()
        if asked is None:
            _config.clear()
            return node
        _config.clear()
        _config.update(asked)
        _state["cell_started"] = _state["last"] = time.monotonic()
        resume = asked.get("resume") or None
        body = list(node.body)
        loops = [i for i, stmt in enumerate(body) if isinstance(stmt, ast.For)]
        if resume is not None:
            n = int(resume["loop"])
            if n >= len(loops):  # (the runner checks the source first; never a guess)
                raise ValueError(f"spotbook: the cell has no loop {n} to resume")
            at = loops[n]
            loop = body[at]
            assert isinstance(loop, ast.For)
            loop.iter = _call("resume", ast.Constant(n))
            rest = body[at + 1 :]
            for k, i in enumerate(loops[n + 1 :], start=n + 1):
                stmt = body[i]
                assert isinstance(stmt, ast.For)
                stmt.iter = _call("iterate", ast.Constant(k), stmt.iter)
            node.body = [loop, *rest]
            return node
        for k, i in enumerate(loops):
            stmt = body[i]
            assert isinstance(stmt, ast.For)
            stmt.iter = _call("iterate", ast.Constant(k), stmt.iter)
        return node


def install(shell: Any) -> None:
    """Register the transformer with IPython (once)."""
    if not any(isinstance(t, LoopPoints) for t in shell.ast_transformers):
        shell.ast_transformers.append(LoopPoints())


# -- the loops -----------------------------------------------------------------------------
def iterate(loop: int, iterable: Any) -> Iterator[Any]:
    """The items of ``iterable``, with a checkpoint at each boundary that is due."""
    it = iter(iterable)
    total = _total(iterable)
    return _steps(loop, it, 0, total)


def resume(loop: int) -> Iterator[Any]:
    """The rest of loop ``loop`` after the checkpoint the kernel was restored from."""
    from IPython import get_ipython

    ns = get_ipython().user_ns
    saved = ns.pop(POSITION, None)
    if not isinstance(saved, dict) or saved.get("loop") != loop:
        raise RuntimeError(
            f"spotbook: the position of loop {loop} was not restored; rerun the notebook"
        )
    return _steps(loop, saved["iter"], int(saved["iteration"]), saved.get("total"))


def _total(iterable: Any) -> int | None:
    try:
        return len(iterable)
    except Exception:
        return None


def _steps(loop: int, it: Iterator[Any], done: int, total: int | None) -> Iterator[Any]:
    why = why_not_resumable(it) if _config else ""
    if why and _config:
        _tell({"loop": loop, "unresumable": why})
    for item in it:
        yield item
        done += 1  # the body of that iteration has run: a boundary
        if _config and not why:
            notice = _notice_given()
            if notice or _due():
                _checkpoint(loop, it, done, total, notice)
                if notice:
                    from .helpers import preempted

                    preempted()  # tells the runner the cell stopped on the notice
                    raise Preempted(
                        f"stopped after iteration {done} on the node's notice; the run "
                        "goes on from here on the next node"
                    )


def _notice_given() -> bool:
    path = os.environ.get("SPOTBOOK_NOTICE_FILE")
    return bool(path) and os.path.exists(str(path))


def _due() -> bool:
    interval = _config.get("interval")
    if interval is None:
        return False
    return bool(time.monotonic() - _state["last"] >= float(interval))


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _tell(payload: dict[str, Any]) -> None:
    """A message to the runner, under the running cell's request (never shown)."""
    _flush()  # what the cell printed before this boundary goes out first
    from IPython import get_ipython

    get_ipython().display_pub.publish(data={CHECKPOINT_MIME: payload}, metadata={})


def _checkpoint(loop: int, it: Any, done: int, total: int | None, notice: bool) -> None:
    from IPython import get_ipython

    from . import session
    from .pickling import Blobs

    t0 = time.monotonic()
    ns = get_ipython().user_ns
    ns[POSITION] = {"loop": loop, "iter": it, "iteration": done, "total": total}
    try:
        with session._outputs_apart():
            manifest = session.take_in_cell(Blobs(_config["blob_dir"]))
    except Exception as exc:
        _tell({"loop": loop, "iteration": done, "error": f"{type(exc).__name__}: {exc}"[:500]})
        _state["last"] = time.monotonic()
        return
    finally:
        ns.pop(POSITION, None)
    _state["seq"] += 1
    base = os.path.join(_config["dir"], f"loop-{os.getpid()}-{_state['seq']}")
    with open(base + ".json", "w") as fh:
        json.dump(manifest, fh)
    gate = session._Gate(base + ".go")
    try:
        _tell(
            {
                "loop": loop,
                "iteration": done,
                "total": total,
                "manifest": base + ".json",
                "gate": base + ".go",
                "kernel_seconds": time.monotonic() - t0,
                "cell_seconds": t0 - _state["cell_started"],
                "notice": notice,
                "written": sorted(session._written),
            }
        )
        _wait(gate)
    finally:
        gate.close()
        with contextlib.suppress(OSError):
            os.unlink(base + ".json")
    _state["taken"] += 1
    _state["last"] = time.monotonic()


def _wait(gate: Any) -> None:
    """Until the runner has committed the checkpoint (or is gone: its kernel goes on)."""
    while True:
        ready, _, _ = select.select([gate.fd], [], [], 1.0)
        if ready:
            gate.wait()
            return
        if os.getppid() != _parent_pid:
            return
