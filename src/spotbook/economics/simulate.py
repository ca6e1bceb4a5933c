"""Long runs under preemption, simulated from a measured run's profile.

The profile is what a real run measured: each cell's compute, what a snapshot costs,
what a new attempt pays to start its kernel and restore state. The simulation runs the
profile (tiled to a longer duration: more epochs of the same work) on nodes that are
preempted at a hazard rate (exponential times, counted in node time) or at the times of
a trace, each preemption followed by a wait for a new node. Strategies:

- ``resume``: spotbook — cells commit as they finish, a snapshot follows a cell once the
  compute since the last reaches the interval; a preemption loses the compute since the
  last snapshot, and the next attempt pays kernel start and restore;
- ``restart``: the Job controller alone — a preemption loses everything; the next
  attempt starts the notebook over.

A simulated run goes from one preemption to the next: where each lands, and what it loses,
follows from the cells' cumulative compute and the chain of snapshot points a run that is
never preempted would take (a resume starts from one of them, so its next snapshots are
the chain's next ones). Its cost grows with preemptions, not with cells or snapshots; a
tiled profile counts its cells instead of listing them.

Cost is billed node time (waiting for a node is not billed) over the uninterrupted run's;
the price cancels out, so the ratio holds at any price. The snapshot interval that
minimises the expected cost is Young's ``sqrt(2 C M)`` with Daly's correction, for
snapshot cost ``C`` and mean time between preemptions ``M``; ``best_interval`` checks it
against the simulation. A notice is not modelled (every preemption is taken as a kill),
which overstates the loss for providers that give one.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import random
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import UsageError
from .._models import BACKGROUND_PAUSE_ESTIMATE, SnapshotPolicy
from .._models import young_daly as young_daly  # the interval, defined with the policy
from .._status import describe
from ..store.runstore import RunStore

HOUR = 3600.0
# bounds on what simulate is asked: past them it would run for hours or without end
MAX_TRIALS = 100_000
MAX_DURATION = 365 * 86400  # a year of node time
MAX_HAZARD = 3600.0  # one preemption a second


@dataclass(frozen=True)
class Profile:
    """A run's costs as measured: seconds of compute per cell, per snapshot, and to start
    a new attempt (kernel start) and restore its state."""

    cells: tuple[float, ...]
    snapshot_seconds: float
    start_seconds: float  # process start to the first cell (the kernel's start included)
    restore_seconds: float
    source: str = ""
    kernel_seconds: float = 0.0  # of start_seconds, the kernel's start
    finish_seconds: float = 0.0  # last cell to the process's end (saving, shutting down)
    # the auto policy's first snapshot of a run waits for this much compute (its cost is
    # estimated from the state's size until one is measured)
    first_snapshot_after: float | None = None
    # background snapshots: after the pause (snapshot_seconds) the copy writes this long
    # while the cells go on; it is lost if a preemption comes first
    write_seconds: float = 0.0
    # False: the run took no snapshot, and snapshot_seconds is auto's own first estimate
    snapshot_measured: bool = True
    # a tiled run: the cells after the first run this many times
    repeat: int = 1
    # a run whose cells ran resumable loops (checkpoints inside cells): ``cells`` has each
    # such cell cut at its iterations, and this is the same run with its cells whole (as
    # resumed between cells only); None where no cell ran one
    whole: tuple[float, ...] | None = None

    @property
    def count(self) -> int:
        """How many cells the run has (a tiled one: the first, then the rest ``repeat``
        times)."""
        return 1 + (len(self.cells) - 1) * self.repeat if self.cells else 0

    @property
    def compute(self) -> float:
        if not self.cells:
            return 0.0
        return self.cells[0] + sum(self.cells[1:]) * self.repeat

    def tiled(self, duration: float) -> Profile:
        """The same cells repeated (the first cell once: set-up) until the compute
        reaches ``duration`` seconds. The cells are counted, not listed: a day of
        millisecond cells is tens of millions of them."""
        body = sum(self.cells[1:])
        if duration <= self.compute or len(self.cells) < 2 or body <= 0:
            return self
        repeat = max(math.ceil((duration - self.cells[0]) / body), 1)
        return dataclasses.replace(
            self, repeat=repeat, source=f"{self.source}, tiled to {duration / HOUR:g} h"
        )


def snapshot_costs(doc: dict[str, Any]) -> tuple[float, float, float | None] | None:
    """A snapshot manifest's measured costs: the kernel's writing, what the policy
    counted it as costing the notebook (older manifests: the pause, or the writing of a
    synchronous one), and for a background one the time until its blobs were in the
    store (None for a synchronous one); None where it measured nothing."""
    if doc.get("kernel_seconds") is None:
        return None
    kernel = float(doc["kernel_seconds"])
    cost = float(doc.get("cost_seconds", doc.get("pause_seconds", kernel)))
    written = None
    if doc.get("pause_seconds") is not None:
        written = float(doc.get("written_seconds", kernel))
    return kernel, cost, written


def _loops(record: dict[str, Any]) -> list[tuple[int, float]]:
    """The resumable loops a cell ran (its record's ``loops``): (iterations, seconds)."""
    found = []
    for loop in record.get("loops") or ():
        if not isinstance(loop, dict):
            continue
        n, t = loop.get("iterations"), loop.get("seconds")
        if isinstance(n, int) and n > 1 and isinstance(t, int | float) and math.isfinite(t):
            found.append((n, max(float(t), 0.0)))
    return found


def _cells(
    records: dict[int, dict[str, Any]], *, cut: bool, scale: float = 1.0
) -> tuple[float, ...]:
    """The cells' compute. ``cut``: a cell that ran resumable loops becomes the time
    around its loops, then one cell per iteration (a checkpoint may follow any of them);
    ``scale``: those loops run that many times as many iterations (a longer training)."""
    cells: list[float] = []
    for i in sorted(records):
        duration = float(records[i].get("duration") or 0.0)
        loops = _loops(records[i])
        inside = sum(t for _, t in loops)
        if not loops:
            cells.append(duration)
        elif not cut:
            cells.append(max(duration - inside, 0.0) + inside * scale)
        else:
            cells.append(max(duration - inside, 0.0))
            for n, t in loops:
                m = max(round(n * scale), 1)
                # iterations a checkpoint may follow; many short ones are grouped (at most
                # _MAX_STEPS a loop: a day of millisecond epochs is not listed one by one)
                group = math.ceil(m / _MAX_STEPS)
                full, rest = divmod(m, group)
                cells.extend([t / n * group] * full)
                if rest:
                    cells.append(t / n * rest)
    return tuple(cells)


_MAX_STEPS = 5000


def lengthened(store: RunStore, duration: float) -> Profile:
    """The profile of the run in ``store`` with its resumable loops run for more
    iterations until its compute reaches ``duration`` (a training cell of that length,
    not more cells), or tiled (:meth:`Profile.tiled`) where no cell ran one."""
    profile = profile_from_run(store)
    if profile.whole is None or duration <= profile.compute:
        return profile.tiled(duration)
    records = store.cell_records()
    inside = sum(t for r in records.values() for _, t in _loops(r))
    if inside <= 0:
        return profile.tiled(duration)
    scale = (duration - (sum(profile.whole) - inside)) / inside
    return dataclasses.replace(
        profile,
        cells=_cells(records, cut=True, scale=scale),
        whole=_cells(records, cut=False, scale=scale),
        source=f"{profile.source}, its loops run to {duration / HOUR:g} h",
    )


def profile_from_run(store: RunStore) -> Profile:
    """The profile of the run in ``store``: its cells' durations (a cell that ran a
    resumable loop cut at its iterations), its snapshots' mean cost (the kernel's side),
    and its attempts' kernel start and restore times."""
    records = store.cell_records()
    if not records:
        raise UsageError(
            f"the run in {store.url} has no finished cells to measure: simulate takes a run "
            "that has run (`spotbook run` or `spotbook resume` it first)"
        )
    cells = _cells(records, cut=True)
    whole = _cells(records, cut=False)
    costs = []  # what each snapshot stopped the notebook for
    writes = []  # what writing each took (the same for a synchronous one)
    background = []  # of those, written in the background while the cells went on
    for key in store.snapshot_keys().values():
        measured = snapshot_costs(store.read_snapshot(key) or {})
        if measured is not None:
            kernel, cost, written = measured
            writes.append(kernel)
            costs.append(cost)
            if written is not None:  # (an object store's upload included)
                background.append(written)
    attempts = describe(store)["attempts"]
    kernels = [float(a["kernel_start_seconds"]) for a in attempts if a.get("kernel_start_seconds")]
    restores = [float(a["restore_seconds"]) for a in attempts if a.get("restore_seconds")]
    # a run that took none (auto at a low hazard, or --snapshot off) says nothing of their
    # cost: auto's own first estimate stands in, and the profile says so
    snapshot = statistics.mean(costs) if costs else BACKGROUND_PAUSE_ESTIMATE
    # what the runner spends between cells (commit, and the snapshot when one is taken):
    # the kernel's part above is only a piece of it
    order = sorted(records.values(), key=lambda r: float(r.get("start") or 0.0))
    gaps = [
        float(b["start"]) - float(a["end"])
        for a, b in itertools.pairwise(order)
        if a.get("end") is not None and b.get("start") is not None and a["attempt"] == b["attempt"]
    ]
    keys = store.snapshot_keys()
    after_snapshot = [
        float(b["start"]) - float(a["end"])
        for a, b in itertools.pairwise(order)
        if a.get("end") is not None
        and b.get("start") is not None
        and a["attempt"] == b["attempt"]
        and a["index"] in keys
    ]
    if after_snapshot:  # the runner's whole cost of a snapshot (and the commit)
        snapshot = max(snapshot, statistics.mean(after_snapshot))
    elif costs and gaps:
        snapshot = max(snapshot, statistics.median(gaps))
    first_after = (
        sum(float(records[i].get("duration") or 0.0) for i in records if i <= min(keys))
        if keys
        else None
    )
    first = attempts[0] if attempts else {}
    began = float(first.get("process_started") or first.get("started") or 0.0)
    first_cell = min(float(r.get("start") or 0.0) for r in records.values())
    last_cell = max(float(r.get("end") or 0.0) for r in records.values())
    last = attempts[-1] if attempts else {}
    kernel = statistics.mean(kernels) if kernels else 1.0
    return Profile(
        cells=cells,
        snapshot_seconds=snapshot,
        start_seconds=max(first_cell - began, kernel) if began else kernel,
        # restore reads what a snapshot wrote: without a measured resume, take the same
        restore_seconds=(statistics.mean(restores) if restores else max([snapshot, *writes[-1:]])),
        source=store.url,
        kernel_seconds=kernel,
        finish_seconds=max(float(last.get("ended") or last_cell) - last_cell, 0.0),
        first_snapshot_after=first_after,
        write_seconds=statistics.mean(background) if background else 0.0,
        snapshot_measured=bool(costs),
        whole=whole if whole != cells else None,
    )


@dataclass
class Outcome:
    """One simulated run of one strategy."""

    billed: float = 0.0  # node time: compute, redone and lost compute, snapshots, starts
    finish: float = 0.0  # wall time, waiting for nodes included
    preemptions: int = 0
    lost: float = 0.0  # compute done and then lost to preemptions


class _Timeline:
    """A profile's cells as the compute done before each cell, ``at(m)`` (cells 0 to
    m - 1), worked out from one pass of the cells and the repeat count."""

    def __init__(self, profile: Profile) -> None:
        cells = profile.cells
        self.n = profile.count
        self.repeat = profile.repeat
        self.head = cells[0] if cells else 0.0
        self.inner = list(itertools.accumulate(cells[1:], initial=0.0))
        self.width = len(cells) - 1
        self.body = self.inner[-1]
        self.flat = list(itertools.accumulate(cells, initial=0.0)) if self.repeat == 1 else None
        self.total = self.at(self.n)

    def at(self, m: int) -> float:
        if self.flat is not None:
            return self.flat[m]
        if m <= 0:
            return 0.0
        q, r = divmod(m - 1, self.width)
        return self.head + q * self.body + self.inner[r]

    def first(self, x: float, lo: int, *, above: bool = False) -> int:
        """The first m >= lo with at(m) >= x (> x when ``above``); n + 1 when none."""
        find = bisect.bisect_right if above else bisect.bisect_left
        if self.flat is not None:
            return find(self.flat, x, lo, self.n + 1)
        # the block of the body it falls in, then the cell within it; the loops settle a
        # rounding difference against at() at a block's edge
        y = x - self.head
        q = min(max(int(y // self.body), 0), self.repeat - 1) if self.body > 0 else 0
        m = max(1 + q * self.width + find(self.inner, y - q * self.body), lo)
        m = min(m, self.n + 1)
        while m > lo and (self.at(m - 1) > x if above else self.at(m - 1) >= x):
            m -= 1
        while m <= self.n and not (self.at(m) > x if above else self.at(m) >= x):
            m += 1
        return m


@dataclass(frozen=True)
class _Chain:
    """Where the snapshots of a run that is never preempted fall: ``pos[k]`` is how many
    cells the k-th covers (``pos[0]`` = 0: none yet), ``done[k]`` their compute, and
    ``clock[k]`` its completion time, in node time, on one attempt's clock that never
    stopped (the compute, the snapshots, and the waits for the one before to be written).
    A resumed attempt starts from one of these points, so its next snapshots are the
    chain's next ones: a stretch between preemptions is one lookup, not one step per
    cell or per snapshot."""

    pos: list[int]
    done: list[float]
    clock: list[float]
    waited: list[float]  # the waits summed up to k (each before a snapshot, for the one before)

    @classmethod
    def of(
        cls, line: _Timeline, profile: Profile, interval: float | None, first: float | None
    ) -> _Chain:
        pos, done = [0], [0.0]
        due = first or interval
        while interval is not None and due is not None:
            # a snapshot follows cell m - 1 once the compute since the last reaches ``due``,
            # and never the last cell
            m = line.first(done[-1] + due, pos[-1] + 1)
            if m >= line.n:
                break
            pos.append(m)
            done.append(line.at(m))
            due = interval
        write, snap = profile.write_seconds, profile.snapshot_seconds
        waited = [0.0] * len(pos)
        for k in range(1, len(pos)):
            gap = done[k] - done[k - 1]
            waited[k] = waited[k - 1] + (max(write - gap, 0.0) if write > 0 else 0.0)
        clock = [done[k] + k * snap + waited[k] for k in range(len(pos))]
        return cls(pos, done, clock, waited)


@dataclass(frozen=True)
class Plan:
    """What one strategy's simulated runs share: the profile's timeline and the chains of
    snapshot points (from the first interval, and from the plain one once a snapshot was
    taken)."""

    profile: Profile
    line: _Timeline
    first: _Chain
    plain: _Chain

    @classmethod
    def of(
        cls, profile: Profile, interval: float | None, first_interval: float | None = None
    ) -> Plan:
        line = _Timeline(profile)
        first = _Chain.of(line, profile, interval, first_interval)
        plain = _Chain.of(line, profile, interval, None) if first_interval else first
        return cls(profile, line, first, plain)


def run_once(
    profile: Profile,
    strategy: str,
    *,
    interval: float | None,
    delay: float,
    times: Iterable[float],
    first_interval: float | None = None,
    plan: Plan | None = None,
) -> Outcome:
    """Simulate one run: ``times`` are the instants of preemptions in billed node time
    since the run began (attempt starts are exposed to them too).

    The run goes from preemption to preemption: where each lands (the start, a cell, the
    wait for a background write, a snapshot, saving the output) and what it loses follow
    from the chain of snapshot points (:class:`_Chain`) and the cells' cumulative compute,
    so its cost grows with preemptions, not with cells or snapshots."""
    resume = strategy == "resume"
    if plan is None:
        plan = Plan.of(profile, interval if resume else None, first_interval)
    if len(plan.first.pos) == 1:  # no snapshot is ever taken
        return _without_snapshots(plan, resume, delay, times)
    out = Outcome()
    upcoming = iter(times)
    at = next(upcoming, math.inf)  # the next preemption
    chain = plan.first
    saved = 0  # the chain point a new attempt restores (0: none, it starts over)
    taken = False  # a snapshot was taken (the first interval applies until then)
    finished = False  # every cell committed (resume): what is left is saving the output
    while True:
        if finished:  # a resume with nothing to run starts no kernel
            tail = max(profile.start_seconds - profile.kernel_seconds, 0.0)
            if out.billed + tail + profile.finish_seconds <= at:
                out.billed += tail + profile.finish_seconds
                break
        else:
            start = profile.start_seconds + (profile.restore_seconds if saved else 0.0)
            if out.billed + start <= at:
                out.billed += start
                if saved == 0 and taken:
                    chain = plan.plain
                cut = _attempt(plan, chain, saved, out, at)
                if cut is None:
                    break
                saved, took, at_end = cut
                taken = taken or took
                if at_end and resume:
                    finished = True
                elif at_end:  # without spotbook the run starts over
                    out.lost += plan.line.total
                    saved = 0
        out.billed = max(out.billed, at)
        out.preemptions += 1
        out.finish += delay
        at = next(upcoming, math.inf)
    out.finish += out.billed
    return out


def _without_snapshots(plan: Plan, resume: bool, delay: float, times: Iterable[float]) -> Outcome:
    """:func:`run_once` for a run that takes no snapshot (a restart, or a resume with
    snapshots off): every attempt starts from the first cell, so a preemption in the
    cells loses all the compute since the attempt's start. A restart that cannot finish
    between preemptions meets every one of them: this loop is kept lean."""
    profile = plan.profile
    out = Outcome()
    compute = plan.line.total
    start, finish = profile.start_seconds, profile.finish_seconds
    tail = max(profile.start_seconds - profile.kernel_seconds, 0.0) + finish
    billed = lost = 0.0
    preemptions = 0
    finished = False
    for at in times:
        if finished:  # every cell committed: a resume only saves the output
            if billed + tail <= at:
                break
        elif billed + start + compute + finish <= at:
            break
        elif billed + start <= at:  # cut in the cells, or saving the output
            if billed + start + compute <= at:
                if resume:
                    finished = True
                else:
                    lost += compute
            else:
                lost += at - billed - start
        billed = at if at > billed else billed
        preemptions += 1
    billed += tail if finished else start + compute + finish
    out.billed, out.lost, out.preemptions = billed, lost, preemptions
    out.finish = billed + preemptions * delay
    return out


def _attempt(
    plan: Plan, chain: _Chain, a: int, out: Outcome, at: float
) -> tuple[int, bool, bool] | None:
    """One attempt from chain point ``a`` (its start billed) until the preemption
    ``at``: None when the run ends first; else the chain point the next attempt
    restores, whether a snapshot was taken, and whether the cut came while saving the
    output. Bills the attempt's node time and counts what it lost."""
    profile, line = plan.profile, plan.line
    pos, done, clock, waited = chain.pos, chain.done, chain.clock, chain.waited
    last = len(pos) - 1
    background = profile.write_seconds > 0
    # the chain's clock shifted to this attempt's start (its first snapshot waits for none)
    shift = out.billed - done[a] - a * profile.snapshot_seconds
    shift -= waited[a + 1] if a < last else 0.0
    k = a  # the last snapshot that completes by ``at``
    if a < last:
        k = max(bisect.bisect_right(clock, at - shift, a + 1, last + 1) - 1, a)
    when = out.billed if k == a else shift + clock[k]  # when it completed
    # a background snapshot counts once written (the one before it was waited for)
    kept = k if k == a or not background or at >= when + profile.write_seconds else k - 1
    took = k > a
    end, upto = (pos[k + 1], done[k + 1]) if k < last else (line.n, line.total)
    ready = when + upto - done[k]  # the cells up to the next snapshot done
    if ready > at:  # cut in a cell
        cell = line.first(at - when + done[k], pos[k], above=True) - 1
        cell = min(max(cell, pos[k]), end - 1)
        begun = when + line.at(cell) - done[k]
        out.lost += line.at(cell) - done[kept] + max(at - begun, 0.0)
        out.billed = max(at, begun)
        return kept, took, False
    if k < last:  # cut waiting for the one before to be written, or in the snapshot
        wait = waited[k + 1] - waited[k] if k > a else 0.0
        into = at - ready if ready + wait > at else at - ready - wait
        out.lost += done[k + 1] - done[kept] + into
        out.billed = at
        return kept, took, False
    out.billed = ready
    if background and took:  # the end waits for the last one being written
        wait = max(when + profile.write_seconds - ready, 0.0)
        if ready + wait > at:
            out.lost += line.total - done[kept]
            out.billed = at
            return kept, took, False
        out.billed += wait
    if out.billed + profile.finish_seconds <= at:
        out.billed += profile.finish_seconds
        return None
    out.billed = at
    return kept, took, True


def _times(seed: int, trial: int, rate: float, horizon: float) -> Iterator[float]:
    """Preemption instants at ``rate``, drawn as the run needs them up to ``horizon``:
    a trial's own generator, so every strategy (and interval) meets the same times."""
    draw = random.Random(seed * 1_000_003 + trial).random
    log, mean, t = math.log, 1.0 / rate if rate > 0 else 0.0, 0.0
    while mean > 0:
        t -= log(1.0 - draw()) * mean  # an exponential gap (random.expovariate, inlined)
        if t > horizon:
            return
        yield t


@dataclass
class Estimate:
    """One strategy's simulated outcome: expected cost and finish time."""

    strategy: str
    interval: float | None
    cost_ratio: float  # expected billed time over the uninterrupted run's
    finish_ratio: float
    finish_seconds: float
    preemptions: float
    lost_seconds: float
    trials: int
    spread: dict[str, float] = field(default_factory=dict)  # 10th and 90th percentiles


def simulate(
    profile: Profile,
    strategy: str,
    *,
    hazard_per_hour: float = 1.0,
    delay: float = 60.0,
    interval: float | None = None,
    trials: int = 2000,
    seed: int = 0,
    trace: Sequence[float] | None = None,
    first_interval: float | None = None,
) -> Estimate:
    """The expected cost and finish of ``strategy`` over ``trials`` runs (one run when a
    ``trace`` of preemption times is given)."""
    base = profile.start_seconds + profile.compute
    rate = hazard_per_hour / HOUR
    plan = Plan.of(profile, interval if strategy == "resume" else None, first_interval)
    results = []
    for trial in range(1 if trace is not None else trials):
        times = trace if trace is not None else _times(seed, trial, rate, 50 * base + 10 * HOUR)
        results.append(
            run_once(profile, strategy, interval=interval, delay=delay, times=times, plan=plan)
        )
    billed = [r.billed for r in results]
    finish = [r.finish for r in results]
    q = statistics.quantiles(billed, n=10) if len(billed) >= 10 else [billed[0]] * 9
    return Estimate(
        strategy=strategy,
        interval=interval,
        cost_ratio=statistics.mean(billed) / base,
        finish_ratio=statistics.mean(finish) / base,
        finish_seconds=statistics.mean(finish),
        preemptions=statistics.mean(r.preemptions for r in results),
        lost_seconds=statistics.mean(r.lost for r in results),
        trials=len(results),
        spread={"p10": q[0] / base, "p90": q[-1] / base},
    )


def auto_interval(profile: Profile, hazard_per_hour: float = 1.0) -> float:
    """The interval spotbook's ``auto`` snapshot policy keeps to for this profile."""
    return SnapshotPolicy(hazard=hazard_per_hour or 1.0).gap(profile.snapshot_seconds)


def best_interval(
    profile: Profile,
    *,
    hazard_per_hour: float,
    delay: float,
    trials: int = 400,
    seed: int = 0,
) -> dict[str, Any]:
    """Young/Daly's interval beside the best of a grid of intervals around it, each
    simulated with the same preemption times."""
    mtbf = HOUR / hazard_per_hour
    predicted = young_daly(profile.snapshot_seconds, mtbf)
    grid = sorted({predicted * f for f in (0.125, 0.25, 0.5, 0.75, 1, 1.5, 2, 4, 8)})
    costs = {
        t: simulate(
            profile,
            "resume",
            hazard_per_hour=hazard_per_hour,
            delay=delay,
            interval=t,
            trials=trials,
            seed=seed,
        ).cost_ratio
        for t in grid
    }
    best = min(costs, key=lambda t: costs[t])
    return {
        "young_daly_seconds": predicted,
        "best_simulated_seconds": best,
        "cost_at_young_daly": costs[predicted],
        "cost_at_best": costs[best],
        "grid": {round(t, 3): round(c, 5) for t, c in costs.items()},
    }


@dataclass
class Simulation:
    """``spotbook simulate``'s result: a run's profile under one hazard, each strategy's
    estimate, and Young/Daly's interval checked against the simulation."""

    profile: Profile
    hazard_per_hour: float
    delay: float
    estimates: list[tuple[str, Estimate]]  # by the strategy's name, in the table's order
    interval_check: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        p = self.profile
        return {
            "profile": {
                "source": p.source,
                "cells": p.count,
                "compute_hours": round(p.compute / HOUR, 4),
                "snapshot_seconds": round(p.snapshot_seconds, 4),
                "snapshot_measured": p.snapshot_measured,
                "start_seconds": round(p.start_seconds, 3),
                "restore_seconds": round(p.restore_seconds, 3),
            },
            "hazard_per_hour": self.hazard_per_hour,
            "delay_seconds": self.delay,
            "strategies": {
                name: {
                    "interval_seconds": None if e.interval is None else round(e.interval, 3),
                    "cost_ratio": round(e.cost_ratio, 4),
                    "finish_hours": round(e.finish_seconds / HOUR, 4),
                    "finish_ratio": round(e.finish_ratio, 4),
                    "preemptions": round(e.preemptions, 3),
                    "cost_ratio_p10_p90": [round(e.spread["p10"], 4), round(e.spread["p90"], 4)],
                    "trials": e.trials,
                }
                for name, e in self.estimates
            },
            "snapshot_interval": self.interval_check,
        }


def simulate_run(
    store: RunStore,
    *,
    hazard_per_hour: float,
    delay: float,
    trials: int,
    seed: int = 0,
    interval: float | None = None,
    trace: Sequence[float] | None = None,
    duration: float | None = None,
) -> Simulation:
    """``spotbook simulate``: each strategy on the profile of the run in ``store`` (its
    cells' compute and its measured snapshot, start and restore times), tiled to
    ``duration`` seconds of compute if given. The numbers are checked before the run is
    read (UsageError, exit 2): a NaN compares false with every limit, so a plain range
    check would let it through."""
    if not (math.isfinite(delay) and delay >= 0):
        raise UsageError(f"--delay must be a finite number of seconds, zero or more, not {delay}")
    if interval is not None and not (math.isfinite(interval) and interval > 0):
        raise UsageError(f"--interval must be a positive, finite number of seconds, not {interval}")
    if not 1 <= trials <= MAX_TRIALS:
        raise UsageError(f"--trials must be 1 to {MAX_TRIALS}, not {trials}")
    if duration is not None and not (math.isfinite(duration) and 0 < duration <= MAX_DURATION):
        raise UsageError(f"--duration {duration:g} s: at most a year (365d)")
    if not (math.isfinite(hazard_per_hour) and 0 <= hazard_per_hour <= MAX_HAZARD):
        raise UsageError(
            f"--hazard {hazard_per_hour:g}/h: at most {MAX_HAZARD:g} preemptions an hour"
        )
    profile = profile_from_run(store) if duration is None else lengthened(store, duration)
    # resume under the auto policy and at Young/Daly's interval (and at ``interval``, if
    # given), and restart from scratch; where the run's cells ran resumable loops, also
    # as resumed between cells only (a kill inside a cell losing the whole cell)
    mtbf = HOUR / hazard_per_hour if hazard_per_hour else float("inf")
    optimal = young_daly(profile.snapshot_seconds, mtbf) if hazard_per_hour else None
    rows: list[tuple[str, str, float | None, Profile]] = [
        ("resume, auto policy", "resume", auto_interval(profile, hazard_per_hour), profile),
        ("resume, Young/Daly interval", "resume", optimal, profile),
        ("restart from scratch", "restart", None, profile),
    ]
    if interval is not None:
        rows.insert(2, (f"resume, every {interval:g} s", "resume", interval, profile))
    if profile.whole is not None:
        between = dataclasses.replace(profile, cells=profile.whole, whole=None)
        rows.insert(
            -1,
            (
                "resume, between cells only",
                "resume",
                auto_interval(between, hazard_per_hour),
                between,
            ),
        )
    first = {"resume, auto policy": profile.first_snapshot_after}
    estimates = [
        (
            name,
            simulate(
                used,
                strategy,
                interval=every,
                first_interval=first.get(name),
                hazard_per_hour=hazard_per_hour,
                delay=delay,
                trials=trials,
                seed=seed,
                trace=trace,
            ),
        )
        for name, strategy, every, used in rows
        if strategy == "restart" or every is not None
    ]
    check = (
        best_interval(
            profile,
            hazard_per_hour=hazard_per_hour,
            delay=delay,
            trials=max(trials // 5, 50),
            seed=seed,
        )
        if hazard_per_hour
        else None
    )
    return Simulation(profile, hazard_per_hour, delay, estimates, check)
