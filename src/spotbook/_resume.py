"""Resume planning: which finished cells to replay, and in which order. Pure.

After a kill the runner restores the last committed snapshot. Cells must then
be replayed (outputs suppressed) when

- they ran after that snapshot was taken (the tail), or
- they bound a variable that could not be restored (open file, lock,
  generator, a pickle that does not load) *and* that a later cell reads, and
  transitively the cells that bound unrestored variables those cells read, or
- they are tagged ``spotbook-replay`` (imports with side effects, device setup).

Cells tagged ``spotbook-no-replay`` are never replayed. Replaying a producer
cell may also rebind or mutate restored variables it touches, so those are
restored again right after the head replay, before the tail runs.

Which cell binds which name is found statically (``ast``), over-approximating
reads; the runner passes a function that turns IPython syntax into Python.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

REPLAY_TAG = "spotbook-replay"
NO_REPLAY_TAG = "spotbook-no-replay"

Transform = Callable[[str], str]


@dataclass(frozen=True)
class CellNames:
    binds: frozenset[str]
    reads: frozenset[str]
    # for each function or class the cell defines: the globals its body may read
    # when it is called later
    deferred: dict[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ResumePlan:
    """What a resumed attempt does before it runs cell ``start``."""

    start: int
    snapshot_after: int | None
    head: tuple[int, ...] = ()
    restore_again: frozenset[str] = frozenset()
    tail: tuple[int, ...] = ()
    reasons: dict[int, str] = field(default_factory=dict)

    @property
    def replay(self) -> tuple[int, ...]:
        return self.head + self.tail


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def cell_names(source: str, transform: Transform | None = None) -> CellNames:
    """Names a cell binds at top level and names it reads anywhere."""
    try:
        code = transform(source) if transform else source
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return CellNames(frozenset(), frozenset())
    binds: set[str] = set()
    reads: set[str] = set()
    deferred: dict[str, frozenset[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            reads.add(node.id)
        elif isinstance(node, ast.Attribute | ast.Subscript) and isinstance(
            node.ctx, ast.Store | ast.Del
        ):
            # x.a = ..., x[0] = ...: mutates x; count it as a read so x is restored again
            base = node.value
            while isinstance(base, ast.Attribute | ast.Subscript):
                base = base.value
            if isinstance(base, ast.Name):
                reads.add(base.id)
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _SCOPES):
                if not isinstance(child, ast.Lambda):
                    binds.add(child.name)
                    deferred[child.name] = frozenset(
                        n.id
                        for n in ast.walk(child)
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                    )
                continue  # names inside are local to that scope
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store | ast.Del):
                binds.add(child.id)
            elif isinstance(child, ast.Import | ast.ImportFrom):
                for alias in child.names:
                    binds.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(child, ast.Global):
                binds.update(child.names)
            stack.append(child)
    return CellNames(frozenset(binds), frozenset(reads), deferred)


def _last_binder(names: dict[int, CellNames], name: str) -> int | None:
    return next((i for i in sorted(names, reverse=True) if name in names[i].binds), None)


def plan_resume(
    *,
    start: int,
    executable: Sequence[bool],
    sources: Sequence[str],
    tags: Sequence[Sequence[str]],
    snapshot_after: int | None,
    unrestored: frozenset[str] = frozenset(),
    transform: Transform | None = None,
) -> ResumePlan:
    """Plan the replay for a run whose cells ``0..start-1`` are finished."""
    done = [i for i in range(start) if executable[i]]
    never = {i for i in done if NO_REPLAY_TAG in tags[i]}
    reasons: dict[int, str] = {}
    if snapshot_after is None:
        tail = [i for i in done if i not in never]
        reasons = dict.fromkeys(tail, "no snapshot")
        return ResumePlan(start, None, tail=tuple(tail), reasons=reasons)

    names = {i: cell_names(sources[i], transform) for i in done if i <= snapshot_after}
    head: set[int] = {i for i in names if REPLAY_TAG in tags[i]}
    for i in head:
        reasons[i] = f"tagged {REPLAY_TAG}"
    # An unrestored variable nothing later reads (a closed file left by `with open`)
    # does not need its cell replayed: that cell may be expensive or touch the world.
    # "Later reads" include, transitively, the globals read by the bodies of functions
    # and classes later cells use (a restored function that calls an unrestored `ip`).
    later_reads: set[str] = set()
    for i in range(snapshot_after + 1, len(sources)):
        if executable[i]:
            later_reads |= cell_names(sources[i], transform).reads
    frontier = set(later_reads)
    while frontier:
        name = frontier.pop()
        binder = _last_binder(names, name)
        if binder is not None:
            new = names[binder].deferred.get(name, frozenset()) - later_reads
            later_reads |= new
            frontier |= new
    missing = set(unrestored) & later_reads
    resolved: set[str] = set()
    while missing:
        name = missing.pop()
        resolved.add(name)
        producer = _last_binder(names, name)
        if producer is None or producer in never:
            continue
        if producer not in head:
            reasons[producer] = f"binds {name!r}, which was not restored"
            head.add(producer)
        missing |= (names[producer].reads & set(unrestored)) - resolved
    head -= never
    touched: set[str] = set()
    for i in head:
        touched |= names[i].binds | names[i].reads
    tail = [i for i in done if i > snapshot_after and i not in never]
    for i in tail:
        reasons[i] = "ran after the snapshot"
    return ResumePlan(
        start=start,
        snapshot_after=snapshot_after,
        head=tuple(sorted(head)),
        restore_again=frozenset(touched - set(unrestored)),
        tail=tuple(tail),
        reasons=reasons,
    )
