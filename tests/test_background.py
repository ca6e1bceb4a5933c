"""Background snapshots: written by a fork of the kernel while the notebook goes on.

A kill while the copy writes loses only the records held behind it (their cells run
again, files given back), never a committed cell; where forking is unsafe the snapshot is
taken synchronously and the attempt record says why."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil

from .conftest import cells_committed, cli, start_cli, wait_for, write_notebook


def _gate(path: Path) -> str:
    return f"import os, time\nwhile not os.path.exists({str(path)!r}):\n    time.sleep(0.01)"


def _writer(runner: psutil.Process) -> psutil.Process | None:
    """The kernel's copy writing a snapshot: a child of the runner's kernel."""
    for kernel in runner.children():
        for child in kernel.children():
            if child.status() != psutil.STATUS_ZOMBIE:  # an earlier copy, not yet reaped
                return child
    return None


def test_kill_while_a_background_snapshot_is_written(tmp_path: Path) -> None:
    release, go, side = tmp_path / "release", tmp_path / "go", tmp_path / "side.txt"
    inside = tmp_path / "pickling"
    cells = (
        "import numpy as np\nstate = np.arange(2_000_000)",
        # pickling this blocks until the test says: the copy is caught mid-write
        "class Slow:\n    def __reduce__(self):\n"
        f"        open({str(inside)!r}, 'w').close()\n"
        + "\n".join("        " + line for line in _gate(release).splitlines())
        + "\n        return (Slow, ())\n"
        f"slow = Slow()\nwith open({str(side)!r}, 'a') as fh:\n    fh.write('cell 1\\n')",
        _gate(go) + "\nstate = state + 1",
        "print(int(state.sum()), open(" + repr(str(side)) + ").read().count('cell 1'))",
    )
    write_notebook(tmp_path / "nb.ipynb", *cells)
    proc = start_cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", "--snapshot", "every-cell",
        cwd=tmp_path,
    )  # fmt: skip
    runner = psutil.Process(proc.pid)
    # cell 0 is committed (its snapshot is); cell 1's record waits for its own snapshot,
    # which the kernel's copy is writing
    wait_for(inside.exists, what="the kernel's copy pickling cell 1's state")
    writer = wait_for(lambda: _writer(runner), what="the kernel's copy writing the snapshot")
    assert cells_committed(tmp_path / "rd") == 1
    # the node goes away: runner, kernel and the copy, without notice
    everyone = [runner, *runner.children(recursive=True)]
    assert writer in everyone
    for p in everyone:
        p.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    psutil.wait_procs(everyone, timeout=30)
    snaps = sorted(p.name for p in (tmp_path / "rd" / "state" / "snap").iterdir())
    assert len(snaps) == 1 and snaps[0].startswith("00000-"), snaps  # only cell 0's
    release.touch()
    go.touch()
    r = cli("resume", "rd", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    status = json.loads(cli("status", "rd", "--json", cwd=tmp_path).stdout)
    first, second = status["attempts"]
    assert first["outcome"] == "killed" and second["resumed_from"] == 1
    assert second["replayed"] == [] and second["background_snapshots"] >= 1
    # cell 1 ran again, given back the file as it was before it first ran
    out = json.loads((tmp_path / "out.ipynb").read_text())
    assert "".join(out["cells"][3]["outputs"][0]["text"]) == f"{sum(range(1, 2_000_001))} 1\n"
    assert side.read_text() == "cell 1\n"


def test_unsafe_to_fork_falls_back_to_synchronous_and_says_why(tmp_path: Path) -> None:
    write_notebook(
        tmp_path / "t.ipynb",
        "import threading\nstop = threading.Event()\n"
        "waiter = threading.Thread(target=stop.wait, name='waiter', daemon=True)\n"
        "waiter.start()\nx = 1",
        "y = x + 1",
        # joined: the thread is gone before the snapshot after this cell looks for it
        # (set() alone left it a moment to end, which a loaded machine could outlast)
        "stop.set()\nwaiter.join()\nz = y + 1",
        "print(z)",
    )
    r = cli(
        "run", "t.ipynb", "o.ipynb", "--run-dir", "rd", "--snapshot", "every-cell", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    (attempt,) = json.loads(cli("status", "rd", "--json", cwd=tmp_path).stdout)["attempts"]
    assert "threads started by the notebook are running (waiter)" in attempt["snapshots_sync"]
    # once the thread is gone the next snapshot goes to the background again
    assert attempt["background_snapshots"] == 1
    assert len(list((tmp_path / "rd" / "state" / "snap").iterdir())) == 3
    # --no-snapshot-background: every snapshot synchronous, none in the background
    r = cli(
        "run", "t.ipynb", "o2.ipynb", "--run-dir", "rd2", "--snapshot", "every-cell",
        "--no-snapshot-background", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (attempt,) = json.loads(cli("status", "rd2", "--json", cwd=tmp_path).stdout)["attempts"]
    assert "background_snapshots" not in attempt
    assert len(list((tmp_path / "rd2" / "state" / "snap").iterdir())) == 3


def test_a_display_updated_while_its_cells_record_waits_for_the_snapshot(
    tmp_path: Path,
) -> None:
    """Cell 0's record is held behind its snapshot, whose copy cannot finish before cell 2
    runs, and cell 1 (no snapshot due after it) updates cell 0's display: the update must
    reach the record that waits, not be lost when it is committed."""
    release = tmp_path / "release"
    # the 0.6 s sleep is cell 0's work (it makes a snapshot due under auto at 0.5 s)
    write_notebook(
        tmp_path / "d.ipynb",
        "import time\nfrom IPython.display import display\n"
        "class Slow:\n    def __reduce__(self):\n"
        + "\n".join("        " + line for line in _gate(release).splitlines())
        + "\n        return (Slow, ())\n"
        "slow = Slow()\nhandle = display('first', display_id='d')\ntime.sleep(0.6)",
        "handle.update('second')",
        f"open({str(release)!r}, 'w').close()",
        "x = 1",
    )
    r = cli(
        "run", "d.ipynb", "o.ipynb", "--run-dir", "rd", "--snapshot", "auto",
        "--snapshot-interval", "0.5", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (attempt,) = json.loads(cli("status", "rd", "--json", cwd=tmp_path).stdout)["attempts"]
    assert attempt["background_snapshots"] == 1
    out = json.loads((tmp_path / "o.ipynb").read_text())
    assert out["cells"][0]["outputs"][0]["data"]["text/plain"] == "'second'"


def test_under_auto_the_cells_never_wait_for_a_snapshot_being_written(tmp_path: Path) -> None:
    """A snapshot falls due after cell 1 while cell 0's is still being written (its copy
    cannot finish before cell 2 runs): under auto, cell 2 runs at once (waiting would
    never end) and a later boundary takes the next snapshot."""
    release = tmp_path / "release"
    # the 0.6 s sleeps are the cells' work (under auto with a 0.5 s interval each makes a
    # snapshot due); the order of events is fixed by the release file, not by them
    write_notebook(
        tmp_path / "w.ipynb",
        "import time\nclass Slow:\n    def __reduce__(self):\n"
        + "\n".join("        " + line for line in _gate(release).splitlines())
        + "\n        return (Slow, ())\nslow = Slow()\ntime.sleep(0.6)",
        "time.sleep(0.6)\ny = 1",
        f"open({str(release)!r}, 'w').close()\ntime.sleep(0.6)",
        "time.sleep(0.6)\nz = y + 1",
        "print(z)",
    )
    r = cli(
        "run", "w.ipynb", "o.ipynb", "--run-dir", "rd", "--snapshot", "auto",
        "--snapshot-interval", "0.5", cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (attempt,) = json.loads(cli("status", "rd", "--json", cwd=tmp_path).stdout)["attempts"]
    # no assertion on the pause's length (a machine's speed): had cell 2 waited for cell 0's
    # copy, which waits for the release file cell 2 writes, the run would never have ended
    assert attempt["background_snapshots"] >= 2
    snaps = sorted(p.name[:5] for p in (tmp_path / "rd" / "state" / "snap").iterdir())
    assert snaps[0] == "00000" and "00001" not in snaps, snaps  # after cell 1: deferred
    out = json.loads((tmp_path / "o.ipynb").read_text())
    assert "".join(out["cells"][4]["outputs"][0]["text"]) == "2\n"
