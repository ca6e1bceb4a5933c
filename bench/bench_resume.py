"""Resume against rerun, snapshot overhead, restore speed.

1. Resume vs rerun: a notebook of 30 cells of 0.5 s compute (15 s, about 15 kernel
   starts), killed (SIGKILL) while its last cell runs. Time to finish after the kill:
   `spotbook resume` against running it again from the start (spotbook --restart,
   and papermill, which is what users do today).
2. Snapshot overhead on a state-heavy notebook (~400 MB of numpy arrays built over
   several compute cells, plus a DataFrame if pandas is importable): run time with
   `--snapshot auto` and `every-cell` against `--snapshot off`.
3. Restore speed: the state of (2) restored from a local store on resume, in MB/s
   (bytes unpickled over the kernel's load time, and over the whole restore step).
4. Snapshot cost per cell on 1000 trivial cells: spotbook with snapshots auto /
   every-cell / off against raw nbclient.
5. SIGTERM to exit: a runner told to stop while a cell runs a long loop.

    .venv/bin/python bench/bench_resume.py [--skip-trivial]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import NBCLIENT_SCRIPT, timed, write_notebook

SPOTBOOK = [sys.executable, "-m", "spotbook"]


def _cells_committed(store: Path) -> int:
    d = store / "cells"
    if not d.is_dir():
        return 0
    return sum((d / n).read_bytes().count(b"\n") for n in os.listdir(d))


def _run(args: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [*SPOTBOOK, *args, "--no-progress-bar", "--log-level", "WARNING"],
        cwd=cwd,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def _kill_after(args: list[str], store: Path, cells: int, cwd: Path) -> None:
    proc = subprocess.Popen(
        [*SPOTBOOK, *args, "--no-progress-bar"],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while _cells_committed(store) < cells:
        if proc.poll() is not None:
            raise RuntimeError("run ended before the kill")
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def resume_vs_rerun(work: Path) -> None:
    n = 30
    nb = write_notebook(
        work / "long.ipynb",
        ["import time\nacc = []"] + [f"time.sleep(0.5)\nacc.append({i})" for i in range(n)],
    )
    store = work / "rs"
    _kill_after(["run", str(nb), "--run-dir", str(store)], store, n, work)  # last cell running
    resume = _run(["resume", str(store)], work)
    restart = _run(["run", str(nb), "--run-dir", str(work / "rs2"), "--restart"], work)
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "papermill",
            str(nb),
            str(work / "pm.ipynb"),
            "-k",
            "python3",
            "--no-progress-bar",
        ],
        check=True,
        capture_output=True,
    )
    papermill = time.perf_counter() - t0
    print(f"\n1. resume vs rerun ({n} cells x 0.5 s, killed during the last cell)")
    print(f"   spotbook resume          {resume:6.2f} s")
    print(f"   rerun: spotbook restart  {restart:6.2f} s   ratio {restart / resume:5.1f}x")
    print(f"   rerun: papermill         {papermill:6.2f} s   ratio {papermill / resume:5.1f}x")


HEAVY = [
    "import numpy as np\nimport time\nrng = np.random.default_rng(0)",
    "a = rng.random(12_500_000)  # 100 MB\nt0 = time.time()\nwhile time.time() - t0 < 2: a.sum()",
    "b = rng.random(12_500_000)  # 100 MB\nt0 = time.time()\nwhile time.time() - t0 < 2: b.sum()",
    "c = a * b  # 100 MB\nt0 = time.time()\nwhile time.time() - t0 < 2: c.sum()",
    "d = np.sqrt(c)  # 100 MB\nt0 = time.time()\nwhile time.time() - t0 < 2: d.sum()",
    "try:\n    import pandas as pd\n    df = pd.DataFrame({'x': rng.random(1_000_000), "
    "'k': rng.integers(0, 100, 1_000_000)})\nexcept ImportError:\n    df = None\n"
    "t0 = time.time()\nwhile time.time() - t0 < 2: c.sum()",
    "t0 = time.time()\nwhile time.time() - t0 < 2: d.sum()\nprint(float(a[0] + d[-1]))",
]


MEDIUM = [
    "import numpy as np\nimport time\nw = np.zeros(12_500_000)  # 100 MB, updated by every step",
] + [
    "t0 = time.time()\nwhile time.time() - t0 < 2:\n    w += 1e-3\nprint(round(float(w[0]), 3))"
] * 10


def snapshot_overhead(work: Path) -> None:
    for label, cells in (
        ("~400 MB of arrays over 7 cells (~12 s of compute)", HEAVY),
        ("100 MB updated by each of 10 cells (~20 s of compute)", MEDIUM),
    ):
        _overhead(work, label, cells)
    _restore_speed(work)


def _overhead(work: Path, label: str, cells: list[str]) -> None:
    nb = write_notebook(work / "heavy.ipynb", cells)
    times = {}
    # background snapshots (the default) and synchronous ones, on the same notebook
    busy = ["--snapshot-hazard", "60/h"]  # a pool that loses a node a minute
    modes = {
        "off": ["--snapshot", "off"],
        "auto": ["--snapshot", "auto"],
        "every-cell": ["--snapshot", "every-cell"],
        "auto sync": ["--snapshot", "auto", "--no-snapshot-background"],
        "every-cell sync": ["--snapshot", "every-cell", "--no-snapshot-background"],
        # auto's Young/Daly interval at a high hazard
        "auto 60/h": ["--snapshot", "auto", *busy],
        "auto 60/h sync": ["--snapshot", "auto", *busy, "--no-snapshot-background"],
    }
    for mode, flags in modes.items():
        rd = work / f"h-{mode.replace(' ', '-')}"
        times[mode] = _run(["run", str(nb), "--run-dir", str(rd), *flags], work)
    print(f"\n2. snapshot overhead, {label}")
    for mode, t in times.items():
        overhead = 100 * (t / times["off"] - 1)
        rd = work / f"h-{mode.replace(' ', '-')}"
        snap_dir = rd / "state" / "snap"
        taken = len(os.listdir(snap_dir)) if snap_dir.is_dir() else 0
        print(
            f"   --snapshot {mode:<16} {t:6.2f} s   overhead {overhead:5.1f}%   "
            f"snapshots taken {taken}"
        )
        shutil.rmtree(rd)


def _restore_speed(work: Path) -> None:
    """3. kill the every-cell run of the 400 MB notebook before its last cell, resume it."""
    nb = write_notebook(work / "heavy.ipynb", HEAVY)
    store = work / "h-kill"
    _kill_after(
        ["run", str(nb), "--run-dir", str(store), "--snapshot", "every-cell"],
        store,
        len(HEAVY) - 1,
        work,
    )
    _run(["resume", str(store)], work)
    att = json.loads((store / "attempts" / "0002.json").read_text())
    mb = att["restored_bytes"] / 1e6
    print(f"\n3. restore from a local store: {mb:.0f} MB")
    print(
        f"   load in kernel     {att['load_seconds']:.3f} s  = {mb / att['load_seconds']:6.0f} MB/s"
    )
    print(
        f"   whole restore step {att['restore_seconds']:.3f} s  = "
        f"{mb / att['restore_seconds']:6.0f} MB/s (incl. replays {att['replayed']})"
    )


def sigterm_to_exit(work: Path) -> None:
    """5. SIGTERM while a cell runs a long loop: time until the runner has exited 75."""
    nb = write_notebook(
        work / "term.ipynb", ["import time\nx = list(range(10))", "time.sleep(600)"]
    )
    print("\n5. SIGTERM to exit, a cell running (default --grace 8 s; GKE gives ~15 s)")
    for grace in ("8", "2"):
        store = work / f"term-{grace}"
        proc = subprocess.Popen(
            [
                *SPOTBOOK,
                "run",
                str(nb),
                "--run-dir",
                str(store),
                "--grace",
                grace,
                "--no-progress-bar",
            ],
            cwd=work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while _cells_committed(store) < 1:
            time.sleep(0.01)
        time.sleep(0.5)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait()
        print(f"   --grace {grace}: exit {code} after {time.perf_counter() - t0:5.2f} s")


def trivial_cells(work: Path) -> None:
    nb = write_notebook(work / "t.ipynb", [f"x = {i}" for i in range(1000)])
    script = work / "nbc.py"
    script.write_text(NBCLIENT_SCRIPT)
    base = min(timed([str(script), str(nb), str(work / "o.ipynb")], work)[0] for _ in range(3))
    print("\n4. 1000 trivial cells: snapshot policy cost (best of 3)")
    print(f"   raw nbclient            {base:6.2f} s")
    for mode in ("off", "auto", "every-cell"):
        best = min(
            _run(
                ["run", str(nb), "--run-dir", str(work / f"t-{mode}-{i}"), "--snapshot", mode], work
            )
            for i in range(3)
        )
        print(f"   spotbook --snapshot {mode:<11} {best:6.2f} s   ratio {best / base:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-trivial", action="store_true")
    ap.add_argument("--only-overhead", action="store_true", help="section 2 alone")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    if args.only_overhead:
        try:
            for label, cells in (
                ("~400 MB of arrays over 7 cells (~12 s of compute)", HEAVY),
                ("100 MB updated by each of 10 cells (~20 s of compute)", MEDIUM),
            ):
                _overhead(work, label, cells)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    try:
        resume_vs_rerun(work)
        snapshot_overhead(work)
        sigterm_to_exit(work)
        if not args.skip_trivial:
            trivial_cells(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
