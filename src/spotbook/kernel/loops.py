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
from collections.abc import Generator, Iterator
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
_NESTED: dict[str, Any] = {}  # a second transform within one request (see _request_meta)


def _request_meta() -> dict[str, Any] | None:
    """What the execute request running now asks of its loops, or None; None too for a
    second transform within the same request (a cell magic such as ``%%time`` compiling
    its body: its loops are not the cell's top-level statements)."""
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
        if not isinstance(asked, dict):
            return None
        request = ((parent or {}).get("header") or {}).get("msg_id")
        if request and request == _state.get("request"):
            return _NESTED
        _state["request"] = request
        return asked
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


_SIMPLE_STATEMENTS = (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign)
_F = "__spotbook_f"  # a resumable function's local: what it goes on from (None: a new call)
_L = "__spotbook_l"


class LoopPoints(ast.NodeTransformer):
    """IPython's AST transformer: the top-level loops of a cell the runner asked for, and
    those of the functions the cell defines (at the top level of the function's body)."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        asked = _request_meta()
        if asked is _NESTED:  # the armed cell's own magic compiling its body: as it is
            return node
        if asked is None:
            _config.clear()
            return node
        _config.clear()
        _config.update(asked)
        _state["cell_started"] = _state["last"] = time.monotonic()
        body = list(node.body)
        # where each top-level statement is, for a function's loop to say which one
        # called it (resumed from that statement)
        _config["statements"] = [
            (stmt.lineno, stmt.end_lineno or stmt.lineno, isinstance(stmt, _SIMPLE_STATEMENTS))
            for stmt in body
        ]
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef):
                _resumable_function(stmt, f"{asked.get('cell')}:{stmt.name}")
        loops = [i for i, stmt in enumerate(body) if isinstance(stmt, ast.For)]
        resume = asked.get("resume") or None
        start, resumed = 0, None
        if resume is not None and resume.get("function"):
            start = int(resume["stmt"])  # the statement that called the function
        elif resume is not None:
            resumed = int(resume["loop"])
            if resumed >= len(loops):  # (the runner checks the source first; never a guess)
                raise ValueError(f"spotbook: the cell has no loop {resumed} to resume")
            start = loops[resumed]
        for k, i in enumerate(loops):
            stmt = body[i]
            assert isinstance(stmt, ast.For)
            if k == resumed:
                stmt.iter = _call("resume", ast.Constant(k))
            elif i >= start:
                stmt.iter = _call("iterate", ast.Constant(k), stmt.iter)
        node.body = body[start:]
        return node


def _local_names(fn: ast.FunctionDef) -> list[str]:
    """The names a function binds in its own scope (its locals), in order of appearance."""
    names: dict[str, None] = {}
    declared: set[str] = set()
    a = fn.args
    for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
        if arg is not None:
            names[arg.arg] = None

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names[child.name] = None  # bound here; its inside is another scope
                continue
            if isinstance(child, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp):
                continue
            if isinstance(child, ast.GeneratorExp):
                continue
            if isinstance(child, ast.Global | ast.Nonlocal):
                declared.update(child.names)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                names[child.id] = None
            elif isinstance(child, ast.alias):
                names[(child.asname or child.name).split(".")[0]] = None
            elif isinstance(child, ast.ExceptHandler) and child.name:
                names[child.name] = None
            walk(child)

    for stmt in fn.body:
        walk(stmt)
    return [n for n in names if n not in declared and not n.startswith("__spotbook")]


def _resumable_function(fn: ast.FunctionDef, fid: str) -> None:
    """Make the top-level loops of ``fn``'s body resume points: on a resumed call, its
    locals come back as they were at the checkpoint and it goes on inside that loop."""
    body = list(fn.body)
    doc: list[ast.stmt] = []  # the docstring stays the function's first statement
    if ast.get_docstring(fn, clean=False) is not None:
        doc, body = body[:1], body[1:]
    loops = [i for i, stmt in enumerate(body) if isinstance(stmt, ast.For)]
    if not loops or any(isinstance(n, ast.Yield | ast.YieldFrom) for n in ast.walk(fn)):
        return  # nothing to resume, or a generator (its frame is not saved)
    f = ast.Name(id=_F, ctx=ast.Load())

    def resumed_at(op: ast.cmpop, k: int) -> ast.expr:
        """``__spotbook_f is None or k OP __spotbook_f["loop"]``: whether to run a part."""
        where = ast.Subscript(value=f, slice=ast.Constant("loop"), ctx=ast.Load())
        return ast.BoolOp(
            op=ast.Or(),
            values=[
                ast.Compare(left=f, ops=[ast.Is()], comparators=[ast.Constant(None)]),
                ast.Compare(left=ast.Constant(k), ops=[op], comparators=[where]),
            ],
        )

    restore: list[ast.stmt] = [
        ast.Assign(
            targets=[ast.Name(id=_L, ctx=ast.Store())],
            value=ast.Subscript(value=f, slice=ast.Constant("locals"), ctx=ast.Load()),
        )
    ]
    for name in _local_names(fn):
        restore.append(
            ast.If(
                test=ast.Compare(
                    left=ast.Constant(name),
                    ops=[ast.In()],
                    comparators=[ast.Name(id=_L, ctx=ast.Load())],
                ),
                body=[
                    ast.Assign(
                        targets=[ast.Name(id=name, ctx=ast.Store())],
                        value=ast.Subscript(
                            value=ast.Name(id=_L, ctx=ast.Load()),
                            slice=ast.Constant(name),
                            ctx=ast.Load(),
                        ),
                    )
                ],
                orelse=[],
            )
        )
    out: list[ast.stmt] = [
        ast.Assign(
            targets=[ast.Name(id=_F, ctx=ast.Store())], value=_call("enter", ast.Constant(fid))
        ),
        ast.If(
            test=ast.Compare(left=f, ops=[ast.IsNot()], comparators=[ast.Constant(None)]),
            body=restore,
            orelse=[],
        ),
    ]
    segment: list[ast.stmt] = []
    k = 0
    for stmt in body:
        if not isinstance(stmt, ast.For):
            segment.append(stmt)
            continue
        if segment:  # the statements before loop k: run unless resumed at loop k or later
            out.append(ast.If(test=resumed_at(ast.Gt(), k), body=segment, orelse=[]))
            segment = []
        make = ast.Lambda(
            args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=stmt.iter,
        )
        stmt.iter = _call("iterate_in", ast.Constant(fid), ast.Constant(k), make, f)
        out.append(ast.If(test=resumed_at(ast.GtE(), k), body=[stmt], orelse=[]))
        k += 1
    out.extend(segment)  # after the last loop: always
    fn.body = [*doc, *out]
    ast.fix_missing_locations(fn)


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


def iterate_in(fid: str, loop: int, make: Any, resumed: dict[str, Any] | None) -> Iterator[Any]:
    """Loop ``loop`` of the notebook's function ``fid``: as :func:`iterate` of what
    ``make()`` gives, or, in the call resumed at this loop, the rest of it."""
    if resumed is not None and resumed.get("loop") == loop:
        return _steps(loop, resumed["iter"], int(resumed["iteration"]), resumed.get("total"), fid)
    iterable = make()
    return _steps(loop, iter(iterable), 0, _total(iterable), fid)


def enter(fid: str) -> dict[str, Any] | None:
    """At the start of a call of the notebook's function ``fid``: what it goes on from,
    if this call is the one a resumed cell makes again (once), else None."""
    from IPython import get_ipython

    ns = get_ipython().user_ns
    saved = ns.get(POSITION)
    if isinstance(saved, dict) and saved.get("function") == fid:
        ns.pop(POSITION, None)
        return saved
    return None


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


def _steps(
    loop: int, it: Iterator[Any], done: int, total: int | None, fid: str = ""
) -> Iterator[Any]:
    why = why_not_resumable(it) if _config else ""
    if why and _config:
        _tell({"loop": loop, "unresumable": why, **({"function": fid} if fid else {})})
    began, first = time.monotonic(), done
    done = yield from _items(loop, it, done, total, fid, why)
    if _config and not why and _config.get("cell") is not None:
        # how long its iterations took: the profile `spotbook simulate` cuts the cell by
        _tell({"loop": loop, "finished": done, "from": first, "seconds": time.monotonic() - began})


def _items(
    loop: int, it: Iterator[Any], done: int, total: int | None, fid: str, why: str
) -> Generator[Any, None, int]:
    """The loop's items, a checkpoint at each due boundary; returns how many were done."""
    for item in it:
        yield item
        done += 1  # the body of that iteration has run: a boundary
        if _config and not why:
            notice = _notice_seen()
            if notice or _due():
                position = {"loop": loop, "iter": it, "iteration": done, "total": total}
                if fid:  # the call's frame: its locals, and the cell's statement that made it
                    # (the frame that draws the items: above this and :func:`_steps`)
                    where = _call_site(sys._getframe(2), fid)
                    if isinstance(where, str):
                        why = where
                        _tell({"loop": loop, "unresumable": why, "function": fid})
                        continue
                    position.update(where)
                _checkpoint(position, notice)
                if notice:
                    from .helpers import preempted

                    preempted()  # tells the runner the cell stopped on the notice
                    raise Preempted(
                        f"stopped after iteration {done} on the node's notice; the run "
                        "goes on from here on the next node"
                    )
    return done


