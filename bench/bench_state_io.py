"""State I/O: how fast spotbook saves and restores a namespace of numpy arrays, beside
raw ``pickle.dump``/``load`` (protocol 5) of the same objects, in one run.

    .venv/bin/python bench/bench_state_io.py [--gib 1] [--repeat 3] [--dir DIR]

"save" is ``dump_namespace`` into a fresh blob directory (hashing every buffer, writing
it to its own file); "restore" is ``load_namespace`` (reading every blob back, checking
its hash). The page cache is not dropped (no root needed): both tools read warm files.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from spotbook.kernel.pickling import Blobs, dump_namespace, load_namespace


def arrays(gib: float, parts: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    n = int(gib * (1 << 30) / 8 / parts)
    return {f"a{i}": rng.random(n) for i in range(parts)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    values = arrays(args.gib)
    size = sum(a.nbytes for a in values.values())
    root = Path(tempfile.mkdtemp(prefix="bench-io-", dir=args.dir))
    times: dict[str, list[float]] = {
        k: [] for k in ("pickle dump", "pickle load", "save", "restore")
    }
    try:
        for r in range(args.repeat):
            path = root / f"raw-{r}.pkl"
            t = time.perf_counter()
            with open(path, "wb") as fh:
                pickle.dump(values, fh, protocol=5)
            times["pickle dump"].append(time.perf_counter() - t)
            t = time.perf_counter()
            with open(path, "rb") as fh:
                back = pickle.load(fh)
            times["pickle load"].append(time.perf_counter() - t)
            assert all(np.array_equal(back[k], values[k]) for k in values)
            del back
            path.unlink()
            blobs = Blobs(str(root / f"blobs-{r}"))
            t = time.perf_counter()
            doc, failed = dump_namespace(values, {}, blobs)
            times["save"].append(time.perf_counter() - t)
            assert not failed
            t = time.perf_counter()
            back, failed = load_namespace(doc, Blobs(blobs.dir))
            times["restore"].append(time.perf_counter() - t)
            assert not failed and all(np.array_equal(back[k], values[k]) for k in values)
            del back
            shutil.rmtree(blobs.dir)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    gb = size / 1e9
    print(
        f"state: {len(values)} numpy arrays, {gb:.2f} GB; median of {args.repeat}; "
        f"{os.cpu_count()} cores"
    )
    print(f"{'operation':<14} {'seconds':>8} {'GB/s':>7} {'/ pickle':>9}")
    for k, raw in (("save", "pickle dump"), ("restore", "pickle load")):
        for name in (raw, k):
            print(
                f"{name:<14} {med[name]:>8.3f} {gb / med[name]:>7.2f} {med[name] / med[raw]:>9.2f}"
            )


if __name__ == "__main__":
    main()
