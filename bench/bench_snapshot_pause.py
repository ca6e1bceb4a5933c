"""How long a snapshot stops the notebook: background (a fork of the kernel writes it)
against synchronous (``--no-snapshot-background``), at several sizes of state, in one run.

    .venv/bin/python bench/bench_snapshot_pause.py [--sizes 0.1,1,4] [--dir DIR]

The notebook builds N GB of numpy arrays, then runs 3 cells that each change every array
a little (so every snapshot writes all of it) and sleep long enough for a background
snapshot to be written (4 s per GiB); ``--snapshot every-cell``. Each snapshot's own
writing time (``kernel_seconds`` of its manifest) is reported beside.
The pause after a cell is the time from its record's end to the next cell's start (what
the runner spent between them, snapshot included), read from the run store's records.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import record_pauses, write_notebook

from spotbook.store.runstore import RunStore


def cells(gib: float) -> list[str]:
    parts = max(1, int(gib * 8))
    n = int(gib * (1 << 30) / 8 / parts)
    build = (
        "import numpy as np, time\nrng = np.random.default_rng(0)\n"
        f"arrays = [rng.random({n}) for _ in range({parts})]"
    )
    # each step outlasts the writing of a snapshot (about 1 s per GiB here), so what is
    # measured is the pause itself, not a wait for the one before
    step = f"for a in arrays:\n    a[:512] += 1.0\ntime.sleep({max(0.5, 4.0 * gib):.1f})"
    return [build, step, step, step, "print(sum(float(a[0]) for a in arrays))"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="0.1,1,4", help="GiB of state, comma-separated")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-pause-", dir=args.dir))
    rows = []
    try:
        for gib in (float(x) for x in args.sizes.split(",")):
            nb = write_notebook(work / "p.ipynb", cells(gib))
            got = {}
            for mode, flags in (
                ("background", []),
                ("synchronous", ["--no-snapshot-background"]),
            ):
                rd = work / f"rd-{mode}"
                subprocess.run(
                    [sys.executable, "-m", "spotbook", "run", str(nb), "--run-dir", str(rd),
                     "--snapshot", "every-cell", "--no-progress-bar", *flags],
                    cwd=work, check=True, capture_output=True,
                )  # fmt: skip
                store = RunStore(str(rd))
                (attempt,) = store.attempts()
                writes = [
                    float((store.read_snapshot(k) or {}).get("kernel_seconds") or 0.0)
                    for k in store.snapshot_keys().values()
                ]
                got[mode] = (record_pauses(store), attempt, writes)
                shutil.rmtree(rd)
            bg, sync = got["background"], got["synchronous"]
            rows.append((gib, bg, sync))
            print(
                f"{gib:5.1f} GiB: background pause median {statistics.median(bg[0]) * 1e3:7.1f} ms "
                f"max {max(bg[0]) * 1e3:7.1f} ms (in the kernel: fork "
                f"{bg[1].get('snapshot_pause_max', 0) * 1e3:.1f} ms max); synchronous median "
                f"{statistics.median(sync[0]) * 1e3:8.1f} ms; ratio "
                f"{statistics.median(bg[0]) / statistics.median(sync[0]):.3f}; writing "
                f"{statistics.median(bg[2]):.2f} s in the background, "
                f"{statistics.median(sync[2]):.2f} s synchronously",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            [
                {
                    "gib": g,
                    "background_ms": [round(x * 1e3, 1) for x in b[0]],
                    "sync_ms": [round(x * 1e3, 1) for x in s[0]],
                }
                for g, b, s in rows
            ]
        )
    )


if __name__ == "__main__":
    main()
