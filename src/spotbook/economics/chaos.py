"""Preempt a real notebook on purpose, again and again (``spotbook chaos``).

The notebook runs here as a user would run it, once uninterrupted (the baseline, and the
profile the simulator needs), then once per strategy with preemptions injected at the
times of a trace or drawn at a hazard rate (exponential, in node time): SIGTERM (a node's
notice: the running cell may finish within ``--grace`` and progress is saved) or SIGKILL
(no notice). After each preemption the run waits ``delay`` seconds, standing for the
wait for a new node, then starts again: ``resume`` (spotbook) or ``restart`` (the Job
controller alone: the run starts over, without snapshots). Billed time is the processes'
wall time (a node is paid while it runs the attempt, not while one is awaited).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import random
import signal as signals
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import UsageError
from .._models import Outcome
from .._status import describe
from ..store.runstore import RunStore
from .simulate import (
    HOUR,
    Estimate,
    Profile,
    auto_interval,
    profile_from_run,
    simulate,
    snapshot_costs,
)

log = logging.getLogger(__name__)
Say = Callable[[str], None]


@dataclass
class ChaosRun:
    """One strategy's run under injected preemptions: what it cost and how it ended."""

    strategy: str
    billed_seconds: float = 0.0
    finish_seconds: float = 0.0
    waiting_seconds: float = 0.0
    preemptions: int = 0
    attempts: int = 0
    exit_code: int = 0


@dataclass
class ChaosReport:
    """``spotbook chaos``'s result: the baseline, the preemptions, each strategy's run."""

    baseline_seconds: float
    profile: Profile
    times: list[float]  # the preemption instants, in node time
    delay: float
    signal: str
    runs: list[ChaosRun]
    predicted: dict[str, Estimate] = field(default_factory=dict)
    # the simulator's billed seconds for the same times, with the cheapest and the
    # dearest start, restore and finish this machine showed in any attempt: a machine
    # whose speed changes while the runs go (other work on it) moves the measured cost
    # inside this band, not away from the simulator
    band: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def failed(self) -> dict[str, int]:
        """The strategies whose run failed, and its exit code: their cost compares
        nothing (``spotbook chaos`` then exits 1)."""
        return {r.strategy: r.exit_code for r in self.runs if r.exit_code}

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline_seconds": round(self.baseline_seconds, 3),
            "preemption_times": [round(t, 3) for t in self.times],
            "delay": self.delay,
            "signal": self.signal,
            "profile": {
                "cells": self.profile.count,
                "compute_seconds": round(self.profile.compute, 3),
                "snapshot_seconds": round(self.profile.snapshot_seconds, 4),
                "start_seconds": round(self.profile.start_seconds, 3),
                "restore_seconds": round(self.profile.restore_seconds, 3),
            },
            "strategies": {
                r.strategy: {
                    "billed_seconds": round(r.billed_seconds, 3),
                    "finish_seconds": round(r.finish_seconds, 3),
                    "waiting_seconds": round(r.waiting_seconds, 3),
                    "preemptions": r.preemptions,
                    "attempts": r.attempts,
                    "exit_code": r.exit_code,
                    "cost_ratio": round(r.billed_seconds / self.baseline_seconds, 4),
                    "finish_ratio": round(r.finish_seconds / self.baseline_seconds, 4),
                    "predicted_cost_ratio": (
                        round(self.predicted[r.strategy].cost_ratio, 4)
                        if r.strategy in self.predicted
                        else None
                    ),
                    "predicted_billed_seconds": (
                        [round(x, 3) for x in self.band[r.strategy]]
                        if r.strategy in self.band
                        else None
                    ),
                }
                for r in self.runs
            },
        }


def _spotbook(*args: str) -> list[str]:
    return [sys.executable, "-m", "spotbook", *args]