def _notice_given() -> bool:
    path = os.environ.get("SPOTBOOK_NOTICE_FILE")
    return bool(path) and os.path.exists(str(path))


def _notice_seen() -> bool:
    """:func:`_notice_given`, looked up at most every ``_LOOK`` seconds (a boundary of a
    loop of microsecond iterations must not cost a file system call each)."""
    now = time.monotonic()
    if now < _state.get("look", 0.0):
        return False
    _state["look"] = now + _LOOK
    return _notice_given()


_LOOK = 0.02


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


def _call_site(frame: Any, fid: str) -> dict[str, Any] | str:
    """Where the notebook's function ``fid`` (running in ``frame``) was called from: its
    locals and the cell's top-level statement that called it; or why it cannot be
    resumed from there (a statement that would run other things again, another caller)."""
    from IPython import get_ipython

    caller = frame.f_back
    if caller is None or caller.f_globals is not get_ipython().user_ns:
        return f"function {fid.split(':', 1)[1]} was not called by the cell itself"
    if caller.f_code.co_name != "<module>":
        return f"function {fid.split(':', 1)[1]} was called by another function"
    line = caller.f_lineno
    for n, (first, last, simple) in enumerate(_config.get("statements") or ()):
        if first <= line <= last:
            if not simple:
                return (
                    f"function {fid.split(':', 1)[1]} was called inside a compound statement "
                    "(a loop, a with or an if block) of the cell"
                )
            names = {k: v for k, v in frame.f_locals.items() if not k.startswith("__spotbook")}
            return {"function": fid, "stmt": n, "locals": names}
    return f"the call of function {fid.split(':', 1)[1]} was not found in the cell"


