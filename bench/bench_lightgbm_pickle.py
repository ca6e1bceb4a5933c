"""What pickling a LightGBM booster costs a staged snapshot's pause, in one run.

A staged snapshot pickles the notebook's small objects at the cell boundary; a booster is
pickled by LightGBM's own ``__getstate__``, which writes its model as text
(``model_to_string``, the trees written in parallel on LightGBM's OpenMP threads). Between
two snapshots the notebook runs a cell, so those threads have gone idle. This bench times
the same call on the booster ``bench_snapshot_pause.py``'s LightGBM notebook trains: back
to back (the threads still awake), after an idle gap like a cell's, and after that gap
with the OpenMP runtime told to put idle threads to sleep at once (``OMP_WAIT_POLICY``,
the notebook's choice, not spotbook's: each case runs in a process of its own).

    .venv/bin/python bench/bench_lightgbm_pickle.py [--gap 0.3] [--reps 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROBE = """
import json, pickle, sys, time
import numpy as np, lightgbm as lgb
rng = np.random.default_rng(0)
X = rng.random((2000, 5)); y = X @ np.arange(5.0)
booster = lgb.train({'verbose': -1}, lgb.Dataset(X, y), num_boost_round=5)
gap, reps = float(sys.argv[1]), int(sys.argv[2])
times = []
for _ in range(reps):
    time.sleep(gap)
    t0 = time.perf_counter()
    pickle.dumps(booster)
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""


def probe(gap: float, reps: int, env: dict[str, str]) -> list[float]:
    """Seconds of each ``pickle.dumps(booster)`` after ``gap`` seconds idle."""
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(gap), str(reps)],
        capture_output=True, text=True, check=True, env={**os.environ, **env},
    )  # fmt: skip
    times: list[float] = json.loads(r.stdout)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gap", type=float, default=0.3, help="seconds idle before each pickle")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    idle = f"after {args.gap:g} s idle"
    cases = [
        ("back to back", 0.0, {}),
        (idle, args.gap, {}),
        (f"{idle}, OMP_WAIT_POLICY=passive", args.gap, {"OMP_WAIT_POLICY": "passive"}),
    ]
    print("pickle.dumps(booster), ms: median | each, in order")
    rows = {}
    for name, gap, env in cases:
        times = probe(gap, args.reps, env)
        rows[name] = statistics.median(times)
        each = " ".join(f"{t * 1e3:.2f}" for t in times)
        print(f"  {name:45} {rows[name] * 1e3:7.2f} | {each}", flush=True)
    print(f"idle / back to back: {rows[idle] / rows['back to back']:.1f}x")


if __name__ == "__main__":
    main()
