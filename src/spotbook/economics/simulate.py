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

Cost is billed node time (waiting for a node is not billed) over the uninterrupted run's;
the price cancels out, so the ratio holds at any price. The snapshot interval that
minimises the expected cost is Young's ``sqrt(2 C M)`` with Daly's correction, for
snapshot cost ``C`` and mean time between preemptions ``M``; ``best_interval`` checks it
against the simulation. A notice is not modelled (every preemption is taken as a kill),
which overstates the loss for providers that give one.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import UsageError
from .._models import BACKGROUND_PAUSE_ESTIMATE, SnapshotPolicy
from .._models import young_daly as young_daly  # the interval, defined with the policy
from .._status import describe
from ..store.runstore import RunStore

HOUR = 3600.0


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

    @property
    def compute(self) -> float:
        return sum(self.cells)

    def tiled(self, duration: float) -> Profile:
        """The same cells repeated (the first cell once: set-up) until the compute
        reaches ``duration`` seconds."""
        if duration <= self.compute or len(self.cells) < 2:
            return self
        head, body = self.cells[:1], self.cells[1:]
        cells = list(head)
        while sum(cells) < duration:
            cells.extend(body)
        return dataclasses.replace(
            self, cells=tuple(cells), source=f"{self.source}, tiled to {duration / HOUR:g} h"
        )


def profile_from_run(store: RunStore) -> Profile:
    """The profile of the run in ``store``: its cells' durations, its snapshots' mean
    cost (the kernel's side), and its attempts' kernel start and restore times."""
    records = store.cell_records()
    if not records:
        raise UsageError(
            f"the run in {store.url} has no finished cells to measure: simulate takes a run "
            "that has run (`spotbook run` or `spotbook resume` it first)"
        )
    cells = tuple(float(records[i].get("duration") or 0.0) for i in sorted(records))
    costs = []  # what each snapshot stopped the notebook for
    writes = []  # what writing each took (the same for a synchronous one)
    background = []  # of those, written in the background while the cells went on
    for key in store.snapshot_keys().values():
        doc = store.read_snapshot(key) or {}
        if doc.get("kernel_seconds") is not None:
            writes.append(float(doc["kernel_seconds"]))
            # what the policy counted it as costing (older manifests: the pause, or the
            # writing of a synchronous one)
            costs.append(
                float(doc.get("cost_seconds", doc.get("pause_seconds", doc["kernel_seconds"])))
            )
            if doc.get("pause_seconds") is not None:
                # until its blobs were in the store (an object store's upload included)
                background.append(float(doc.get("written_seconds", doc["kernel_seconds"])))
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
    )


@dataclass
class Outcome:
    """One simulated run of one strategy."""

    billed: float = 0.0  # node time: compute, redone and lost compute, snapshots, starts
    finish: float = 0.0  # wall time, waiting for nodes included
    preemptions: int = 0
    lost: float = 0.0  # compute done and then lost to preemptions


def run_once(
    profile: Profile,
    strategy: str,
    *,
    interval: float | None,
    delay: float,
    times: Sequence[float],
    first_interval: float | None = None,
) -> Outcome:
    """Simulate one run: ``times`` are the instants of preemptions in billed node time
    since the run began (attempt starts are exposed to them too)."""
    out = Outcome()
    pending = list(times)

    def spend(cost: float) -> float | None:
        """Bill ``cost``; None if it completed, else the part done before a preemption."""
        if pending and out.billed + cost > pending[0]:
            at = pending.pop(0)
            part = max(at - out.billed, 0.0)
            out.billed = max(at, out.billed)
            return part
        out.billed += cost
        return None

    cells = profile.cells
    snapshots = strategy == "resume" and interval is not None
    saved = 0  # cells a new attempt gets back (restored from the last snapshot)
    taken = 0  # snapshots so far: before the first, ``first_interval`` applies
    finished = False  # every cell committed (resume): what is left is saving the output
    while True:
        if finished:  # a resume with nothing to run starts no kernel
            tail = max(profile.start_seconds - profile.kernel_seconds, 0.0)
            if spend(tail + profile.finish_seconds) is None:
                break
            out.preemptions += 1
            out.finish += delay
            continue
        start = profile.start_seconds + (profile.restore_seconds if saved else 0.0)
        if spend(start) is not None:
            out.preemptions += 1
            out.finish += delay
            continue
        # since: compute since the last committed snapshot (a preemption loses it);
        # fresh: since the last one taken (the policy's clock)
        i, since, fresh, cut = saved, 0.0, 0.0, False
        pend: tuple[int, float, float] | None = None  # a background one: saves, commits at, covers

        def landed() -> None:
            nonlocal saved, since, pend
            if pend is not None and out.billed >= pend[1]:  # it committed before now
                saved, since, pend = pend[0], since - pend[2], None

        while i < len(cells):
            part = spend(cells[i])
            landed()
            due = (first_interval if taken == 0 and first_interval else interval) or 0.0
            if part is None and snapshots and i + 1 < len(cells) and fresh + cells[i] >= due:
                cut_short = None
                if pend is not None:  # one at a time: the cells wait for the one being written
                    cut_short = spend(max(pend[1] - out.billed, 0.0))
                    landed()
                if cut_short is None:
                    cut_short = spend(profile.snapshot_seconds)
                if cut_short is not None:  # the snapshot did not finish: the cell's work is lost
                    part = cells[i] + cut_short
                elif profile.write_seconds > 0:
                    since += cells[i]
                    pend = (i + 1, out.billed + profile.write_seconds, since)
                    fresh, i, taken = 0.0, i + 1, taken + 1
                    continue
                else:
                    saved, since, fresh, i, taken = i + 1, 0.0, 0.0, i + 1, taken + 1
                    continue
            if part is not None:
                out.lost += since + part
                cut = True
                break
            since += cells[i]
            fresh += cells[i]
            i += 1
        # the end waits for the last one being written
        if not cut and pend is not None and spend(max(pend[1] - out.billed, 0.0)) is not None:
            out.lost += since
            cut = True
        if not cut:
            if spend(profile.finish_seconds) is None:
                break
            # stopped while saving the output: spotbook has every cell committed; without
            # it the run starts over
            if strategy == "resume":
                finished = True
            else:
                out.lost += since
                saved = 0
        out.preemptions += 1
        out.finish += delay
    out.finish += out.billed
    return out


def _times(rng: random.Random, rate: float, horizon: float) -> list[float]:
    out, t = [], 0.0
    while rate > 0:
        t += rng.expovariate(rate)
        if t > horizon:
            break
        out.append(t)
    return out


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
    rng = random.Random(seed)
    rate = hazard_per_hour / HOUR
    results = []
    for _ in range(1 if trace is not None else trials):
        times = list(trace) if trace is not None else _times(rng, rate, 50 * base + 10 * HOUR)
        results.append(
            run_once(
                profile,
                strategy,
                interval=interval,
                delay=delay,
                times=times,
                first_interval=first_interval,
            )
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
