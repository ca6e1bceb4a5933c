"""SIGTERM or SIGINT at any instant of `spotbook run`'s start-up exits with the documented
code (75), and leaves the run store absent (the same command starts the run) or complete
(resume finishes it) — never half-made (issue 61: 0.15 s in, the codes were Python's 130
and 143).

The instants are chosen from the process's own progress, never a sleep: the moment it
catches SIGTERM (its first statement: /proc's SigCgt), the store's folder, run.json, the
attempt's record and the kernel's process appearing, each followed by a number of the
runner's own CPU ticks (or the next milestone, whichever comes first). Before its first
statement a signal is Python's own default (the interpreter has not reached spotbook).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import cli, kill, start_cli, wait_for, write_notebook

pytestmark = pytest.mark.slow


def _caught(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(
        int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt")
    )
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def _ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 1 << 30
    return int(fields[11]) + int(fields[12])  # utime + stime


def _children(pid: int) -> bool:
    try:
        return bool(Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    except OSError:
        return False


def _milestones(pid: int, rd: Path) -> list[Callable[[], bool]]:
    return [
        lambda: _caught(pid),
        rd.exists,
        (rd / "run.json").exists,
        (rd / "attempts" / "0001.json").exists,
        lambda: _children(pid),
    ]


INSTANTS = [(m, t) for m in range(5) for t in (0, 2)] * 2  # 20: each signal at each point


def test_a_signal_in_the_first_instants_exits_75_and_leaves_no_half_made_store(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"  # the first cell waits for it: the run is still starting
    hold = f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)"
    write_notebook(tmp_path / "nb.ipynb", hold, "print('done')")
    seen: list[tuple[str, int, int, str]] = []
    for n, (milestone, ticks) in enumerate(INSTANTS):
        sig = signal.SIGTERM if n < len(INSTANTS) // 2 else signal.SIGINT
        rd = tmp_path / f"rd{n}"
        args = ["run", "nb.ipynb", f"out{n}.ipynb", "--run-dir", rd.name, "--grace", "0"]
        gate.unlink(missing_ok=True)
        proc = start_cli(*args, cwd=tmp_path)
        marks = _milestones(proc.pid, rd)
        wait_for(marks[milestone], 120, f"milestone {milestone}", proc)
        at = _ticks(proc.pid) + ticks
        nxt = marks[milestone + 1] if milestone + 1 < len(marks) else (lambda: False)
        while _ticks(proc.pid) < at and not nxt() and proc.poll() is None:
            time.sleep(0.001)  # a poll of the process's own progress
        code, err = kill(proc, sig)
        gate.touch()
        state = "absent" if not rd.exists() else "present"
        seen.append((sig.name, milestone, code, state))
        assert code == 75, (sig.name, milestone, ticks, code, err[-2000:])
        assert "Traceback" not in err, err
        if state == "present":  # complete and resumable: resume finishes it
            r = cli("resume", rd.name, cwd=tmp_path, timeout=300)
        else:  # the same command starts the run
            r = cli(*args, cwd=tmp_path, timeout=300)
        assert r.returncode == 0, r.stderr
        assert "done" in (tmp_path / f"out{n}.ipynb").read_text()
    # every instant was met: each milestone, under each signal
    assert {(name, m) for name, m, *_ in seen} == {
        (s.name, m) for s in (signal.SIGTERM, signal.SIGINT) for m in range(5)
    }
