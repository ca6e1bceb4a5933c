"""Helpers shared by the benchmarks: notebooks, timed tool processes, peak RSS."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

# Runs a module or script as __main__ and reports the process's own peak RSS (not its
# kernel's) to the file named by BENCH_RSS_FILE when it exits.
_RSS_WRAPPER = """
import atexit, os, resource, runpy, sys
def _report():
    with open(os.environ["BENCH_RSS_FILE"], "w") as fh:
        fh.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
atexit.register(_report)
target = sys.argv[1]
sys.argv = sys.argv[1:]
try:
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
except SystemExit as exc:
    _report()
    raise
"""


def notebook(sources: list[str]) -> dict[str, Any]:
    return {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": f"c{i}",
                "metadata": {},
                "outputs": [],
                "source": s,
            }
            for i, s in enumerate(sources)
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def spotbook_process(*args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """``spotbook ARGS`` started as a user starts it (quiet: no bar, warnings only)."""
    return subprocess.Popen(
        [sys.executable, "-m", "spotbook", *args, "--no-progress-bar", "--log-level", "WARNING"],
        cwd=cwd,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def write_notebook(path: Path, sources: list[str]) -> Path:
    path.write_text(json.dumps(notebook(sources)))
    return path


def timed(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, int]:
    """Run ``python -c WRAPPER argv...``; return (wall seconds, peak RSS in KiB)."""
    with tempfile.NamedTemporaryFile(delete=False) as fh:
        rss_file = fh.name
    full_env = {**os.environ, **(env or {}), "BENCH_RSS_FILE": rss_file}
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", _RSS_WRAPPER, *argv],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{argv} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    rss = int(Path(rss_file).read_text() or 0)
    os.unlink(rss_file)
    return wall, rss


def median(values: list[float]) -> float:
    return statistics.median(values)


NBCLIENT_SCRIPT = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, kernel_name="python3").execute()
nbformat.write(nb, sys.argv[2])
"""


def baseline_src(rev: str, work: Path) -> Path:
    """The ``src/`` of commit ``rev`` (``git archive``), to put first on PYTHONPATH: the
    spotbook it runs, and the kernels it starts, import that version. (``rev`` may also
    name a ``src/`` folder: one archived beforehand, for a copy of the repository without
    its history.)"""
    if Path(rev).is_dir():
        return Path(rev).resolve()
    root = Path(__file__).resolve().parent.parent
    archive = work / "baseline.tar"
    with archive.open("wb") as fh:
        subprocess.run(["git", "archive", rev, "src"], cwd=root, stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(work / "baseline", filter="data")
    return work / "baseline" / "src"


def record_pauses(store: Any) -> list[float]:
    """What the runner spent between cells (snapshot included): each cell's start minus
    the end of the cell before, from a run store's records."""
    import itertools

    records = store.cell_records()
    order = [records[i] for i in sorted(records)]
    return [float(b["start"]) - float(a["end"]) for a, b in itertools.pairwise(order)]
