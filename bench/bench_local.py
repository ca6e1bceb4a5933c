"""spotbook against raw nbclient and papermill on the same notebooks, in one run.

Each tool runs as its own process (as a user runs it), REPEAT times; the table shows
median wall time, ratios to raw nbclient and to papermill without saving, the tool
process's own peak RSS (not the kernel's), and for spotbook the bytes it wrote to its
run store while running, over the final notebook's size.

    .venv/bin/python bench/bench_local.py [--repeat N] [--quick] [--only CASE]
        [--baseline REV]

``--baseline REV`` adds "spotbook@REV": the ``src/`` of that commit, run the same way (to
measure what a change costs, e.g. the run store's seal against the commit before it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import NBCLIENT_SCRIPT, baseline_src, median, timed, write_notebook

CASES = {
    "1 cell": ["x = 1"],
    "100 trivial cells": [f"x = {i}" for i in range(100)],
    "1000 trivial cells": [f"x = {i}" for i in range(1000)],
    # each cell binds one more variable: what the runner does per cell must not grow
    "1000 cells binding a variable each": [f"x{i} = {i}" for i in range(1000)],
    "4000 cells binding a variable each": [f"x{i} = {i}" for i in range(4000)],
    # each cell prints: every output may schedule a refresh of OUTPUT (the running cell's
    # output so far), which must cost nothing measurable per cell either
    "4000 cells printing a line each": [f"print({i})" for i in range(4000)],
    "20 cells x 100 KB output": ["print('x' * 102_399)"] * 20,
}


def tools(nb: Path, out: Path, work: Path) -> dict[str, list[str]]:
    script = work / "nbclient_run.py"
    script.write_text(NBCLIENT_SCRIPT)
    return {
        "nbclient": [str(script), str(nb), str(out)],
        "papermill": ["papermill", str(nb), str(out), "-k", "python3", "--no-progress-bar"],
        "papermill --no-save": [
            "papermill",
            str(nb),
            str(out),
            "-k",
            "python3",
            "--no-progress-bar",
            "--no-request-save-on-cell-execute",
        ],
        "spotbook": [
            "spotbook",
            "run",
            str(nb),
            str(out),
            "--run-dir",
            str(work / "store"),
            "--no-progress-bar",
            "--log-level",
            "WARNING",
        ],
    }


def spotbook_bytes(store: Path) -> tuple[int, int]:
    """(bytes spotbook wrote for progress, final notebook size).

    ``store_bytes`` counts every byte the attempt wrote to its store (records, run.json,
    snapshot manifests and blobs, output.ipynb refreshes) up to the end of the attempt,
    before the final output.ipynb is written.
    """
    attempt = json.loads((store / "attempts" / "0001.json").read_text())
    return attempt["store_bytes"], (store / "output.ipynb").stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="skip the 1000-cell case")
    ap.add_argument("--only", help="run only the case whose name starts with this")
    ap.add_argument("--baseline", metavar="REV", help="also run spotbook at this commit")
    ap.add_argument(
        "--no-papermill-save",
        action="store_true",
        help="leave out papermill with its default saving (minutes on thousands of cells)",
    )
    args = ap.parse_args()
    rows = []
    for case, sources in CASES.items():
        if (args.quick and "1000" in case) or (args.only and not case.startswith(args.only)):
            continue
        work = Path(tempfile.mkdtemp(prefix="bench-"))
        nb = write_notebook(work / "in.ipynb", sources)
        # tools take turns within each repetition, so drifts in machine speed hit all alike
        runs = tools(nb, work / "out.ipynb", work)
        if args.no_papermill_save:
            del runs["papermill"]
        envs: dict[str, dict[str, str]] = {}
        if args.baseline:
            name = f"spotbook@{args.baseline}"
            runs[name] = runs["spotbook"]
            envs[name] = {"PYTHONPATH": str(baseline_src(args.baseline, work))}
        walls: dict[str, list[float]] = {name: [] for name in runs}
        rsss: dict[str, list[int]] = {name: [] for name in runs}
        written: dict[str, tuple[int, int]] = {}
        for _ in range(args.repeat):
            for name, argv in runs.items():
                if walls[name] and walls[name][0] > 30:
                    continue  # papermill's default saving on 1000 cells: once is enough
                shutil.rmtree(work / "store", ignore_errors=True)
                wall, rss = timed(argv, cwd=work, env=envs.get(name))
                walls[name].append(wall)
                rsss[name].append(rss)
                if name.startswith("spotbook"):
                    written[name] = spotbook_bytes(work / "store")
        results = {name: (median(walls[name]), max(rsss[name])) for name in runs}
        base = results["nbclient"][0]
        nosave = results["papermill --no-save"][0]
        for name, (wall, rss) in results.items():
            rows.append(
                (
                    case,
                    name,
                    wall,
                    wall / base,
                    wall / nosave,
                    rss / 1024,
                    f"{written[name][0] / written[name][1]:.2f}" if name in written else "",
                )
            )
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{'case':<26} {'tool':<20} {'wall s':>7} {'/nbclient':>9} {'/pm-nosave':>10} "
        f"{'peak RSS MiB':>12} {'progress bytes / final':>22}"
    )
    for case, name, wall, r1, r2, rss, b in rows:
        print(f"{case:<26} {name:<20} {wall:>7.2f} {r1:>9.2f} {r2:>10.2f} {rss:>12.1f} {b:>22}")


if __name__ == "__main__":
    main()
