"""Faults outside the notebook's control, on real kernels: the kernel dying after the
termination notice, while a snapshot is taken and while the state is restored. Each ends
with its documented exit code and a message that says what died and when."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotbook.attempt.snapshots import STAGED_ENV
from spotbook.store.backends import RETRY_TRIES
from spotbook.store.runstore import RunStore

from .conftest import Place, cli, kill, on, start_cli, wait_for, write_notebook
from .servers import Storage

KILLED_AFTER_NOTICE = (
    "import os, signal, time\n"
    "if not os.path.exists('go'):  # the first time: die once the notice has come\n"
    "    open('started', 'w').close()\n"
    "    while not os.path.exists(os.environ['SPOTBOOK_NOTICE_FILE']):\n"
    "        time.sleep(0.01)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)"
)


def _run_every_cell(
    tmp: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`spotbook run nb.ipynb out.ipynb --run-dir rd --snapshot every-cell` in ``tmp``."""
    r: subprocess.CompletedProcess[str] = cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", "--snapshot", "every-cell", *extra,
        cwd=tmp, env=env,
    )  # fmt: skip
    return r


def _status(tmp: Path) -> dict:
    r = cli("status", "rd", "--json", cwd=tmp)
    assert r.returncode == 0, r.stderr
    doc: dict = json.loads(r.stdout)
    return doc