def _checkpoint(position: dict[str, Any], notice: bool) -> None:
    from IPython import get_ipython

    from . import session
    from .pickling import Blobs

    t0 = time.monotonic()
    loop, done = position["loop"], position["iteration"]
    ns = get_ipython().user_ns
    _state["seq"] += 1
    base = os.path.join(_config["dir"], f"loop-{os.getpid()}-{_state['seq']}")
    forked: dict[str, Any] = {}
    ns[POSITION] = position
    try:
        with session._outputs_apart(), session.history_before_cell():
            if not notice and not _config.get("sync"):
                # a copy of the kernel writes it while the loop goes on (the pause: a
                # fork); where the kernel must not fork, it is written now
                forked = json.loads(session.snapshot_fork(_config["blob_dir"], base + ".json"))
            if "pid" not in forked:
                manifest = session.take_in_cell(Blobs(_config["blob_dir"]))
    except Exception as exc:
        _tell({"loop": loop, "iteration": done, "error": f"{type(exc).__name__}: {exc}"[:500]})
        _state["last"] = time.monotonic()
        return
    finally:
        ns.pop(POSITION, None)
    if "pid" not in forked:
        saved = (manifest.get("vars") or {}).get(POSITION) or {}
        if saved.get("kind") == "unserialisable":  # the loop's position cannot come back
            why = f"its position cannot be saved ({saved.get('error')})"
            _tell({"loop": loop, "unresumable": why})
            _state["last"] = time.monotonic()
            return
        with open(base + ".json", "w") as fh:
            json.dump(manifest, fh)
    gate = session._Gate(base + ".go")
    try:
        _tell(
            {
                "loop": loop,
                "iteration": done,
                "total": position["total"],
                **{k: position[k] for k in ("function", "stmt") if k in position},
                "manifest": base + ".json",
                "gate": base + ".go",
                "kernel_seconds": time.monotonic() - t0,
                "cell_seconds": t0 - _state["cell_started"],
                "notice": notice,
                "written": sorted(session._written),
                **({"pid": forked["pid"]} if "pid" in forked else {}),
            }
        )
        _wait(gate)
    finally:
        gate.close()
        if "pid" not in forked:  # (a copy's manifest is the runner's to remove)
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
