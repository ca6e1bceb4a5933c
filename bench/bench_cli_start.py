"""What a ``spotbook`` command costs before it does anything: its process's start.

Every command, and every test that runs one, starts a Python process that imports
nbformat, whose jsonschema imports the libraries of its optional format checks when they
are installed (JupyterLab's jupyter-events installs them); ``rfc3987_syntax`` among them
builds a grammar's parser on import. The command now makes those imports fail in its own
process (``cli/main.py``); this bench runs the same ``spotbook status RUN`` three ways,
taking turns: as the command runs now; with only ``rfc3987_syntax`` kept out (the
others imported first: as commands ran before stop 48); and with every one imported
first, as commands ran before stop 47.

The second table is a whole ``spotbook run`` of a one-cell notebook (kernel included):
as it runs now, and with IPython imported first, as it was before jupyter_client's
kernelspec finder was given its folders (``attempt/executor.py`` ``kernel_specs``; its
default imports IPython to find one of them). CPU seconds are the command's and its
kernel's, from ``getrusage`` of the waited-for children.

    .venv/bin/python bench/bench_cli_start.py      # ~2 min
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPS = 9
BEFORE = (
    "import sys, rfc3987_syntax\n"
    "from spotbook.cli.main import main\n"
    "sys.argv = ['spotbook', *sys.argv[1:]]\n"
    "sys.exit(main())\n"
)
IRI_ONLY = (
    "import sys, importlib\n"
    "sys.modules['rfc3987_syntax'] = None\n"
    "from spotbook.cli.main import FORMAT_CHECK_MODULES, main\n"
    "for m in FORMAT_CHECK_MODULES[1:]:\n"
    "    try:\n        importlib.import_module(m)\n"
    "    except ImportError:\n        pass\n"
    "sys.argv = ['spotbook', *sys.argv[1:]]\n"
    "sys.exit(main())\n"
)


WITH_IPYTHON = (
    "import sys, IPython.paths\n"
    "from spotbook.cli.main import main\n"
    "sys.argv = ['spotbook', *sys.argv[1:]]\n"
    "sys.exit(main())\n"
)


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, check=True)
    return time.perf_counter() - t0


def cpu_timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the command and every process it waited for)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = timed(argv, env)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def run_start(nb: str, tmp: str, env: dict[str, str]) -> None:
    """``spotbook run`` now against with IPython imported first, taking turns."""
    rows: dict[str, list[tuple[float, float]]] = {"now": [], "ipython": []}
    for i in range(REPS):
        for name, head in (("now", ["-m", "spotbook"]), ("ipython", ["-c", WITH_IPYTHON])):
            where = os.path.join(tmp, f"r-{name}-{i}")
            argv = [sys.executable, *head, "run", nb, "--run-dir", where, "--no-progress-bar"]
            rows[name].append(cpu_timed(argv, env))
    (bw, bc), (nw, nc) = (
        (statistics.median(w for w, _ in rows[k]), statistics.median(c for _, c in rows[k]))
        for k in ("ipython", "now")
    )
    print(f"\n`spotbook run` of a one-cell notebook, kernel included, median of {REPS}:")
    print("| | wall s | CPU s | CPU / before |")
    print("|---|---:|---:|---:|")
    print(f"| IPython imported by the kernelspec finder (before) | {bw:.3f} | {bc:.3f} | 1.00 |")
    print(f"| **now**: the finder given its folders | {nw:.3f} | {nc:.3f} | {nc / bc:.2f} |")


def _one_cell(nb: str) -> None:
    cell = {"cell_type": "code", "metadata": {}, "source": "x = 1", "outputs": [],
            "execution_count": None}  # fmt: skip
    spec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with open(nb, "w") as fh:
        json.dump({"cells": [cell], "metadata": {"kernelspec": spec}, "nbformat": 4,
                   "nbformat_minor": 5}, fh)  # fmt: skip


def main() -> None:
    try:
        import rfc3987_syntax  # noqa: F401
    except ImportError:
        print("rfc3987_syntax is not installed here: every command starts without it")
        return
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SPOTBOOK_CONFIG_DIR": os.path.join(tmp, "cfg")}
        nb = os.path.join(tmp, "one.ipynb")
        _one_cell(nb)
        run_dir = os.path.join(tmp, "run")
        subprocess.run([sys.executable, "-m", "spotbook", "run", nb, "--run-dir", run_dir,
                        "--no-progress-bar"], env=env, capture_output=True, check=True)  # fmt: skip
        now, iri, before = [], [], []
        for _ in range(REPS):  # taking turns: a drift in the machine's speed hits all
            now.append(timed([sys.executable, "-m", "spotbook", "status", run_dir], env))
            iri.append(timed([sys.executable, "-c", IRI_ONLY, "status", run_dir], env))
            before.append(timed([sys.executable, "-c", BEFORE, "status", run_dir], env))
    a, m, b = statistics.median(now), statistics.median(iri), statistics.median(before)
    print(f"`spotbook status RUN`, median of {REPS}:")
    print("| | wall s | / before |")
    print("|---|---:|---:|")
    print(f"| with rfc3987_syntax imported (before stop 47) | {b:.3f} | 1.00 |")
    print(f"| without rfc3987_syntax, other checkers imported (stop 47) | {m:.3f} | {m / b:.2f} |")
    print(f"| **now**: without any format checker's library | {a:.3f} | {a / b:.2f} |")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SPOTBOOK_CONFIG_DIR": os.path.join(tmp, "cfg")}
        nb = os.path.join(tmp, "one.ipynb")
        _one_cell(nb)
        run_start(nb, tmp, env)


if __name__ == "__main__":
    main()