def test_kernel_dying_after_the_notice_is_a_preemption(tmp_path: Path) -> None:
    """The runtime may kill the process group when the grace runs out: exit 75, not 1."""
    write_notebook(
        tmp_path / "nb.ipynb",
        "x = 1",
        KILLED_AFTER_NOTICE,
        "print(x)",
    )
    proc = start_cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", "--grace", "60", cwd=tmp_path
    )
    wait_for(lambda: (tmp_path / "started").exists(), timeout=120, what="the cell to start")
    code, err = kill(proc, signal.SIGTERM)
    assert code == 75, err
    assert "Traceback" not in err and "kernel died while running" not in err
    doc = _status(tmp_path)
    assert doc["status"] == "interrupted"
    assert doc["attempts"][0]["outcome"] == "preempted"
    (tmp_path / "go").write_text("")
    r = cli("resume", "rd", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _status(tmp_path)["status"] == "succeeded"


def test_kernel_dying_in_a_snapshot_says_so(tmp_path: Path) -> None:
    """Pickling the state kills the process that pickles (as running out of memory
    would). Synchronously that is the kernel: exit 138, named, never an internal error.
    In the background it is the kernel's copy: the notebook goes on, snapshots off, and
    the attempt says why."""
    write_notebook(
        tmp_path / "nb.ipynb",
        "import os\nclass Boom:\n    def __reduce__(self):\n        os._exit(9)\nb = Boom()",
        "y = 2",
        "print(y)",
    )
    r = _run_every_cell(tmp_path)
    assert r.returncode == 0, r.stderr
    (attempt,) = _status(tmp_path)["attempts"]
    assert "the snapshot process ended without writing the snapshot" in attempt["snapshots_off"]
    assert not (tmp_path / "rd" / "state" / "snap").exists() or not list(
        (tmp_path / "rd" / "state" / "snap").iterdir()
    )
    shutil.rmtree(tmp_path / "rd")
    r = _run_every_cell(tmp_path, "--no-snapshot-background")
    assert r.returncode == 138, r.stderr
    assert "the kernel died while taking the snapshot after cell 0" in r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert _status(tmp_path)["status"] == "failed"
    # staged, it is taken in the kernel, asked with cell 0's own request: the cell had
    # ended, so it is the snapshot that is named, and the cell is not recorded as failed
    shutil.rmtree(tmp_path / "rd")
    r = _run_every_cell(tmp_path, env={STAGED_ENV: "1"})
    assert r.returncode == 138, r.stderr
    assert "the kernel died while taking the snapshot after cell 0" in r.stderr
    assert "while running cell" not in r.stderr and "Traceback" not in r.stderr
    assert _status(tmp_path)["status"] == "failed"
    assert RunStore(str(tmp_path / "rd")).cell_records() == {}  # no record of cell 0


_BOMB = (
    "import os\nclass Bomb:\n    def __reduce__(self):\n        return (os._exit, (9,))\nb = Bomb()"
)


def test_kernel_dying_in_a_restore_says_so(tmp_path: Path) -> None:
    """Unpickling the state kills the kernel: exit 138, named; the store is kept. (A
    synchronous snapshot: a background one loads each new type back when it is taken,
    see the next test.)"""
    write_notebook(tmp_path / "nb.ipynb", _BOMB, "y = 2", "assert os.path.exists('go')")
    r = _run_every_cell(tmp_path, "--no-snapshot-background")
    assert r.returncode == 1 and "AssertionError" in r.stderr, r.stderr
    (tmp_path / "go").write_text("")
    r = cli("resume", "rd", cwd=tmp_path)
    assert r.returncode == 138, r.stderr
    assert "the kernel died while restoring the state before cell 2" in r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr


def test_an_object_whose_load_ends_the_process_is_left_out_of_a_background_snapshot(
    tmp_path: Path,
) -> None:
    """The background snapshot's load check loads it back in a process of its own, which
    it ends: that variable is left out (rebuilt by its cell on resume), the snapshot is
    still written, and the resume goes on."""
    write_notebook(tmp_path / "nb.ipynb", _BOMB, "y = 2", "assert os.path.exists('go')")
    r = _run_every_cell(tmp_path)
    assert r.returncode == 1 and "AssertionError" in r.stderr, r.stderr
    (attempt,) = _status(tmp_path)["attempts"]
    assert "snapshots_off" not in attempt
    (tmp_path / "go").write_text("")
    r = cli("resume", "rd", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    last = _status(tmp_path)["attempts"][-1]
    assert "b" in last["fidelity"]["not_restored_unused"]  # no later cell reads it
    assert not last.get("files_restored", {}).get("files")


def test_restart_discards_the_old_runs_files_and_attempts(tmp_path: Path) -> None:
    """--restart starts over: the old checkpoint files are gone, the old attempts are not
    counted as preemptions nor against the budget, and status shows the new run only."""
    write_notebook(
        tmp_path / "nb.ipynb",
        "import os, pathlib\nck = pathlib.Path(os.environ['SPOTBOOK_CHECKPOINT_DIR'], 'ck')\n"
        "print('found' if ck.exists() else 'fresh')\nck.write_text('old')",
        "assert os.path.exists('go')",
    )
    r = cli("run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    (tmp_path / "go").write_text("")
    r = cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", "--restart",
        "--max-preemptions", "0", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "out.ipynb").read_text())
    assert "fresh" in json.dumps(out["cells"][0]["outputs"])
    doc = _status(tmp_path)
    assert doc["status"] == "succeeded" and doc["preemptions"] == 0
    assert [a["outcome"] for a in doc["attempts"]] == ["completed"]


def test_a_notebook_with_nothing_to_run_succeeds(tmp_path: Path) -> None:
    import nbformat

    for name, cells in (("empty", []), ("prose", [nbformat.v4.new_markdown_cell("# notes")])):
        nb = nbformat.v4.new_notebook(cells=cells)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "P", "language": "python"}
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
        r = cli("run", f"{name}.ipynb", "out.ipynb", "--run-dir", "rd", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert _status(tmp_path)["status"] == "succeeded", name
        shutil.rmtree(tmp_path / "rd")


def test_a_snapshot_that_cannot_be_written_stops_with_progress_kept(tmp_path: Path) -> None:
    """The kernel cannot write the snapshot (its file-size limit stands for a full disk):
    retried once, then exit 3 with what failed; a resume goes on from the last cell."""
    write_notebook(
        tmp_path / "nb.ipynb",
        "x = 1",
        "import os, resource\n"
        "if os.path.exists('full'):  # the disk is full while this file exists\n"
        "    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))\n"
        "big = bytes(4 << 20)",
        "print(x, len(big))",
    )
    (tmp_path / "full").write_text("")
    r = _run_every_cell(tmp_path)
    assert r.returncode == 3, r.stderr
    assert "the snapshot after cell 1 could not be written" in r.stderr
    assert "progress up to cell 0 is saved" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "full").unlink()  # space was freed
    r = cli("resume", "rd", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "out.ipynb").read_text())
    assert "1 4194304" in json.dumps(out["cells"][2]["outputs"])


