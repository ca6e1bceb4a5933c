"""What a ``spotbook`` command costs before it does anything: its process's start.

Every command, and every test that runs one, starts a Python process that imports
nbformat, whose jsonschema imports ``rfc3987_syntax`` when it is installed (JupyterLab's
jupyter-events installs it) and builds a grammar's parser on import. The command now
makes that import fail in its own process (``cli/main.py``); this bench runs the same
``spotbook status RUN`` both ways, taking turns: as the command runs now, and with the
module imported first, as every command did before.

    .venv/bin/python bench/bench_cli_start.py      # ~1 min
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPS = 7
BEFORE = (
    "import sys, rfc3987_syntax\n"
    "from spotbook.cli.main import main\n"
    "sys.argv = ['spotbook', *sys.argv[1:]]\n"
    "sys.exit(main())\n"
)


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, check=True)
    return time.perf_counter() - t0


def main() -> None:
    try:
        import rfc3987_syntax  # noqa: F401
    except ImportError:
        print("rfc3987_syntax is not installed here: every command starts without it")
        return
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SPOTBOOK_CONFIG_DIR": os.path.join(tmp, "cfg")}
        nb = os.path.join(tmp, "one.ipynb")
        cell = {"cell_type": "code", "metadata": {}, "source": "x = 1", "outputs": [],
                "execution_count": None}  # fmt: skip
        spec = {"name": "python3", "display_name": "Python 3", "language": "python"}
        with open(nb, "w") as fh:
            json.dump({"cells": [cell], "metadata": {"kernelspec": spec}, "nbformat": 4,
                       "nbformat_minor": 5}, fh)  # fmt: skip
        run_dir = os.path.join(tmp, "run")
        subprocess.run([sys.executable, "-m", "spotbook", "run", nb, "--run-dir", run_dir,
                        "--no-progress-bar"], env=env, capture_output=True, check=True)  # fmt: skip
        now, before = [], []
        for _ in range(REPS):  # taking turns: a drift in the machine's speed hits both
            now.append(timed([sys.executable, "-m", "spotbook", "status", run_dir], env))
            before.append(timed([sys.executable, "-c", BEFORE, "status", run_dir], env))
    a, b = statistics.median(now), statistics.median(before)
    print(f"`spotbook status RUN`, median of {REPS}:")
    print("| | wall s | / before |")
    print("|---|---:|---:|")
    print(f"| with rfc3987_syntax imported (before) | {b:.3f} | 1.00 |")
    print(f"| **now** | {a:.3f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
