"""A 32-point sweep of a small notebook: spotbook sweep against a shell loop of papermill
calls, and against itself one point at a time, in one run.

Every point is a real kernel. The table shows each way's wall time, its ratio to the
papermill loop, and the kernels' own peak RSS (each kernel reports
``VmHWM`` in its last cell; median and max over the points), beside the peak RSS
of the process the user started (papermill's is per call, the loop's largest).

    .venv/bin/python bench/bench_sweep.py [--points 32] [--parallel N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import timed

NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "params",
            "metadata": {"tags": ["parameters"]},
            "outputs": [],
            "source": "lr = 0.1\nseed = 0",
        },
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "work",
            "metadata": {},
            "outputs": [],
            "source": "import random\nrng = random.Random(seed)\n"
            "loss = sum(lr * rng.random() for _ in range(20000))",
        },
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "rss",
            "metadata": {},
            "outputs": [],
            # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a kernel's
            # would start at its launcher's size
            "source": "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
            "print('KERNEL_RSS_KIB', hwm[0].split()[1])",
        },
    ],
    "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    },
    "nbformat": 4,
    "nbformat_minor": 5,
}
RSS = re.compile(r"KERNEL_RSS_KIB (\d+)")


def kernel_rss(paths: list[Path]) -> list[int]:
    out = []
    for path in paths:
        text = path.read_text()
        found = RSS.search(text)
        if found:
            out.append(int(found.group(1)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=32)
    ap.add_argument("--parallel", type=int, default=None, help="default: spotbook's own")
    args = ap.parse_args()
    from spotbook.ops.sweep import default_parallel

    width = args.parallel or default_parallel()
    lrs = [round(0.01 * (i + 1), 2) for i in range(args.points // 2)]
    seeds = [1, 2]
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        (work / "nb.ipynb").write_text(json.dumps(NOTEBOOK))
        loop = work / "loop.sh"
        lines = ["set -e"]
        k = 0
        for lr in lrs:
            for seed in seeds:
                lines.append(
                    f"papermill nb.ipynb pm/out_{k}.ipynb -k python3 --no-progress-bar "
                    f"-p lr {lr} -p seed {seed} 2>/dev/null"
                )
                k += 1
        loop.write_text("\n".join(lines) + "\n")
        (work / "pm").mkdir()
        grid = ["-p", "lr", ",".join(map(str, lrs)), "-p", "seed", "1,2"]
        sweep = ["spotbook", "sweep", "nb.ipynb", *grid]

        def outputs(folder: str) -> list[Path]:
            return sorted((work / folder).glob("**/*.ipynb"))

        ways = {
            "papermill, shell loop": (["/bin/bash", str(loop)], "pm"),
            "spotbook sweep --parallel 1": ([*sweep, "--run-dir", "s1", "--parallel", "1"], "s1"),
            f"spotbook sweep --parallel {width}": (
                [*sweep, "--run-dir", "sN", "--parallel", str(width)],
                "sN",
            ),
        }
        env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        results = {}
        for name, (argv, folder) in ways.items():
            if argv[0] == "/bin/bash":
                t0 = time.perf_counter()
                subprocess.run(argv, cwd=work, env={**os.environ, **env}, check=True)
                wall, rss = time.perf_counter() - t0, 0
            else:
                wall, rss = timed(argv, work, env)
            found = outputs(folder)
            if folder != "pm":
                found = [p for p in found if p.name == "output.ipynb"]
            kernels = kernel_rss(found)
            assert len(kernels) == args.points, (name, len(kernels))
            results[name] = (wall, rss, kernels)
        base = results["papermill, shell loop"][0]
        print(f"{args.points} points, {os.cpu_count()} cores; kernels' peak RSS from each kernel")
        print(
            "| way | wall s | / papermill loop | s per point | kernel RSS MiB median | max |"
            " tool RSS MiB |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, (wall, rss, kernels) in results.items():
            print(
                f"| {name} | {wall:.1f} | {wall / base:.2f} | {wall / args.points:.2f} | "
                f"{statistics.median(kernels) / 1024:.1f} | {max(kernels) / 1024:.1f} | "
                + (f"{rss / 1024:.1f} |" if rss else "- |")
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
