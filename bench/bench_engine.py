"""papermill's command line with its own engine against ``--engine spotbook``, on the
same notebooks, in one run.

Each runs as its own process, REPEAT times, taking turns; the table shows the median
wall time, the ratio of spotbook's engine to papermill's own (saving OUTPUT after every
cell, papermill's default, and without), and the tool process's peak RSS.

    .venv/bin/python bench/bench_engine.py [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import median, timed, write_notebook

CASES = {
    "1 cell": ["x = 1"],
    "100 cells": [f"x = {i}" for i in range(100)],
    "1000 cells": [f"x = {i}" for i in range(1000)],
}


def tools(nb: Path, out: Path, work: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    base = ["papermill", str(nb), str(out), "-k", "python3", "--no-progress-bar"]
    return {
        "papermill": (base, {}),
        "papermill --no-save": ([*base, "--no-request-save-on-cell-execute"], {}),
        "papermill --engine spotbook": (
            [*base, "--engine", "spotbook"],
            {"SPOTBOOK_ENGINE_RUN_DIR": str(work / "store")},
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="skip the 1000-cell case")
    args = ap.parse_args()
    rows = []
    for case, sources in CASES.items():
        if args.quick and "1000" in case:
            continue
        work = Path(tempfile.mkdtemp(prefix="bench-"))
        nb = write_notebook(work / "in.ipynb", sources)
        runs = tools(nb, work / "out.ipynb", work)
        walls: dict[str, list[float]] = {name: [] for name in runs}
        rsss: dict[str, list[int]] = {name: [] for name in runs}
        for _ in range(args.repeat):  # taking turns: a drift in speed hits all alike
            for name, (argv, env) in runs.items():
                shutil.rmtree(work / "store", ignore_errors=True)
                wall, rss = timed(argv, cwd=work, env=env)
                walls[name].append(wall)
                rsss[name].append(rss)
        own, nosave = median(walls["papermill"]), median(walls["papermill --no-save"])
        for name in runs:
            wall = median(walls[name])
            rows.append((case, name, wall, wall / own, wall / nosave, max(rsss[name]) / 1024))
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{'case':<11} {'tool':<28} {'wall s':>7} {'/papermill':>10} {'/pm-nosave':>10} "
        f"{'peak RSS MiB':>12}"
    )
    for case, name, wall, r1, r2, rss in rows:
        print(f"{case:<11} {name:<28} {wall:>7.2f} {r1:>10.2f} {r2:>10.2f} {rss:>12.1f}")


if __name__ == "__main__":
    main()
