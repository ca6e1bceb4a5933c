"""How long a snapshot stops the notebook, for kernels of each kind, now and before (a
commit given by ``--before``), at several sizes of state, in one run.

    .venv/bin/python bench/bench_snapshot_pause.py [--sizes 0.1,1,4]
        [--kernels numpy,torch,polars,lightgbm[,cuda]] [--before REV] [--no-overhead]
        [--repeat N] [--dir DIR]

Each notebook builds N GiB of state of its kind (numpy arrays; torch CPU tensors; a
polars DataFrame; numpy arrays in a kernel that has trained a LightGBM booster), then runs
3 cells that change every buffer a little (so every snapshot has all of it to save), then
3 cells that change nothing large (the first of them reported apart: before, a numpy
array in a staged kernel was copied until two snapshots in a row found it the same);
``--snapshot every-cell``. Each cell waits until the snapshot before it is committed, so
what is measured is the pause itself, not a wait for the snapshot before. numpy kernels
may fork (a background snapshot); the others may not: before, their snapshots were
taken synchronously; now they are staged (the changed buffers copied, then written by a
thread of the kernel). ``cuda`` (a GPU machine only): torch tensors on the GPU, staged
by a copy into pinned memory; before, torch's own reducer copied each one through
``torch.save``.

The pause after a cell is the time from its record's end to the next cell's start (what
the runner spent between them, snapshot included), read from the run store's records.
It is set against one ``memcpy`` of the buffers that changed, timed here in the same run
(into memory already mapped, as the staging memory is after the first snapshot); for
``cuda``, against a plain ``tensor.cpu()`` of the same tensors. ``--repeat N`` runs each
side N times, in turn, and pools their pauses (a 2-core machine's pauses of 10-30 ms
vary by several ms from run to run).

With the overhead part (on unless ``--no-overhead``): six cells of 0.5 s each updating a
400 MB tensor (torch) or array (numpy), ``--snapshot off`` against ``every-cell``; the
time from the first cell's start to the last one's end, now and before.
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
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import baseline_src, record_pauses, write_notebook

from spotbook.store.runstore import RunStore

# per kind: (imports and the state built from `n` float64 values in `parts` pieces, a
# change to every piece, a cell that changes nothing large)
KINDS = {
    "numpy": (
        "import numpy as np, time\nrng = np.random.default_rng(0)\n"
        "state = [rng.random({n}) for _ in range({parts})]",
        "for a in state:\n    a[:512] += 1.0",
        "x = sum(float(a[0]) for a in state)",
    ),
    "torch": (
        "import torch, time\ntorch.manual_seed(0)\n"
        "state = [torch.rand({n}, dtype=torch.float64) for _ in range({parts})]",
        "for t in state:\n    t[:512] += 1.0",
        "x = sum(float(t[0]) for t in state)",
    ),
    "polars": (
        "import numpy as np, polars as pl, time\nrng = np.random.default_rng(0)\n"
        "state = pl.DataFrame({{f'c{{i}}': rng.random({n}) for i in range({parts})}})",
        "state = state.with_columns(pl.all() + 1.0)",
        "x = float(state[0, 0])",
    ),
    "cuda": (
        "import torch, time\ntorch.manual_seed(0)\n"
        "state = [torch.rand({n}, dtype=torch.float64, device='cuda') for _ in range({parts})]",
        "for t in state:\n    t[:512] += 1.0",
        "x = sum(float(t[0]) for t in state)",
    ),
    "lightgbm": (
        "import numpy as np, lightgbm as lgb, time\nrng = np.random.default_rng(0)\n"
        "X = rng.random((2000, 5)); y = X @ np.arange(5.0)\n"
        "booster = lgb.train({{'verbose': -1}}, lgb.Dataset(X, y), num_boost_round=5)\n"
        "state = [rng.random({n}) for _ in range({parts})]",
        "for a in state:\n    a[:512] += 1.0",
        "x = float(booster.predict(X[:1])[0]) + sum(float(a[0]) for a in state)",
    ),
}


def cells(kind: str, gib: float, snaps: Path) -> list[str]:
    """The notebook; each cell after the first waits until the snapshot after the cell
    before it is committed (a manifest in ``snaps``) and on disk, so no snapshot is still
    being written at the next boundary: what is measured is the pause, not a wait for a
    write."""
    parts = max(1, int(gib * 8))
    n = int(gib * (1 << 30) / 8 / parts)
    build, change, same = (c.format(n=n, parts=parts) for c in KINDS[kind])

    def after(k: int) -> str:
        # then waits for the disk to take what it wrote: a pause after GiBs written may
        # otherwise be the kernel's own small writes held back by the page cache's
        # writeback (dirty-page throttling), whatever the snapshot does
        return f"\nwhile snapshots() < {k}:\n    time.sleep(0.01)\nos.sync()"

    first = (
        f"import os\ndef snapshots():\n    d = {str(snaps)!r}\n"
        "    return len([f for f in os.listdir(d) if f.endswith('.json')]) "
        "if os.path.isdir(d) else 0\n" + build
    )
    body = [change] * 3 + [same] * 3
    return [first, *[c + after(k + 1) for k, c in enumerate(body)], "print(x)"]


def memcpy_seconds(nbytes: int) -> float:
    """One copy of ``nbytes`` into memory already mapped (best of three)."""
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # maps the destination's pages
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return best


def cpu_seconds(gib: float) -> float:
    """``tensor.cpu()`` of the tensors the ``cuda`` notebook builds, in this process on the
    same GPU (best of three)."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--kernels cuda needs torch with CUDA and a GPU; this machine has none")
    parts = max(1, int(gib * 8))
    state = [
        torch.rand(int(gib * (1 << 30) / 8 / parts), dtype=torch.float64, device="cuda")
        for _ in range(parts)
    ]
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        copies = [t.cpu() for t in state]
        best = min(best, time.perf_counter() - t0)
        del copies
    del state
    torch.cuda.empty_cache()
    return best


