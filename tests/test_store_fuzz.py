"""Whatever a writer of the run store puts there, the commands that read it exit 0 or 2,
never 3 with a traceback, and never hang.

A real run, killed after its snapshots and resumed (two attempts, records, snapshot
manifests, blobs, its input and output), is the template. tests/store_fuzz.py mutates it
object by object — each field's type and value, sizes past every read limit, nesting,
encodings, the object made a FIFO, a directory or a link to /dev/zero — and runs
``status``, ``status --json``, ``cost``, ``report``, ``logs`` and ``resume`` on each
mutant, each under a 30 s alarm that counts as a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import cells_committed, cli, kill, start_cli, wait_for, write_notebook

pytestmark = pytest.mark.slow
SEED = int(os.environ.get("SPOTBOOK_TEST_SEED", "20261202"))


def _template(work: Path, *, finished: bool = True) -> Path:
    """A run killed after two cells' snapshots, then resumed to the end (``finished``),
    or left killed: its resume restores the state and runs the last two cells."""
    gate = work / "gate"
    write_notebook(
        work / "nb.ipynb",
        "import numpy as np\nx = np.arange(1000.0)",
        "y = x * 2" + ("\nopen('made.txt', 'w').write('made')" if finished else ""),
        f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)",
        "print(float(y.sum()))",
    )
    proc = start_cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", "--snapshot", "every-cell", cwd=work
    )
    wait_for(lambda: cells_committed(work / "rd") >= 2, timeout=120, what="2 cells", proc=proc)
    kill(proc)
    gate.touch()
    if finished:
        r = cli("resume", "rd", cwd=work)
        assert r.returncode == 0, r.stderr
    return work / "rd"


def _fuzz(template: Path, work: Path, *only: str) -> list[dict]:
    cases = work / "cases"
    cases.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "tests.store_fuzz", str(template), str(cases), str(SEED), *only],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_an_unfinished_runs_store_never_crashes_or_hangs_its_resume(tmp_path: Path) -> None:
    """Where resume has work to do, it reads the records, snapshot manifests and blobs it
    restores from: every mutant, resumed (an accepted one runs the last cells in a kernel;
    the other commands read it as they read a finished one's, above)."""
    rows = _fuzz(_template(tmp_path, finished=False), tmp_path, "resume")
    resumed = [row for row in rows if row["argv"] == ["resume"]]
    assert len(resumed) == len(rows) >= 80 and resumed[0]["mutation"] == "none", resumed[:1]
    assert resumed[0]["code"] == 0, resumed[0]  # the control resumes to the end
    bad = [row for row in rows if row["hung"] or row["traceback"] or row["code"] not in (0, 2)]
    assert not bad, json.dumps(bad[:5], indent=1)
    refused = {row["object"] for row in resumed if row["code"] == 2}
    assert "run.json" in refused and any(o.startswith("state/") for o in refused), refused


def test_no_store_content_crashes_or_hangs_a_command(tmp_path: Path) -> None:
    rows = _fuzz(_template(tmp_path), tmp_path)
    objects = {row["object"] for row in rows}
    assert {"run.json", "attempts/0002.json", "cells/a0001.jsonl", "input.ipynb"} <= objects
    assert any(o.startswith("state/blobs/") for o in objects)
    assert any(o.startswith("state/snap/") for o in objects)
    # the control: an unchanged copy reads as the run it is
    control = [row for row in rows if row["mutation"] == "none"]
    assert control and all(row["code"] == 0 for row in control), control[:3]
    bad = [row for row in rows if row["hung"] or row["traceback"] or row["code"] not in (0, 2)]
    assert not bad, json.dumps(bad[:5], indent=1)
    # what resume trusts is sealed: any change to run.json, input.ipynb or an attempt
    # record is refused (the records and snapshots are checked when a resume uses them);
    # run.json's status, message, attempt count and time change as the run goes, outside
    # the seal: a value of the wrong type is refused, one of the right type is used
    unsealed = {f"field {name}" for name in ("status", "message", "attempt", "updated")}
    sealed = [
        row
        for row in rows
        if row["argv"] == ["resume"]
        and row["mutation"] not in {"none", *unsealed}
        and (row["object"] in ("run.json", "input.ipynb") or row["object"].startswith("attempts/"))
    ]
    assert len(sealed) >= 30 and all(row["code"] == 2 for row in sealed), [
        (row["object"], row["mutation"], row["stderr"][-200:]) for row in sealed if row["code"] != 2
    ]
