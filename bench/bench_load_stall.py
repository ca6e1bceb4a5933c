"""Cells that stall under CPU load: nbclient's own Output.ipynb run N times beside one
busy-loop process per core, by raw nbclient and by spotbook, each with a 30 s cell limit.

    .venv/bin/python bench/bench_load_stall.py [--runs 6]

A missed ZeroMQ wake-up leaves a reply unread until the next poll: raw nbclient waits
for it until its cell timeout; spotbook re-polls every 0.5 s (see docs/DESIGN.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOTEBOOK = (
    Path(__file__).resolve().parents[2] / "shared" / "notebooks" / "nbclient" / "Output.ipynb"
)
RAW = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=30, kernel_name="python3",
               resources={"metadata": {"path": sys.argv[2]}}).execute()
"""


def _timed(cmd: list[str], cwd: str) -> tuple[float, int]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, timeout=300, check=False)
    return time.monotonic() - t0, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=6)
    args = ap.parse_args()
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    results: dict[str, list[tuple[float, int]]] = {"raw nbclient": [], "spotbook": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                results["raw nbclient"].append(
                    _timed([sys.executable, "-c", RAW, str(NOTEBOOK), str(NOTEBOOK.parent)], tmp)
                )
                results["spotbook"].append(
                    _timed(
                        [
                            sys.executable,
                            "-m",
                            "spotbook",
                            "run",
                            str(NOTEBOOK),
                            "--run-dir",
                            f"rd{i}",
                            "--cwd",
                            str(NOTEBOOK.parent),
                            "--execution-timeout",
                            "30",
                            "--no-progress-bar",
                        ],
                        tmp,
                    )
                )
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    print(f"Output.ipynb, {args.runs} runs each, {len(hogs)} busy-loop processes beside it")
    for tool, rows in results.items():
        stalled = sum(1 for secs, _ in rows if secs > 10)
        failed = sum(1 for _, code in rows if code != 0)
        worst = max(secs for secs, _ in rows)
        print(
            f"  {tool:<13} stalled (>10 s) {stalled}/{len(rows)}, failed {failed}, "
            f"slowest {worst:.1f} s"
        )


if __name__ == "__main__":
    main()
