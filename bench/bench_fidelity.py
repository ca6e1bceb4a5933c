"""What resume fidelity costs: process-state capture per snapshot, and the per-cell
path against an older spotbook on the same notebooks, in one run.

1. Capture: a notebook that imports numpy, pandas and matplotlib, changes their options,
   seeds the generators and sets up logging, run with a snapshot after every cell; each
   snapshot manifest records how long capturing the process state took.
2. Per cell: bench_local.py's "1000 trivial cells" and "100 trivial cells" notebooks,
   run by this checkout and by ``--baseline REV`` (default: the commit before resume
   fidelity), taking turns; medians and the ratio.

    .venv/bin/python bench/bench_fidelity.py [--repeat N] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import baseline_src, median, write_notebook

CAPTURE_CELLS = [
    "import random, logging, warnings, decimal\nimport numpy as np\nimport pandas as pd\n"
    "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt",
    "random.seed(1); np.random.seed(2)\npd.set_option('display.max_rows', 5)\n"
    "np.set_printoptions(precision=3)\nwarnings.simplefilter('ignore')\n"
    "logging.basicConfig(level=logging.INFO)\nplt.rcParams['lines.linewidth'] = 2\n"
    "decimal.getcontext().prec = 6\ndf = pd.DataFrame({'a': range(1000)})",
    *[f"x{i} = float(np.random.rand()) + random.random()" for i in range(40)],
]


def spotbook_run(nb: Path, store: Path, *extra: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "spotbook",
            "run",
            str(nb),
            "--run-dir",
            str(store),
            *extra,
            "--no-progress-bar",
            "--log-level",
            "WARNING",
        ],
        check=True,
        env=env,
        capture_output=True,
    )


def capture_costs(work: Path) -> list[float]:
    nb = work / "capture.ipynb"
    write_notebook(nb, CAPTURE_CELLS)
    store = work / "capture-store"
    spotbook_run(nb, store, "--snapshot", "every-cell")
    snaps = store / "state" / "snap"
    return [
        json.loads((snaps / n).read_text())["capture_seconds"] for n in sorted(os.listdir(snaps))
    ]


def run_once(nb: Path, store: Path, src: Path | None) -> float:
    env = dict(os.environ)
    if src is not None:  # the kernel inherits it, so it imports the same spotbook
        env["PYTHONPATH"] = str(src)
    started = time.perf_counter()
    spotbook_run(nb, store, env=env)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", default="7af5f8d", help="git revision to compare with")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        costs = capture_costs(work)
        print(
            f"1. process-state capture per snapshot ({len(costs)} snapshots, numpy + pandas + "
            f"matplotlib + logging imported): median {statistics.median(costs) * 1e3:.3f} ms, "
            f"max {max(costs) * 1e3:.3f} ms"
        )
        old = baseline_src(args.baseline, work)
        print(f"2. per-cell path, this checkout vs {args.baseline} (median of {args.repeat}):")
        for cells in (100, 1000):
            nb = work / f"trivial{cells}.ipynb"
            write_notebook(nb, [f"x = {i}" for i in range(cells)])
            times: dict[str, list[float]] = {"baseline": [], "now": []}
            for r in range(args.repeat):
                times["baseline"].append(run_once(nb, work / f"b{cells}-{r}", old))
                times["now"].append(run_once(nb, work / f"n{cells}-{r}", None))
            b, n = median(times["baseline"]), median(times["now"])
            print(
                f"   {cells:>5} trivial cells: baseline {b:.2f} s, now {n:.2f} s, ratio {n / b:.3f}"
            )


if __name__ == "__main__":
    main()
