"""A training cell killed part-way, now (resumed inside the cell) and before issue 57
(resumed from the cell's first line), in one run; and what checkpoints inside the cell
cost a run that is never killed.

    .venv/bin/python bench/bench_in_cell.py [--epochs 20] [--epoch-seconds 3]
        [--kills 3] [--mb 100] [--repeat 3] [--seed 1] [--dir DIR]

The notebook: a set-up cell that makes ``--mb`` MB of weights, then one cell whose
top-level loop runs ``--epochs`` epochs of about ``--epoch-seconds`` of numpy compute each
(the weights updated every epoch, a loss printed). Two measurements:

- killed: the run is SIGKILLed ``--kills`` times, each at a random point of a random
  epoch (the epochs drawn once, sorted, the same for both sides; the point inside the
  epoch a random fraction of it), and resumed at once each time, until it finishes. The
  figure is the wall time from the first start to the end of the last attempt, over an
  uninterrupted run's. The run says how often it expects to be preempted
  (``--snapshot-hazard``: this bench's own rate, kills per run's length), so the
  checkpoint interval is the Young/Daly interval for that rate. Before: the same, with
  ``SPOTBOOK_LOOP_CHECKPOINTS=0`` (each kill loses the cell).
- overhead: the run uninterrupted at the default interval (hazard 1/h) against the same
  with ``SPOTBOOK_LOOP_CHECKPOINTS=0``, ``--repeat`` times each, in turn; medians.

Each kill is placed on the notebook's own progress (it writes the epoch it starts to a
file): the bench waits for epoch e to start, then for a random fraction of an epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETUP = """\
import os, time, hashlib
import numpy as np
rng = np.random.default_rng(0)
W = rng.normal(size=({n},)).astype(np.float64)
A = rng.normal(size=(600, 600))
PROGRESS = os.environ["BENCH_PROGRESS"]
"""

TRAIN = """\
for epoch in range({epochs}):
    with open(PROGRESS, "w") as fh:
        fh.write(str(epoch))
    t0 = time.perf_counter()
    x = A
    while time.perf_counter() - t0 < {seconds}:  # compute, not a sleep
        x = np.tanh(x @ A / 600.0)
    W[: 1000] += float(x.mean())
    W *= 0.999
    print(f"epoch {{epoch}} loss {{float((W ** 2).mean())!r}}")
print("weights", hashlib.sha256(W.tobytes()).hexdigest())
"""


def _notebook(path: Path, args: argparse.Namespace) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [
        nbformat.v4.new_code_cell(SETUP.format(n=args.mb * (1 << 20) // 8)),
        nbformat.v4.new_code_cell(TRAIN.format(epochs=args.epochs, seconds=args.epoch_seconds)),
    ]
    nbformat.write(nb, path)


def _spotbook(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "spotbook", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _epoch(progress: Path) -> int:
    try:
        return int(progress.read_text() or -1)
    except (FileNotFoundError, ValueError):
        return -1


def _run(
    work: Path, env: dict[str, str], extra: list[str], kills: list[tuple[int, float]], tag: str
) -> tuple[float, str]:
    """Wall seconds from the first start to the end; the output's last line."""
    rd = work / f"rd-{tag}"
    progress = Path(env["BENCH_PROGRESS"])
    progress.unlink(missing_ok=True)
    args = ["run", "nb.ipynb", f"out-{tag}.ipynb", "--run-dir", str(rd), *extra]
    t0 = time.monotonic()
    for epoch, fraction in kills:
        proc = _spotbook(*args, cwd=work, env=env)
        while _epoch(progress) < epoch and proc.poll() is None:
            time.sleep(0.01)  # a poll of the notebook's progress
        # a random point of the epoch: the bench's own choice of instant
        time.sleep(fraction * float(env["BENCH_EPOCH_SECONDS"]))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        progress.unlink(missing_ok=True)
        args = ["resume", str(rd)]
    proc = _spotbook(*args, cwd=work, env=env)
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{tag}: exit {proc.returncode}\n{err.decode()[-2000:]}")
    wall = time.monotonic() - t0
    nb = json.loads((work / f"out-{tag}.ipynb").read_text())
    text = "".join(nb["cells"][1]["outputs"][0]["text"])
    shutil.rmtree(rd)
    return wall, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--epoch-seconds", type=float, default=3.0)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-in-cell-"))
    work.mkdir(parents=True, exist_ok=True)
    _notebook(work / "nb.ipynb", args)
    base = {
        **os.environ,
        "BENCH_PROGRESS": str(work / "progress"),
        "BENCH_EPOCH_SECONDS": str(args.epoch_seconds),
    }
    off = {**base, "SPOTBOOK_LOOP_CHECKPOINTS": "0"}
    rng = random.Random(args.seed)
    epochs = sorted(rng.sample(range(1, args.epochs), args.kills))
    kills = [(e, rng.random()) for e in epochs]
    length = args.epochs * args.epoch_seconds
    hazard = ["--snapshot-hazard", f"{args.kills * 3600 / length:g}/h"]
    print(f"notebook: {args.mb} MB of weights, {args.epochs} epochs of ~{args.epoch_seconds} s")
    print(f"kills at epochs {', '.join(f'{e} (+{f:.2f})' for e, f in kills)}; {hazard[1]}")

    plain, plain_off = [], []
    reference = ""
    for i in range(args.repeat):
        wall, text = _run(work, base, [], [], f"plain-{i}")
        plain.append(wall)
        reference = reference or text
        assert text == reference, "an uninterrupted run differs from another"
        wall, text = _run(work, off, [], [], f"plain-off-{i}")
        plain_off.append(wall)
        assert text == reference
    now, now_text = _run(work, base, hazard, kills, "killed")
    before, before_text = _run(work, off, hazard, kills, "killed-off")
    assert now_text == reference, "the killed run's output differs from an uninterrupted run's"
    assert before_text == reference
    p, q = statistics.median(plain), statistics.median(plain_off)
    print(f"uninterrupted: {p:.1f} s with checkpoints inside the cell, {q:.1f} s without")
    print(f"  overhead of checkpoints inside the cell (default interval): {p / q - 1:+.1%}")
    print(f"killed {args.kills} times: now {now:.1f} s = {now / q:.3f}x an uninterrupted run")
    print(f"killed {args.kills} times: before {before:.1f} s = {before / q:.3f}x")
    print("outputs: every run printed the same losses and weights")
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
