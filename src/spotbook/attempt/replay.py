"""Resume planning: which finished cells to replay, in which order, and what may
differ from an uninterrupted run. Pure.

After a kill the runner restores the last committed snapshot (variables and
process state). Cells are then replayed (outputs suppressed) when

- they ran after that snapshot was taken (the tail, in order), or
- they are part of a *replay chain*: a variable that could not be captured
  (a generator, a socket, a client) is rebuilt by replaying every cell that
  created *or may have changed* it — ``next(g)``, ``g.send(x)``, ``f(g)``,
  ``g += …``, ``state = {**state, …}`` — in the original order, and transitively
  the chains of the uncaptured variables those cells read, or
- they are tagged ``spotbook-replay`` (imports with side effects, device setup).

Cells tagged ``spotbook-no-replay`` are never replayed. After the chain, the
runner loads the snapshot's variables again, so what the replayed cells changed
in restored variables is undone.

The plan also says what may differ from an uninterrupted run, by name: a chain
cell that read a variable which later cells changed (it is replayed with the
snapshot's value, not the value it saw then), and a replayed cell that wrote
files, started processes, connected somewhere or drew random numbers (the cell
records say so). Which cell binds, reads or changes which name is found
statically (``ast``), over-approximating; the runner passes a function that turns
IPython syntax into Python.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

REPLAY_TAG = "spotbook-replay"
NO_REPLAY_TAG = "spotbook-no-replay"

Transform = Callable[[str], str]


@dataclass(frozen=True)
class CellNames:
    """The names one cell binds, reads and changes (the replay planner's view of it)."""

    binds: frozenset[str]
    reads: frozenset[str]
    # for each function or class the cell defines: the globals its body may read
    # when it is called later
    deferred: dict[str, frozenset[str]] = field(default_factory=dict)
    # names whose object the cell may change in place: x.a = …, x[0] = …, x.m(…), f(x)
    changes: frozenset[str] = frozenset()
    # for each name a top-level assignment binds: the names its value is made from
    feeds: dict[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ResumePlan:
    """What a resumed attempt does before it runs cell ``start``."""

    start: int
    snapshot_after: int | None
    head: tuple[int, ...] = ()
    tail: tuple[int, ...] = ()
    reasons: dict[int, str] = field(default_factory=dict)
    # uncaptured variable -> the cells of its replay chain
    chains: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # uncaptured variables a later cell needs but no replayable cell binds
    unrebuildable: dict[str, str] = field(default_factory=dict)
    # what may differ from an uninterrupted run, by name
    may_differ: tuple[str, ...] = ()
    # uncaptured variables nothing later reads (left out, and said so)
    dropped: tuple[str, ...] = ()
    # restored variables a rebuilt one is made from, whose replayed objects are kept
    # (not loaded again) so the two stay linked: the chain replays all their changes
    keep: frozenset[str] = frozenset()
    # files the tail writes, and their size before its first cell wrote them (None: it
    # created them): given back before the tail replays, so it writes them as it did
    give_back: dict[str, int | None] = field(default_factory=dict)

    @property
    def replay(self) -> tuple[int, ...]:
        return self.head + self.tail


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _base(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Starred):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def cell_names(source: str, transform: Transform | None = None) -> CellNames:
    """Names a cell binds at top level, reads anywhere, and may change in place."""
    try:
        code = transform(source) if transform else source
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return CellNames(frozenset(), frozenset())
    binds: set[str] = set()
    reads: set[str] = set()
    changes: set[str] = set()
    deferred: dict[str, frozenset[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            reads.add(node.id)
        elif isinstance(node, ast.Attribute | ast.Subscript) and isinstance(
            node.ctx, ast.Store | ast.Del
        ):
            base = _base(node.value)
            if base:
                reads.add(base)  # x.a = ...: x is restored again after a replay
                changes.add(base)
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):
                base = _base(node.func.value)
                if base:
                    changes.add(base)  # x.append(...), x.send(...)
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                base = _base(arg)
                if base:
                    changes.add(base)  # next(g), f(x): may change x
        elif isinstance(node, ast.AugAssign):
            base = _base(node.target)
            if base:
                changes.add(base)
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
    feeds: dict[str, set[str]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            loads = {
                n.id
                for n in ast.walk(stmt.value)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            }
            for target in targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        feeds.setdefault(n.id, set()).update(loads)
    return CellNames(
        frozenset(binds),
        frozenset(reads),
        deferred,
        frozenset(changes | binds),
        {k: frozenset(v) for k, v in feeds.items()},
    )


def _last_binder(names: Mapping[int, CellNames], name: str) -> int | None:
    """The last cell that binds ``name``; failing that, the last ``from M import *``
    (it may bind any name: replaying the import binds it again, e.g. sympy's ``RR``)."""
    found = next((i for i in sorted(names, reverse=True) if name in names[i].binds), None)
    if found is None:
        found = next((i for i in sorted(names, reverse=True) if "*" in names[i].binds), None)
    return found


def _with_deferred(names: Mapping[int, CellNames], found: set[str]) -> set[str]:
    """``found`` plus the globals read by the bodies of functions it names, transitively."""
    out = set(found)
    frontier = set(found)
    while frontier:
        name = frontier.pop()
        binder = _last_binder(names, name)
        if binder is not None:
            new = names[binder].deferred.get(name, frozenset()) - out
            out |= new
            frontier |= new
    return out


def describe_effects(effects: Mapping[str, Sequence[str]]) -> str:
    """A cell's recorded effects as words: 'writes a.csv; runs ls'."""
    words = {
        "writes": "writes",
        "appends": "appends to",
        "deletes": "deletes",
        "runs": "runs",
        "connects": "connects to",
    }
    parts = []
    for kind, items in sorted(effects.items()):
        if kind == "random":
            parts.append("draws from a global random generator")
        elif items:
            parts.append(f"{words.get(kind, kind)} {', '.join(items)}")
    return "; ".join(parts)


def plan_resume(
    *,
    start: int,
    executable: Sequence[bool],
    sources: Sequence[str],
    tags: Sequence[Sequence[str]],
    snapshot_after: int | None,
    unrestored: Mapping[str, str] | frozenset[str] = frozenset(),
    transform: Transform | None = None,
    effects: Mapping[int, Mapping[str, Sequence[str]]] | None = None,
    stable: frozenset[str] = frozenset(),
    rng_known: frozenset[int] = frozenset(),
    undo: Mapping[int, Mapping[str, int | None]] | None = None,
) -> ResumePlan:
    """Plan the replay for a run whose cells ``0..start-1`` are finished.

    ``unrestored`` maps each variable the snapshot could not give back to what it is
    (its type); ``effects`` are the finished cells' recorded effects; ``stable`` are
    restored names no cell changes meaningfully (modules, functions, classes);
    ``rng_known`` are cells whose random generators' starting state was recorded, so
    replaying them out of order draws the same numbers; ``undo`` gives, for cells that
    wrote files, each file's size before the cell ran.
    """
    effects = effects or {}
    kinds = dict(unrestored) if isinstance(unrestored, Mapping) else dict.fromkeys(unrestored, "")
    done = [i for i in range(start) if executable[i]]
    never = {i for i in done if NO_REPLAY_TAG in tags[i]}
    reasons: dict[int, str] = {}
    may_differ: list[str] = []
    undo = undo or {}
    if snapshot_after is None:
        tail = [i for i in done if i not in never]
        reasons = dict.fromkeys(tail, "no snapshot")
        back = _give_back(tail, undo)
        _effects_of(tail, _without(effects, back), may_differ, in_order=True)
        return ResumePlan(
            start,
            None,
            tail=tuple(tail),
            reasons=reasons,
            may_differ=tuple(may_differ),
            give_back=back,
        )

    names = {i: cell_names(sources[i], transform) for i in done if i <= snapshot_after}
    head: set[int] = {i for i in names if REPLAY_TAG in tags[i] and i not in never}
    for i in head:
        reasons[i] = f"tagged {REPLAY_TAG}"
    later_reads: set[str] = set()
    for i in range(snapshot_after + 1, len(sources)):
        if executable[i]:
            later_reads |= cell_names(sources[i], transform).reads
    later_reads = _with_deferred(names, later_reads)
    # An uncaptured variable nothing later reads (a closed file left by `with open`)
    # needs no replay: its cells may be expensive or touch the world.
    needed = set(kinds) & later_reads
    touches = {
        i: _with_deferred(names, set(n.changes | n.reads)) | n.binds for i, n in names.items()
    }
    chain_cells: set[int] = set()
    while True:
        cells = {i for i in names if i not in never and touches[i] & needed}
        grown = needed | {n for i in cells for n in (names[i].reads | touches[i]) if n in kinds}
        if grown == needed and cells == chain_cells:
            break
        needed, chain_cells = grown, cells
    chains: dict[str, tuple[int, ...]] = {}
    unrebuildable: dict[str, str] = {}
    for name in sorted(needed):
        chain = tuple(sorted(i for i in chain_cells if name in touches[i]))
        binder = _last_binder(names, name)
        if binder is None:
            unrebuildable[name] = "no cell before the snapshot binds it"
        elif binder in never:
            unrebuildable[name] = f"cell {binder}, which binds it, is tagged {NO_REPLAY_TAG}"
        elif binder not in chain:  # bound by a star import, which names nothing
            chain = tuple(sorted({*chain, binder}))
            chain_cells.add(binder)
        chains[name] = chain
        kind = kinds.get(name) or "value"
        for i in chain:
            why = f"rebuilds {name!r} ({kind})"
            reasons[i] = f"{reasons[i]}; {why}" if i in reasons else why
    head |= chain_cells
    # A chain cell sees restored variables as they were at the snapshot: say so where a
    # later cell (up to the snapshot) changed one it reads.
    for i in sorted(chain_cells):
        # (a name the cell binds itself is, as a rule, bound before it is read)
        for name in sorted(names[i].reads - names[i].binds - set(kinds) - stable):
            changers = [j for j in names if i < j and name in names[j].changes]
            if changers and _last_binder(names, name) is not None:
                may_differ.append(
                    f"cell {i} was replayed to rebuild "
                    f"{', '.join(repr(n) for n in sorted(needed) if i in chains[n])} with "
                    f"{name!r} as it was at the snapshot after cell {snapshot_after}, not as it "
                    f"was when cell {i} first ran (cell {changers[0]} changed it since)"
                )
    keep = _kept(names, chain_cells, needed, set(kinds) | set(stable), snapshot_after, may_differ)
    tail = [i for i in done if i > snapshot_after and i not in never]
    for i in tail:
        reasons[i] = "ran after the snapshot"
    back = _give_back(tail, undo)
    _effects_of(sorted(head), effects, may_differ, in_order=False, rng_known=rng_known)
    _effects_of(tail, _without(effects, back), may_differ, in_order=True)
    dropped = tuple(sorted(set(kinds) - needed))
    return ResumePlan(
        start=start,
        snapshot_after=snapshot_after,
        head=tuple(sorted(head)),
        tail=tuple(tail),
        reasons=reasons,
        chains=chains,
        unrebuildable=unrebuildable,
        may_differ=tuple(may_differ),
        dropped=dropped,
        keep=frozenset(keep),
        give_back=back,
    )


def _give_back(
    tail: Sequence[int], undo: Mapping[int, Mapping[str, int | None]]
) -> dict[str, int | None]:
    """Each file the tail wrote, with its size before the first tail cell wrote it."""
    back: dict[str, int | None] = {}
    for i in tail:
        for path, size in (undo.get(i) or {}).items():
            back.setdefault(path, size)
    return back


def _without(
    effects: Mapping[int, Mapping[str, Any]], back: Mapping[str, int | None]
) -> dict[int, dict[str, Any]]:
    """Effects less the writes to files that are given back (replaying them is exact)."""
    out: dict[int, dict[str, Any]] = {}
    for i, found in effects.items():
        found = dict(found)
        if "writes" in found:
            found["writes"] = [p for p in found["writes"] if p not in back]
        out[i] = found
    return out


def _kept(
    names: Mapping[int, CellNames],
    chain_cells: set[int],
    rebuilt: set[str],
    skip: set[str],
    snapshot_after: int,
    may_differ: list[str],
) -> set[str]:
    """Restored variables a rebuilt one is made from (``cur = con.cursor()``): keep the
    replayed object, so the rebuilt one still refers to it, when every change to it up
    to the snapshot was replayed too; else say they are no longer linked."""
    keep: set[str] = set()
    for i in sorted(chain_cells):
        for made in sorted(set(names[i].feeds) & rebuilt):
            for source in sorted(names[i].feeds[made] - skip - rebuilt):
                binder = _last_binder({j: n for j, n in names.items() if j <= i}, source)
                if binder is None or binder not in chain_cells:
                    continue  # made before the chain, and restored: the link holds
                later = [
                    j
                    for j in names
                    if binder < j <= snapshot_after
                    and j not in chain_cells
                    and source in names[j].changes
                ]
                if later:
                    may_differ.append(
                        f"{made!r} was rebuilt by replaying cell {i} from {source!r}, which "
                        f"cell {later[0]} changed since; {source!r} is restored from the "
                        f"snapshot, so {made!r} no longer refers to it"
                    )
                else:
                    keep.add(source)
    return keep


def _effects_of(
    cells: Sequence[int],
    effects: Mapping[int, Mapping[str, Any]],
    out: list[str],
    *,
    in_order: bool,
    rng_known: frozenset[int] = frozenset(),
) -> None:
    """What replayed cells did to the world. Random draws count only for a cell replayed
    out of order without its generators' starting state: in order, from the
    snapshot's generators, a cell draws what it drew the first time."""
    for i in cells:
        found = dict(effects.get(i) or {})
        if in_order or i in rng_known:
            found.pop("random", None)
        said = describe_effects(found)
        if said:
            out.append(f"cell {i} {said}, and was replayed")