def test_state_that_cannot_be_pickled_turns_snapshots_off_visibly(tmp_path: Path) -> None:
    """Not a storage fault: the run goes on, and status says snapshots are off and why."""
    write_notebook(
        tmp_path / "nb.ipynb",
        "import spotbook.kernel.session as s\n"
        "def broken(*a, **k):\n    raise ValueError('cannot snapshot')\n"
        "s.snapshot = broken",
        "y = 2",
        "print(y)",
    )
    r = _run_every_cell(tmp_path)
    assert r.returncode == 0, r.stderr
    assert "snapshots are off" in r.stderr
    off = _status(tmp_path)["attempts"][0]["snapshots_off"]
    assert "cannot snapshot" in off
    text = cli("status", "rd", cwd=tmp_path).stdout
    assert "snapshots off:" in text


@pytest.mark.parametrize("grace", ["60", "0"], ids=["cell-finishes", "cell-interrupted"])
def test_a_superseded_attempt_writes_nothing_on_its_way_out(tmp_path: Path, grace: str) -> None:
    """SIGTERM reaches an attempt after a newer one claimed the run: it leaves run.json,
    output.ipynb and OUTPUT to the newer attempt, and exits 3 (superseded)."""
    write_notebook(
        tmp_path / "nb.ipynb",
        "x = 1",
        "import os, time\nopen('started', 'w').close()\n"
        "while not os.path.exists(os.environ['SPOTBOOK_NOTICE_FILE']):\n    time.sleep(0.01)\n"
        "while os.environ.get('HOLD'):  # outlive the grace: interrupted\n    time.sleep(0.01)",
    )
    proc = start_cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", "--grace", grace, cwd=tmp_path,
        env={"HOLD": "1"} if grace == "0" else {},
    )  # fmt: skip
    wait_for(lambda: (tmp_path / "started").exists(), timeout=120, what="the cell to start")
    from spotbook.store.runstore import RunStore

    store = RunStore(str(tmp_path / "rd"))
    assert store.claim_attempt({"outcome": "running", "resumed_from": 1}) == 2  # the newer one
    before = {n: store.read(n) for n in ("run.json", "output.ipynb")}
    output = (tmp_path / "out.ipynb").read_bytes()  # as it was written while cells ran
    code, err = kill(proc, signal.SIGTERM)
    assert code == 3 and "newer attempt" in err, err
    assert {n: store.read(n) for n in before} == before
    assert (tmp_path / "out.ipynb").read_bytes() == output


