"""The run's files on a new node: what saving them with each snapshot costs a notebook
that writes GB of files, and how fast a new node gets them back, in one run.

    .venv/bin/python bench/bench_node_files.py [--gb 2] [--cells 20] [--compute 1.0]

The notebook writes ``--gb`` of files over ``--cells`` cells (each cell: a new file of
random bytes, then ``--compute`` seconds of work), ``--snapshot every-cell``. Run twice:
with the run's files captured (the default) and without (``--files-exclude '*'``: the
same scans, nothing saved). Printed: the wall time of each run and the overhead ratio,
the pause at each cell boundary (from the records: the next cell's start minus the cell's
end), and the restore on a wiped node (every file put back from the local store's blobs,
hash checked) against a plain parallel copy of the same blob files (8 threads, as the
restore uses).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import record_pauses, write_notebook

from spotbook.attempt.run_files import fetch_blob, restore
from spotbook.store.runstore import RunStore


def cells(gb: float, n: int, compute: float) -> list[str]:
    size = int(gb * 1e9 / n)
    first = "import os, time\nimport numpy as np\nrng = np.random.default_rng(0)"
    step = (
        "i = len([f for f in os.listdir('.') if f.startswith('part')])\n"
        f"with open(f'part{{i:03d}}.bin', 'wb') as fh:\n    fh.write(rng.bytes({size}))\n"
        f"time.sleep({compute})"
    )
    return [first, *[step] * n, "print(len(os.listdir('.')))"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--cells", type=int, default=20)
    ap.add_argument("--compute", type=float, default=1.0, help="seconds of work per cell")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    top = Path(tempfile.mkdtemp(prefix="bench-files-", dir=args.dir))
    got = {}
    try:
        for mode, flags in (("without", ["--files-exclude", "*"]), ("captured", [])):
            work = top / mode / "work"
            work.mkdir(parents=True)
            nb = write_notebook(top / mode / "f.ipynb", cells(args.gb, args.cells, args.compute))
            rd = top / mode / "rd"
            t0 = time.monotonic()
            subprocess.run(
                [sys.executable, "-m", "spotbook", "run", str(nb), "--run-dir", str(rd),
                 "--snapshot", "every-cell", "--no-progress-bar", "--cwd", str(work), *flags],
                cwd=work, check=True, capture_output=True,
            )  # fmt: skip
            wall = time.monotonic() - t0
            store = RunStore(str(rd))
            got[mode] = (wall, record_pauses(store), store, work, rd)
        w_wall, w_pauses = got["without"][:2]
        c_wall, c_pauses, store, work, rd = got["captured"]
        print(
            f"{args.gb:g} GB over {args.cells} cells of {args.compute:g} s: wall "
            f"{w_wall:.2f} s without capture, {c_wall:.2f} s with (ratio "
            f"{c_wall / w_wall:.3f}); pause per boundary median "
            f"{statistics.median(w_pauses) * 1e3:.1f} ms without, "
            f"{statistics.median(c_pauses) * 1e3:.1f} ms with (max {max(c_pauses) * 1e3:.1f})",
            flush=True,
        )
        # the newest snapshot's files, put back on a wiped node
        keys = store.snapshot_keys()
        doc = store.read_snapshot(keys[max(keys)]) or {}
        files = doc.get("files") or {}
        entries = files.get("entries") or {}
        size = sum(int(e.get("size") or 0) for e in entries.values())
        blobs = str(rd / "state" / "blobs")
        digests = [(e["sha256"], p) for p, e in entries.items() if e.get("kind") == "file"]
        runs = []
        for _ in range(3):
            shutil.rmtree(work)
            work.mkdir()
            subprocess.run(["sync"], check=False)
            t0 = time.monotonic()
            done = restore(files, fetch_blob(store))  # as the runner does
            spot = time.monotonic() - t0
            assert done.files == len(digests) and not done.failed, done
            shutil.rmtree(work)
            work.mkdir()
            t0 = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda d: shutil.copyfile(os.path.join(blobs, d[0]), d[1]), digests))
            plain = time.monotonic() - t0
            runs.append((spot, plain))
        spot = statistics.median(r[0] for r in runs)
        plain = statistics.median(r[1] for r in runs)
        print(
            f"restore of {len(digests)} files ({size / 1e9:.2f} GB) on a wiped node: "
            f"{spot:.2f} s (hash checked) against {plain:.2f} s for a plain parallel copy "
            f"(ratio {spot / plain:.2f}; median of 3)",
            flush=True,
        )
        print(
            json.dumps(
                {
                    "gb": args.gb,
                    "wall_without": round(w_wall, 3),
                    "wall_captured": round(c_wall, 3),
                    "pause_ms_captured": [round(p * 1e3, 1) for p in c_pauses],
                    "restore_s": round(spot, 3),
                    "plain_copy_s": round(plain, 3),
                }
            )
        )
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
