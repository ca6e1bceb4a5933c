"""A run on this machine, from a second terminal: `spotbook logs [-f]` follows its cells'
outputs and `spotbook cancel` stops it as Ctrl-C would, but never signals a process that
is not that run's runner. Real runners, real kernels, real signals.

These tests stop runs; they do not resume them (the resume after a user's stop, also on a
wiped node, is tests/test_faults.py's Ctrl-C test and tests/test_node_loss.py's subject)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spotbook.store.runstore import RunStore

from .conftest import cli, kill, start_cli, wait_for, write_notebook

pytestmark = pytest.mark.slow

GATED = (
    "print('first cell')",
    "import os, time\n"
    "open('started', 'w').close()\n"
    "while not os.path.exists('go'):\n"
    "    time.sleep(0.01)\n"
    "print('second cell')",
    "print('third cell')",
)


def _gated(tmp_path: Path) -> subprocess.Popen[str]:
    write_notebook(tmp_path / "nb.ipynb", *GATED)
    proc = start_cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", "--grace", "1", cwd=tmp_path
    )
    wait_for(lambda: (tmp_path / "started").exists(), timeout=120, what="cell 1 to start")
    return proc


def test_logs_then_cancel_a_run_on_this_machine(tmp_path: Path) -> None:
    import spotbook

    proc = _gated(tmp_path)
    try:
        r = cli("logs", "rd", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[:3] == [
            f"Executing Cell {'1':-<40}",  # papermill's --log-output separators
            "first cell",
            f"Ending Cell {'1':-<43}",
        ], r.stdout
        # the command prints what the library call yields
        events = list(spotbook.stream_logs(str(tmp_path / "rd")))
        assert {e.kind for e in events} == {"line"}, events
        assert "".join(e.text for e in events) == r.stdout
        # the dashboard's call shows the same lines, from the sealed records: what the
        # store's unsealed output.ipynb says (changed by a writer of the store) is not shown
        out = tmp_path / "rd" / "output.ipynb"
        out.write_text(out.read_text().replace("first cell", "forged"))
        assert spotbook.run_logs(str(tmp_path / "rd")) == r.stdout.splitlines()
        r = cli("cancel", "rd", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "as Ctrl-C would: 1 of 3 cells saved" in r.stderr, r.stderr
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            kill(proc)
    assert proc.returncode == 75, err
    doc = json.loads(cli("status", "rd", "--json", cwd=tmp_path).stdout)
    assert doc["attempts"][-1]["outcome"] == "stopped"  # the user's stop
    assert doc["preemptions"] == 0
    r = cli("cancel", "rd", cwd=tmp_path)  # nothing runs now
    assert r.returncode == 2 and "is not running" in r.stderr, r.stderr


def test_the_library_call_cancels_a_run_on_this_machine_as_the_command_does(
    tmp_path: Path,
) -> None:
    # `spotbook cancel` renders what spotbook.cancel_run did: the same call stops a local
    # run (there is no Job to delete) and says how far it got
    import spotbook

    proc = _gated(tmp_path)
    try:
        done = spotbook.cancel_run(str(tmp_path / "rd"))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            kill(proc)
    assert proc.returncode == 75, err
    assert (done.job, done.stopped, done.cells_done, done.cells_total) == (None, True, 1, 3)
    assert done.url == RunStore(str(tmp_path / "rd")).url and done.pid is not None


def test_logs_follow_ends_with_the_run(tmp_path: Path) -> None:
    proc = _gated(tmp_path)
    follower = start_cli("logs", "-f", "rd", cwd=tmp_path)
    try:
        assert follower.stdout is not None
        out = follower.stdout.readline()  # cell 0's record is there: it shows at once
        assert out.startswith("Executing Cell 1---"), out
        (tmp_path / "go").write_text("")
        out += follower.stdout.read()  # to its end: logs -f ends when the run ends
        _, err = follower.communicate(timeout=60)  # and closes its pipes
        proc.communicate(timeout=120)
        assert proc.returncode == 0
    finally:
        for p in (proc, follower):
            if p.poll() is None:
                kill(p)
    assert follower.returncode == 0, err
    assert out.index("first cell") < out.index("second cell") < out.index("third cell"), out
    assert out.rstrip().endswith(f"Ending Cell {'3':-<43}"), out


def test_cancel_never_signals_a_process_that_is_not_the_runner(tmp_path: Path) -> None:
    """The runner is killed without notice and its pid goes to another process (here: its
    attempt record, sealed with this machine's key, names a live `sleep`): cancel refuses,
    exit 2, and the other process lives on."""
    proc = _gated(tmp_path)
    code, _ = kill(proc)  # SIGKILL: the record still says "running"
    assert code == -signal.SIGKILL
    (tmp_path / "go").write_text("")  # the orphaned kernel finishes its cell
    # an unrelated process that lives until the test kills it (the sleep decides nothing)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        store = RunStore(str(tmp_path / "rd"))
        store.unseal()
        record = store.attempts()[-1]
        assert record["outcome"] == "running"
        store.update_attempt(record["attempt"], {**record, "pid": other.pid})
        r = cli("cancel", "rd", cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert f"(pid {other.pid}) is not its runner" in r.stderr, r.stderr
        assert other.poll() is None  # never signalled
        r = cli("logs", "rd", cwd=tmp_path)  # what was saved is still there to read
        assert r.returncode == 0 and "first cell" in r.stdout, r.stderr
    finally:
        other.kill()
        other.wait()


def test_cancel_refuses_a_store_whose_spec_was_changed(tmp_path: Path) -> None:
    """The run's id, which names the Job to delete, is read from a checked spec only: a
    spec that lost it is refused (exit 2, no traceback), not a crash."""
    write_notebook(tmp_path / "nb.ipynb", "print('one')")
    assert cli("run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", cwd=tmp_path).returncode == 0
    doc = json.loads((tmp_path / "rd" / "run.json").read_text())
    del doc["spec"]["run_id"]
    (tmp_path / "rd" / "run.json").write_text(json.dumps(doc))
    r = cli("cancel", "rd", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "no valid run spec" in r.stderr and "Traceback" not in r.stderr, r.stderr