# one run: its attempt record, the pauses after each cell, first start to last end, and of
# each pause what the kernel took itself (the snapshot records' kernel_pause_seconds)
Run = tuple[dict[str, Any], list[float], float, list[float]]


def run(nb: Path, work: Path, snapshot: str, env: dict[str, str]) -> Run:
    """One run of ``nb`` (see :data:`Run`)."""
    rd = work / "rd"
    r = subprocess.run(
        [sys.executable, "-m", "spotbook", "run", str(nb), "--run-dir", str(rd),
         "--snapshot", snapshot, "--no-progress-bar", "--log-level", "WARNING"],
        cwd=work, capture_output=True, text=True, env={**os.environ, **env},
    )  # fmt: skip
    if r.returncode:
        raise SystemExit(f"spotbook run failed ({r.returncode}):\n{r.stderr[-3000:]}")
    store = RunStore(str(rd))
    (attempt,) = store.attempts()
    records = store.cell_records()
    span = float(records[max(records)]["end"]) - float(records[min(records)]["start"])
    pauses = record_pauses(store)
    kernel = [0.0] * len(pauses)
    for index, key in store.snapshot_keys().items():
        doc = store.read_snapshot(key) or {}
        if index < len(kernel):
            kernel[index] = float(doc.get("kernel_pause_seconds") or 0.0)
    shutil.rmtree(rd)
    return attempt, pauses, span, kernel


def pooled(runs: list[Run]) -> tuple[Any, ...]:
    """Runs' pauses pooled: (the first run's attempt record, the pauses after the cells
    that change every buffer, after the first cell without a change, after the later
    ones, the kernel's part of the first of these). pauses[0] follows the build; before,
    a numpy array in a staged kernel was reused only once two snapshots in a row found it
    the same: hence the first apart."""
    return (
        runs[0][0],
        [x for r in runs for x in r[1][1:4]],
        [r[1][4] for r in runs],
        [x for r in runs for x in r[1][5:7]],
        [x for r in runs for x in r[3][1:4]],
    )