def _params(parameters: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for k, v in parameters.items():
        out += ["-y", f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}"]
    return out


def chaos(
    notebook: str,
    work: str,
    *,
    parameters: Mapping[str, Any] | None = None,
    hazard_per_hour: float | None = None,
    trace: Sequence[float] | None = None,
    delay: float = 5.0,
    signal: str = "SIGKILL",
    grace: float | None = None,
    seed: int = 0,
    strategies: Sequence[str] = ("resume", "restart"),
    say: Say | None = None,
) -> ChaosReport:
    """Run ``notebook`` uninterrupted, then once per strategy under the same injected
    preemptions; the report has measured and simulated cost ratios side by side."""
    tell = say or log.info
    if (hazard_per_hour is None) == (trace is None):
        raise UsageError("chaos needs one of --hazard RATE or --trace FILE")
    if signal not in ("SIGTERM", "SIGKILL"):
        raise UsageError("--signal must be SIGTERM (a notice) or SIGKILL (none)")
    for s in strategies:
        if s not in ("resume", "restart"):
            raise UsageError(f"unknown strategy {s!r}: resume or restart")
    root = Path(work)
    root.mkdir(parents=True, exist_ok=True)
    # the runs' auto policy is told the hazard they will meet (a trace's: its preemptions
    # over the time they span), as a user sets --snapshot-hazard for a pool's record
    rate = trace_rate(trace) if trace is not None else float(hazard_per_hour or 1.0)
    extra = [*_params(parameters or {}), "--snapshot-hazard", f"{rate!r}/h"]
    tell("baseline: the notebook uninterrupted")
    t0 = time.monotonic()
    base_dir = str(root / "baseline")
    done = subprocess.run(
        _spotbook("run", notebook, "--run-dir", base_dir, "--no-progress-bar", *extra),
        capture_output=True,
        text=True,
        check=False,
    )
    baseline = time.monotonic() - t0
    if done.returncode != 0:
        raise UsageError(f"the notebook fails without preemptions:\n{done.stderr[-2000:]}")
    measured = profile_from_run(RunStore(base_dir))
    # the process's own end is after the attempt's record closed: what the wall clock
    # measured beyond the start and the cells (and snapshots) is the finish
    snapshots = len(RunStore(base_dir).snapshot_keys()) * measured.snapshot_seconds
    finish = baseline - measured.start_seconds - measured.compute - snapshots
    profile = dataclasses.replace(measured, finish_seconds=max(finish, 0.0))
    if trace is not None:
        times = sorted(float(t) for t in trace)
    else:
        rng = random.Random(seed)
        times, t = [], 0.0
        assert hazard_per_hour is not None
        while True:
            t += rng.expovariate(hazard_per_hour / HOUR)
            if t > 20 * baseline:
                break
            times.append(t)
    runs = []
    for strategy in strategies:
        tell(f"{strategy}: preemptions at node time {', '.join(f'{x:.1f}' for x in times)} s")
        runs.append(
            _run_strategy(
                strategy, notebook, root / strategy, extra, times, delay, signal, grace, tell
            )
        )
    # the start a fresh attempt costs, as this machine showed it in every attempt that
    # began without a restore (the baseline's is the first, often cold, start: one
    # sample of a cost that varies; the strategies' attempts meet the same machine)
    starts = [
        *_fresh_starts(RunStore(base_dir)),
        *(x for s in strategies for x in _fresh_starts(RunStore(str(root / s)))),
    ]
    if starts:
        profile = dataclasses.replace(profile, start_seconds=statistics.median(starts))
    predicted = {
        s: simulate(
            profile,
            s,
            interval=auto_interval(profile, rate) if s == "resume" else None,
            first_interval=profile.first_snapshot_after if s == "resume" else None,
            delay=delay,
            trace=times,
        )
        for s in strategies
    }
    stores = [RunStore(base_dir), *(RunStore(str(root / s)) for s in strategies)]
    seen = _observed(stores)  # read once, for every strategy's band
    band = {s: _band(profile, s, rate, delay, times, starts, seen) for s in strategies}
    return ChaosReport(baseline, profile, times, delay, signal, runs, predicted, band)


@dataclass
class _Seen:
    """What the runs' attempts showed of this machine: restore and finish times, each
    snapshot's pause and background write, and where each run's snapshots fell
    (interval, compute before the first)."""

    restores: list[float]
    finishes: list[float]
    taken: list[tuple[float, float]]
    pauses: list[float] = field(default_factory=list)
    writes: list[float] = field(default_factory=list)


def _observed(stores: list[RunStore]) -> _Seen:
    seen = _Seen([], [], [])
    for store in stores:
        if not store.exists("run.json"):
            continue
        attempts = describe(store)["attempts"]
        seen.restores += [float(a["restore_seconds"]) for a in attempts if a.get("restore_seconds")]
        ends = [float(r.get("end") or 0.0) for r in store.cell_records().values()]
        last = attempts[-1] if attempts else {}
        if ends and last.get("ended") and last.get("outcome") == Outcome.COMPLETED:
            seen.finishes.append(max(float(last["ended"]) - max(ends), 0.0))
        points = _snapshot_points(store)
        if points:
            seen.taken.append(points)
        for key in store.snapshot_keys().values():
            measured = snapshot_costs(store.read_snapshot(key) or {})
            if measured is not None:
                seen.pauses.append(measured[1])
                if measured[2] is not None:
                    seen.writes.append(measured[2])
    return seen


def _band(
    profile: Profile,
    strategy: str,
    rate: float,
    delay: float,
    times: list[float],
    starts: list[float],
    seen: _Seen,
) -> tuple[float, float]:
    """The simulator's billed seconds for ``strategy`` at the fastest and at the slowest
    start, restore, finish, snapshot pause and background write the runs met, with the
    snapshots where auto would place them for the profile and where each run's own auto
    placed them (it measured its snapshots' cost on a machine that may have been faster
    or slower than the baseline's). A loaded baseline's slow writes alone made every
    simulation lose a first attempt whose snapshot, written faster, was kept."""
    restores, finishes, taken = seen.restores, seen.finishes, seen.taken
    out = []
    for pick in (min, max):
        p = dataclasses.replace(
            profile,
            start_seconds=pick([profile.start_seconds, *starts]),
            restore_seconds=pick([profile.restore_seconds, *restores]),
            finish_seconds=pick([profile.finish_seconds, *finishes]),
            snapshot_seconds=pick([profile.snapshot_seconds, *seen.pauses]),
            write_seconds=pick([profile.write_seconds, *seen.writes]),
        )
        policies: list[tuple[float | None, float | None]] = [(None, None)]
        if strategy == "resume":
            policies = [(auto_interval(p, rate), p.first_snapshot_after), *taken]
        for interval, first in policies:
            est = simulate(
                p,
                strategy,
                interval=interval,
                first_interval=first,
                delay=delay,
                trace=times,
            )
            out.append(est.cost_ratio * (p.start_seconds + p.compute))
    return min(out), max(out)


def _snapshot_points(store: RunStore) -> tuple[float, float] | None:
    """The compute between a run's snapshots, as it took them: the interval (the median
    between two) and the compute before the first; None where it took none."""
    if not store.exists("run.json"):
        return None
    taken = sorted(store.snapshot_keys())
    if not taken:
        return None
    durations = {i: float(r.get("duration") or 0.0) for i, r in store.cell_records().items()}

    def upto(n: int) -> float:
        return sum(d for i, d in durations.items() if i <= n)

    first = upto(taken[0])
    gaps = [upto(b) - upto(a) for a, b in itertools.pairwise(taken)]
    return (statistics.median(gaps) if gaps else first), first


def _fresh_starts(store: RunStore) -> list[float]:
    """Each attempt's time from its process's start to its first cell, for the attempts
    that began without a restore and finished a cell."""
    if not store.exists("run.json"):
        return []
    first: dict[int, float] = {}
    for rec in store.cell_records().values():
        a, start = rec.get("attempt"), rec.get("start")
        if isinstance(a, int) and isinstance(start, int | float):
            first[a] = min(first.get(a, float(start)), float(start))
    out = []
    for a in describe(store)["attempts"]:
        began = a.get("process_started") or a.get("started")
        if a.get("restore_seconds") is None and a.get("attempt") in first and began:
            out.append(max(first[int(a["attempt"])] - float(began), 0.0))
    return out


def trace_rate(trace: Sequence[float]) -> float:
    """A trace's preemptions per node-hour: how many, over the node time they span."""
    times = [float(t) for t in trace if float(t) > 0]
    if not times:
        return 1.0
    return len(times) * HOUR / max(times)


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (its kernel starts a session of its
    own, so a process group would miss it), as a lost node would."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with (
                contextlib.suppress(OSError, IndexError, ValueError),
                open(f"/proc/{entry}/stat") as fh,
            ):
                parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
    tree, grew = {pid}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        grew = bool(more)
        tree |= more
    for p in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signals.SIGKILL)


