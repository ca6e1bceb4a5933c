"""Spot economics: a 3-hour job with one preemption per hour, simulated from a measured
run's profile, and a short real run preempted on purpose against the simulator.

1. A training-like notebook (cells of compute over a few MB of state) runs once with
   spotbook, a snapshot after every cell; its profile (cell durations, snapshot cost,
   kernel start, restore) is read from its run store.
2. ``spotbook simulate`` tiles the profile to 3 hours and simulates one preemption per
   node-hour (exponential), 60 s to a new node: the cost ratio (billed node time over an
   uninterrupted run's) for spotbook's resume (its auto snapshot policy, and Young/Daly's
   interval) and for restarting from scratch. Goal: spotbook <= 1.15x.
3. ``spotbook chaos`` runs the notebook with SIGKILLs at fixed node times, resuming and
   restarting, and prints the measured cost ratios beside the simulator's for the same
   times (stated tolerance: 20 %).

    .venv/bin/python bench/bench_spot_economics.py [--trials 2000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import write_notebook

TOLERANCE = 0.2
SETUP = "import numpy as np, time\nrng = np.random.default_rng(0)\n"
SETUP += "w = rng.standard_normal((2500, 2500))  # 50 MB of state"
STEP = "time.sleep(0.4)\nw = w * 0.999 + 0.001 * rng.standard_normal(w.shape)\n"
STEP += "loss = float((w**2).mean())"
CELLS = [SETUP, *[STEP] * 24]


def spotbook(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "spotbook", *args], cwd=cwd, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"spotbook {args} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-economics-"))
    try:
        write_notebook(work / "train.ipynb", CELLS)
        # every cell snapshotted: the profile measures what a snapshot costs (auto at one
        # preemption an hour would take none in this short run)
        spotbook(
            "run", "train.ipynb", "--run-dir", "measured", "--snapshot", "every-cell",
            "--no-progress-bar", cwd=work,
        )  # fmt: skip
        sim = json.loads(
            spotbook(
                "simulate", "--from", "measured", "--duration", "3h", "--hazard", "1/h",
                "--delay", "60", "--trials", str(args.trials), "--json", cwd=work,
            )
        )  # fmt: skip
        p = sim["profile"]
        print(
            f"profile: {p['cells']} cells after tiling, {p['compute_hours']} h of compute; "
            f"snapshot {p['snapshot_seconds']} s, start {p['start_seconds']} s, restore "
            f"{p['restore_seconds']} s"
        )
        print("3-hour job, 1 preemption per node-hour, 60 s to a new node:")
        print("| strategy | snapshot interval s | cost ratio | p10-p90 | finish h | preemptions |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, row in sim["strategies"].items():
            iv = "-" if row["interval_seconds"] is None else f"{row['interval_seconds']:.1f}"
            lo, hi = row["cost_ratio_p10_p90"]
            print(
                f"| {name} | {iv} | {row['cost_ratio']:.4f} | {lo:.3f}-{hi:.3f} | "
                f"{row['finish_hours']:.3f} | {row['preemptions']:.2f} |"
            )
        check = sim["snapshot_interval"]
        print(
            f"Young/Daly interval {check['young_daly_seconds']:.1f} s -> cost ratio "
            f"{check['cost_at_young_daly']:.4f}; best of the simulated grid "
            f"{check['best_simulated_seconds']:.1f} s -> {check['cost_at_best']:.4f}"
        )
        best = min(
            row["cost_ratio"] for n, row in sim["strategies"].items() if n.startswith("resume")
        )
        verdict = "met" if best <= 1.15 else "NOT met"
        print(f"goal: spotbook <= 1.15x uninterrupted: {best:.4f} -> {verdict}")
        (work / "trace.txt").write_text("4\n9\n15\n")
        chaos = json.loads(
            spotbook(
                "chaos", "train.ipynb", "--trace", "trace.txt", "--delay", "1", "--work", "ch",
                "--json", cwd=work,
            )
        )  # fmt: skip
        print(
            f"\nchaos: baseline {chaos['baseline_seconds']:.2f} s, SIGKILL at node time "
            f"{chaos['preemption_times']} s, 1 s to a new node"
        )
        print(
            "| strategy | billed s | finish s | preemptions | cost ratio | simulated"
            " | within 20 % |"
        )
        print("|---|---:|---:|---:|---:|---:|---|")
        for name, row in chaos["strategies"].items():
            sim_ratio = row["predicted_cost_ratio"]
            ok = abs(row["cost_ratio"] - sim_ratio) <= TOLERANCE * sim_ratio
            print(
                f"| {name} | {row['billed_seconds']:.2f} | {row['finish_seconds']:.2f} | "
                f"{row['preemptions']} | {row['cost_ratio']:.4f} | {sim_ratio:.4f} | "
                f"{'yes' if ok else 'no'} |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