def ms(x: float) -> str:
    return f"{x * 1e3:8.1f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="0.1,1,4", help="GiB of state, comma-separated (none: none)")
    ap.add_argument("--kernels", default=",".join(k for k in KINDS if k != "cuda"))
    ap.add_argument("--before", default="2a32382", help="the commit to compare with")
    ap.add_argument("--no-overhead", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each side, their pauses pooled")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-pause-", dir=args.dir))
    # first on the path: what PYTHONPATH held (the Jupyter packages, on a GPU machine) after
    old = {
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(baseline_src(args.before, work)), os.environ.get("PYTHONPATH")) if p
        )
    }
    rows: list[dict[str, Any]] = []
    try:
        print(
            "kernel   GiB | changed: pause ms now / before, memcpy (cuda: .cpu()) ms, "
            "now/memcpy, of which the kernel's now | "
            "nothing large changed: pause ms now / before, first | later | how now",
            flush=True,
        )
        for gib in (float(x) for x in args.sizes.split(",") if x != "none"):
            kinds = args.kernels.split(",")
            host = memcpy_seconds(int(gib * (1 << 30))) if set(kinds) - {"cuda"} else 0.0
            for kind in kinds:
                copy = cpu_seconds(gib) if kind == "cuda" else host
                nb = write_notebook(work / "p.ipynb", cells(kind, gib, work / "rd/state/snap"))
                nows, befores = [], []
                for _ in range(args.repeat):  # in turn: the machine's drift hits both alike
                    nows.append(run(nb, work, "every-cell", {}))
                    befores.append(run(nb, work, "every-cell", old))
                now, before = pooled(nows), pooled(befores)
                changed = (statistics.median(now[1]), statistics.median(before[1]))
                first = (statistics.median(now[2]), statistics.median(before[2]))
                same = (statistics.median(now[3]), statistics.median(before[3]))
                how = (
                    "staged"
                    if now[0].get("snapshots_staged")
                    else "synchronous"
                    if now[0].get("snapshots_sync")
                    else "background (fork)"
                )
                fallback = now[0].get("snapshots_staging_fallback")
                print(
                    f"{kind:8} {gib:4.1f} | {ms(changed[0])} / {ms(changed[1])}, "
                    f"{ms(copy)}, {changed[0] / copy:6.2f}, {ms(statistics.median(now[4]))} | "
                    f"{ms(first[0])} / {ms(first[1])} | "
                    f"{ms(same[0])} / {ms(same[1])} | "
                    f"{how}{'; ' + fallback if fallback else ''}",
                    flush=True,
                )
                rows.append(
                    {
                        "kernel": kind,
                        "gib": gib,
                        "memcpy_ms": round(copy * 1e3, 1),
                        "now_ms": [[round(x * 1e3, 1) for x in r[1]] for r in nows],
                        "before_ms": [[round(x * 1e3, 1) for x in r[1]] for r in befores],
                        "now_kernel_ms": [[round(x * 1e3, 1) for x in r[3]] for r in nows],
                        "how": how,
                    }
                )
        if not args.no_overhead:
            overhead(work, old, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(rows))


def overhead(work: Path, old: dict[str, str], repeat: int = 1) -> None:
    """every-cell against off, on six 0.5 s cells updating 400 MB: torch and numpy (each
    time the median of ``repeat`` runs)."""
    n = 400_000_000 // 8
    notebooks = {
        "numpy": [f"import numpy as np, time\nw = np.zeros({n})"],
        "torch": [f"import torch, time\nw = torch.zeros({n}, dtype=torch.float64)"],
    }
    step = "w += 1.0\ntime.sleep(0.5)"
    factor: dict[tuple[str, str], float] = {}
    extra: dict[tuple[str, str], float] = {}
    for kind, sources in notebooks.items():
        nb = write_notebook(work / f"o-{kind}.ipynb", [*sources, *[step] * 6])
        for when, env in (("now", {}), ("before", old)):
            off = statistics.median(run(nb, work, "off", env)[2] for _ in range(repeat))
            every = statistics.median(run(nb, work, "every-cell", env)[2] for _ in range(repeat))
            factor[kind, when] = every / off
            extra[kind, when] = every - off
            print(
                f"overhead {kind:5} {when:6}: off {off:5.2f} s, every-cell {every:5.2f} s, "
                f"x{every / off:.2f}",
                flush=True,
            )
    for when in ("now", "before"):
        print(
            f"every-cell overhead, torch against numpy ({when}): seconds added "
            f"{extra['torch', when] / max(extra['numpy', when], 1e-3):.2f}x, slowdown "
            f"{factor['torch', when] / factor['numpy', when]:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