def _run_strategy(
    strategy: str,
    notebook: str,
    where: Path,
    extra: list[str],
    times: list[float],
    delay: float,
    signal: str,
    grace: float | None,
    say: Say,
) -> ChaosRun:
    out = ChaosRun(strategy)
    pending = list(times)
    run_dir = str(where)
    snapshot = ["--snapshot", "off"] if strategy == "restart" else []
    grace_flag = ["--grace", str(grace)] if grace is not None else []
    first = True
    while True:
        # every attempt runs the one command, as a Job's pod does: `spotbook run` of the
        # same notebook continues the run in its store (and starts it, where the first
        # attempt was cut before it had written run.json: `spotbook resume` would have
        # found no run); without spotbook the run starts over
        argv = _spotbook("run", notebook, "--run-dir", run_dir, "--no-progress-bar")
        argv += [*extra, *snapshot, *grace_flag]
        if strategy == "restart" and not first:
            argv.append("--restart")
        first = False
        t0 = time.monotonic()
        with tempfile.TemporaryFile() as log_file:
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log_file)
            out.attempts += 1
            budget = pending[0] - out.billed_seconds if pending else None
            try:
                proc.wait(timeout=None if budget is None else max(budget, 0.0))
            except subprocess.TimeoutExpired:
                pending.pop(0)
                if signal == "SIGKILL":  # the node is gone: the kernel goes with the runner
                    _kill_tree(proc.pid)
                else:  # the notice goes to the runner, which stops its kernel
                    proc.send_signal(signals.SIGTERM)
                proc.wait()
                out.preemptions += 1
            wall = time.monotonic() - t0
            log_file.seek(0)
            err = log_file.read().decode(errors="replace")
        out.billed_seconds += wall
        out.finish_seconds += wall
        if proc.returncode == 0:
            out.exit_code = 0
            break
        if proc.returncode not in (75, -9, -15, 137, 143):
            out.exit_code = proc.returncode
            say(f"{strategy}: attempt {out.attempts} failed (exit {proc.returncode}): {err[-500:]}")
            break
        say(f"{strategy}: preempted ({signal}) after {wall:.1f} s; a new node in {delay:g} s")
        time.sleep(delay)  # stands for the wait for a replacement node
        out.waiting_seconds += delay
        out.finish_seconds += delay
    return out