def test_widget_state_reaches_the_output_notebook(tmp_path: Path) -> None:
    """As nbclient writes it: metadata.widgets holds the state of the widgets shown."""
    write_notebook(
        tmp_path / "nb.ipynb",
        "import ipywidgets\nw = ipywidgets.IntSlider(value=7, description='lr')\ndisplay(w)",
        "w.value = 9",
    )
    r = cli("run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "out.ipynb").read_text())
    state = out["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    sliders = [m["state"] for m in state.values() if m["model_name"] == "IntSliderModel"]
    assert [(s["description"], s["value"]) for s in sliders] == [("lr", 9)]


def test_storage_retries_stop_at_the_deadline() -> None:
    """After a notice the store gets a deadline: a retry that would sleep past it is not
    made, and the last error is raised (the time to exit stays bounded)."""
    import time

    from spotbook.store.backends import with_retries

    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        raise ConnectionResetError("the store went away")

    with pytest.raises(ConnectionResetError):
        with_retries(flaky, "write x", tries=3)
    assert len(calls) == 3  # without a deadline: every try
    calls.clear()
    with pytest.raises(ConnectionResetError):
        with_retries(flaky, "write x", tries=3, deadline=time.monotonic())
    assert len(calls) == 1  # no time left: no retry


def test_partial_files_a_killed_writer_left_are_removed(tmp_path: Path) -> None:
    """A kill mid-write leaves ``X.tmp-PID-N`` files; the next attempt removes those of
    dead processes (a live writer's are left alone, and so is what no writer makes)."""
    import os

    write_notebook(tmp_path / "nb.ipynb", "x = 1", "import os\nassert os.path.exists('go')")
    assert cli("run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", cwd=tmp_path).returncode == 1
    blobs = tmp_path / "rd" / "state" / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs
    stale = [blobs / f"abc.tmp-{dead.pid}-1", tmp_path / "rd" / "cells" / f"x.tmp-{dead.pid}-2"]
    live = blobs / f"def.tmp-{os.getpid()}-1"
    for p in (*stale, live):
        p.write_bytes(b"half")
    # named like partials but no writer's: a directory (its unlink raised
    # IsADirectoryError after the attempt was claimed, left "running") and a FIFO
    odd_dir, odd_fifo = blobs / f"d.tmp-{dead.pid}-3", blobs / f"f.tmp-{dead.pid}-4"
    odd_dir.mkdir()
    (odd_dir / "inside").write_bytes(b"x")
    os.mkfifo(odd_fifo)
    (tmp_path / "go").write_text("")
    r = cli("resume", "rd", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not any(p.exists() for p in stale) and live.exists()
    assert (odd_dir / "inside").exists() and odd_fifo.exists()  # left as they were


GATED = (
    "x = 1",
    "import os, time\n"
    "open('started', 'w').close()\n"
    "while not os.path.exists('go'):\n"
    "    time.sleep(0.01)\n"
    "y = x + 1",
    "print(x, y)",
)


def _gated_run(work: Path, place: Place, *extra: str) -> subprocess.Popen[str]:
    """Start GATED on ``place`` and wait until cell 0 is committed and cell 1 waits."""
    write_notebook(work / "nb.ipynb", *GATED)
    proc = start_cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", place.rd, *extra, cwd=work, env=place.env
    )
    wait_for(lambda: (work / "started").exists(), timeout=120, what="cell 1 to start")
    wait_for(lambda: place.committed() >= 1, timeout=60, what="cell 0's record")
    return proc


def _resumes_to_the_end(work: Path, place: Place) -> None:
    (work / "go").write_text("")
    r = cli("resume", place.rd, cwd=work, env=place.env)
    assert r.returncode == 0, r.stderr
    out = json.loads((work / "out.ipynb").read_text())
    assert "1 2" in json.dumps(out["cells"][2]["outputs"])


@on("s3", "gs")
def test_a_store_outage_stops_the_run_with_progress_kept(
    work: Path, place: Place, storages: dict[str, Storage]
) -> None:
    """The store answers 503 to everything: each write is tried RETRY_TRIES times by
    spotbook, one request a try (the client libraries' own retries are off, so an outage
    costs seconds, not minutes), then exit 3; once the store is back, a resume goes on."""
    st = storages[place.kind]
    proc = _gated_run(work, place)
    outage = Path(f"{st.stats_file}.outage")
    before = st.faults()
    outage.write_text("503")
    try:
        (work / "go").write_text("")
        _, err = proc.communicate(timeout=600)
        during = st.faults()
    finally:
        outage.unlink()
    assert proc.returncode == 3, err
    assert "Traceback" not in err and place.rd.split("://")[0] in err
    failed = during["failed"] - before["failed"]
    ops = err.count("; retry 1 in ")  # each operation's first retry is logged once
    # at most two requests a try (a lookup may ask for the object, then for a listing);
    # with the clients' own retries on, each try made 5 (s3fs) or 6 (gcsfs) more
    assert ops >= 1 and failed <= 2 * ops * RETRY_TRIES, (ops, failed, err)
    (work / "go").unlink()
    (work / "started").unlink()
    _resumes_to_the_end(work, place)


@on("s3")
def test_a_store_that_hangs_after_the_notice_cannot_hold_the_exit(
    work: Path, place: Place, storages: dict[str, Storage]
) -> None:
    """After SIGTERM the store stops answering (requests are held, as by a network that
    drops packets): the exit watchdog ends the process with 75 and says why, instead of
    waiting for the client library's read timeout; a resume goes on from cell 0's record."""
    st = storages[place.kind]
    proc = _gated_run(work, place, "--grace", "1")
    outage = Path(f"{st.stats_file}.outage")
    outage.write_text("hang")
    try:
        code, err = kill(proc, signal.SIGTERM)
        held = st.faults()["held"]
    finally:
        outage.unlink()
    assert code == 75, err
    assert held >= 1  # the store really was not answering
    assert "does not answer; stopping now" in err and "spotbook resume" in err, err
    _resumes_to_the_end(work, place)


@on("s3")
def test_a_notice_while_a_store_request_hangs_still_bounds_the_exit(
    work: Path, place: Place, storages: dict[str, Storage]
) -> None:
    """The store stops answering first, and the notice comes while the runner waits on it
    (cell 0's record held): the event loop is stuck in that request, yet the signal itself
    arms the exit watchdog, so the process ends with 75 and says why."""
    st = storages[place.kind]
    write_notebook(
        work / "nb.ipynb",
        "import os, time\n"
        "open('started0', 'w').close()\n"
        "while not os.path.exists('go0'):\n"
        "    time.sleep(0.01)\n"
        "x = 1",
        *GATED[1:],
    )
    proc = start_cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", place.rd, "--grace", "1",
        cwd=work, env=place.env,
    )  # fmt: skip
    wait_for(lambda: (work / "started0").exists(), timeout=120, what="cell 0 to start")
    outage = Path(f"{st.stats_file}.outage")
    held = st.faults()["held"]
    outage.write_text("hang")
    try:
        (work / "go0").write_text("")
        wait_for(lambda: st.faults()["held"] > held, timeout=60, what="a request held")
        code, err = kill(proc, signal.SIGTERM)
    finally:
        outage.unlink()
    assert code == 75, err
    assert "does not answer; stopping now" in err and "spotbook resume" in err, err
    _resumes_to_the_end(work, place)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs (root can mount one; CI runs as root)."""
    where = tmp_path / "small"
    where.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here ({r.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize(
    ("make", "shows"),
    [
        ("big = bytes(16 << 20)", "1 16777216"),  # in the pickle stream
        # an array's buffer is a blob of its own, written from inside the pickler: a full
        # disk there once left the variable out of the snapshot, silently, exit 0
        ("import numpy as np\nbig = np.ones(2 << 20)", "1 2097152"),
    ],
    ids=["stream", "array-buffer"],
)
def test_a_full_filesystem_stops_the_run_with_progress_kept(
    tmp_path: Path, small_fs: Path, make: str, shows: str
) -> None:
    """The run store is on a small filesystem that the state does not fit: the snapshot
    is retried, then exit 3 with what failed; once there is room, a resume goes on."""
    write_notebook(tmp_path / "nb.ipynb", "x = 1", make, "print(x, len(big))")
    rd = str(small_fs / "rd")
    r = cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", rd, "--snapshot", "every-cell", cwd=tmp_path
    )
    assert r.returncode == 3, r.stderr
    assert "the snapshot after cell 1 could not be written" in r.stderr, r.stderr
    assert "progress up to cell 0 is saved" in r.stderr and "Traceback" not in r.stderr
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_fs)], check=True)
    r = cli("resume", rd, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "out.ipynb").read_text())
    assert shows in json.dumps(out["cells"][2]["outputs"])


def test_a_read_only_run_dir_is_bad_input(tmp_path: Path, small_fs: Path) -> None:
    """A run dir that cannot be written (a read-only filesystem: what root meets where
    others meet "permission denied") is a local problem retrying cannot fix: exit 2, a
    message about the path, and nothing written; for a new run and for a restart."""
    write_notebook(tmp_path / "nb.ipynb", "x = 1", "print(x)")
    r = cli("run", "nb.ipynb", "out.ipynb", "--run-dir", str(small_fs / "old"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    r = cli("run", "nb.ipynb", "out2.ipynb", "--run-dir", str(small_fs / "new"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "give --run-dir a directory on a writable filesystem" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (small_fs / "new").exists()
    again = ("run", "nb.ipynb", "out2.ipynb", "--run-dir", str(small_fs / "old"), "--restart")
    r = cli(*again, cwd=tmp_path)
    assert r.returncode == 2 and "writable filesystem" in r.stderr, r.stderr


@on("local")
def test_ctrl_c_is_the_users_stop_not_a_preemption(work: Path, place: Place) -> None:
    """SIGINT (Ctrl-C) saves progress and exits 75 like a notice, but it is recorded as
    the user's stop: no preemption counted (so not against --max-preemptions 0), no
    time waiting for a node; SIGTERM (a node's notice) still is a preemption."""
    proc = _gated_run(work, place, "--grace", "0.5", "--max-preemptions", "0")
    code, err = kill(proc, signal.SIGINT)
    assert code == 75, err
    doc = json.loads(cli("status", place.rd, "--json", cwd=work).stdout)
    assert doc["attempts"][0]["outcome"] == "stopped" and doc["preemptions"] == 0, doc
    assert doc["downtime"]["totals"]["preemptions"] == 0 and doc["status"] == "interrupted"
    assert "stopped by you" in doc["message"]
    (work / "started").unlink()
    proc = start_cli("resume", place.rd, cwd=work, env=place.env)
    wait_for(lambda: (work / "started").exists(), timeout=120, what="cell 1 again")
    code, err = kill(proc, signal.SIGTERM)
    assert code == 75, err
    doc = json.loads(cli("status", place.rd, "--json", cwd=work).stdout)
    assert [a["outcome"] for a in doc["attempts"]] == ["stopped", "preempted"]
    assert doc["preemptions"] == 1 and len(doc["downtime"]["preemptions"]) == 0  # no next yet
    r = cli("resume", place.rd, cwd=work, env=place.env)
    assert r.returncode != 0 and "--max-preemptions" in r.stderr, r.stderr


def test_a_sigterm_in_the_first_instants_is_a_stop_with_75(tmp_path: Path) -> None:
    """The SIGTERM comes while `spotbook run` still reads its notebook from stdin, before
    any attempt exists: the process takes it (exit 75, as at any later instant), not the
    default action (143); `resume` then runs the notebook. (The resume is not on a wiped
    node: the subject is the signal's timing, and nothing ran before it.)"""
    write_notebook(tmp_path / "nb.ipynb", "x = 1", "print(x + 1)")
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotbook", "run", "-", "out.ipynb", "--run-dir", "rd"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def takes_sigterm() -> bool:  # the handler is there: SigCgt has SIGTERM's bit
        with open(f"/proc/{proc.pid}/status") as fh:
            mask = next(line for line in fh if line.startswith("SigCgt:")).split()[1]
        return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))

    try:
        wait_for(takes_sigterm, timeout=60, what="the SIGTERM handler")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate((tmp_path / "nb.ipynb").read_text(), timeout=120)
    finally:
        if proc.poll() is None:
            kill(proc)
    assert proc.returncode == 75, err
    assert "stopped on SIGTERM after saving progress" in err and "Traceback" not in err, err
    r = cli("resume", "rd", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "2" in json.dumps(json.loads((tmp_path / "out.ipynb").read_text())["cells"][1])
