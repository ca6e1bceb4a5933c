"""How long ``spotbook simulate`` takes on a long job: this checkout against an older
spotbook, on the same measured run, in one run.

A 300-cell notebook (each cell a few milliseconds of work) runs once with a snapshot
after every cell; its run store is the profile. ``spotbook simulate --from`` that run,
tiled to a long job with one preemption an hour, is timed as a user runs it (its own
process, the whole command: the three strategies and the interval check):

1. the issue's case, small enough for the old simulator (default ``--duration 1h
   --trials 20``), by both, taking turns; the ratio;
2. a day-long job, ``--duration 24h --trials 2000``, by this checkout (the old one would
   take hours: its cost grows with cells × trials).

    .venv/bin/python bench/bench_simulate.py [--repeat N] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import baseline_src, median, write_notebook

CELLS = ["import math"] + [
    f"x{i} = sum(math.sqrt(k) for k in range({2000 + 40 * (i % 25)}))" for i in range(299)
]


def simulate(store: Path, src: Path | None, *args: str) -> tuple[float, dict]:
    """Seconds the whole command took, and its JSON."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    started = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "spotbook", "simulate", "--from", str(store), *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - started, json.loads(r.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", default="2b35746", help="git revision to compare with")
    parser.add_argument("--small", default="1h", help="the duration both simulators run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        nb = write_notebook(work / "cells300.ipynb", CELLS)
        store = work / "measured"
        quiet = ("--snapshot", "every-cell", "--no-progress-bar", "--log-level", "WARNING")
        subprocess.run(
            [sys.executable, "-m", "spotbook", "run", str(nb), "--run-dir", str(store), *quiet],
            check=True,
            capture_output=True,
        )
        old = baseline_src(args.baseline, work)
        small = ["--duration", args.small, "--hazard", "1/h", "--trials", "20"]
        times: dict[str, list[float]] = {"baseline": [], "now": []}
        docs = {}
        for _ in range(args.repeat):
            seconds, docs["baseline"] = simulate(store, old, *small)
            times["baseline"].append(seconds)
            seconds, docs["now"] = simulate(store, None, *small)
            times["now"].append(seconds)
        b, n = median(times["baseline"]), median(times["now"])
        cells = docs["now"]["profile"]["cells"]
        print(f"1. simulate {' '.join(small)} ({cells} simulated cells), median of {args.repeat}:")
        print(f"   {args.baseline}: {b:.2f} s, this checkout: {n:.2f} s, ratio {n / b:.4f}")
        for name in docs["now"]["strategies"]:
            was = docs["baseline"]["strategies"][name]["cost_ratio"]
            now = docs["now"]["strategies"][name]["cost_ratio"]
            print(f"   {name}: cost ratio {was} before, {now} now")
        big = ["--duration", "24h", "--hazard", "1/h", "--trials", "2000"]
        runs = [simulate(store, None, *big) for _ in range(args.repeat)]
        seconds = median([s for s, _ in runs])
        doc = runs[0][1]
        print(
            f"2. simulate {' '.join(big)} ({doc['profile']['cells']} simulated cells), this "
            f"checkout, median of {args.repeat}: {seconds:.2f} s"
        )
        for name, row in doc["strategies"].items():
            print(f"   {name}: cost ratio {row['cost_ratio']}, {row['preemptions']} preemptions")


if __name__ == "__main__":
    main()
