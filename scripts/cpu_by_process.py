"""Where a machine's CPU goes, by kind of process, while a command runs (CI's suite, say).

It samples /proc twice a second: each process's CPU time (user + system), remembered at its
largest, with its command line. A process that lives less than half a second may be
missed, so the figures are a floor. Usage (Linux):

    python3 scripts/cpu_by_process.py bash .ci/run       # runs the command, then reports
    python3 scripts/cpu_by_process.py --report cpu.json  # the report of an earlier sample

The sample is kept in cpu.json (every process: command line, CPU seconds). Processes are
grouped by what they are: spotbook's commands (by subcommand), kernels, the storage
servers, pytest's workers, the kernel's own threads (an empty command line), others.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def sample(stop: threading.Event, into: dict[tuple[str, str], list]) -> None:
    """Until ``stop``: every process's (pid, start) -> [command line, CPU ticks, ticks it
    had when the sampling began] (the last is 0 for a process started since)."""
    first = True
    while True:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
                ticks, started = int(rest[11]) + int(rest[12]), rest[19]
                key = (pid, started)
                if key not in into:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:300]
                    into[key] = [cmd, ticks, ticks if first else 0]
                else:
                    into[key][1] = max(into[key][1], ticks)
            except (OSError, IndexError, ValueError):
                continue  # gone between listing and reading
        if not first and stop.is_set():
            return
        first = False
        stop.wait(0.5)  # and one last pass once stopped


def kind(cmd: str) -> str:
    """What kind of process a command line is."""
    words = cmd.split()
    if not words:
        return "the kernel's own threads (kworker, kdamond…)"
    if "ipykernel_launcher" in cmd:
        return "Jupyter kernels"
    for i, w in enumerate(words):
        if w.endswith("bin/spotbook") or (w == "spotbook" and i and words[i - 1] == "-m"):
            return f"spotbook {words[i + 1] if i + 1 < len(words) else ''}".strip()
    for needle, name in (
        ("moto.server", "moto S3 server"),
        ("faultproxy", "fault proxy"),
        ("azurite", "Azurite"),
        ("fake-gcs", "fake-gcs-server"),
        ("tests.store_fuzz", "store fuzz driver"),
        ("gcloud", "gcloud"),
        ("papermill", "papermill"),
        ("jupyter_server", "jupyter server"),
        ("chrom", "Chromium"),
        ("airflow", "Airflow"),
        ("pip", "pip"),
        ("podman", "podman"),
        ("exec(eval(sys.stdin.readline()))", "pytest-xdist workers"),
        ("pytest", "pytest"),
    ):
        if needle in cmd:
            return name
    return "other"


def report(rows: list[list]) -> None:
    """The CPU seconds of each kind, largest first."""
    by: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for cmd, ticks in rows:
        by[kind(cmd)] += ticks / TICK
        count[kind(cmd)] += 1
    total = sum(by.values())
    print(f"CPU seconds sampled: {total:.0f}")
    print("| kind | CPU s | share | processes | s each |")
    print("|---|---:|---:|---:|---:|")
    for name, secs in by.most_common():
        n = count[name]
        print(f"| {name} | {secs:.0f} | {secs / total:.1%} | {n} | {secs / n:.2f} |")


def main(argv: list[str]) -> int:
    """Run ``argv`` while sampling (or report ``--report FILE``); the command's exit code."""
    if argv[:1] == ["--report"] and len(argv) == 2:
        report(json.loads(Path(argv[1]).read_text()))
        return 0
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    seen: dict[tuple[str, str], list] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(stop, seen), daemon=True)
    sampler.start()
    t0 = time.monotonic()
    code = subprocess.call(argv)
    stop.set()
    sampler.join()
    rows = [[cmd, ticks - base] for (pid, _), (cmd, ticks, base) in seen.items()]
    rows = [r for r in rows if r[1] > 0]
    Path("cpu.json").write_text(json.dumps(rows))
    print(f"\n{' '.join(argv)}: exit {code} after {time.monotonic() - t0:.0f} s")
    report(rows)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
