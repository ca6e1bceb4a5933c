"""Background snapshots: written by a fork of the kernel while the notebook goes on.

A kill while the copy writes loses only the records held behind it (their cells run
again, files given back), never a committed cell; where forking is unsafe the snapshot is
staged (copied, then written by a thread of the kernel), and the same holds; the attempt
record says which, and why."""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import weakref
from pathlib import Path
from typing import Any

import psutil
import pytest

from .conftest import (
    cells_committed,
    cli,
    kill,
    node_lost,
    on_created,
    start_cli,
    wait_for,
    write_notebook,
)


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


def test_unsafe_to_fork_is_staged_and_says_why(tmp_path: Path) -> None:
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
    # the kernel is not forked while the notebook's thread runs: staged instead, in the
    # background all the same (the last, once the thread is gone, from a fork again)
    assert "threads started by the notebook are running (waiter)" in attempt["snapshots_staged"]
    assert "snapshots_sync" not in attempt
    assert attempt["background_snapshots"] == 3
    assert len(list((tmp_path / "rd" / "state" / "snap").iterdir())) == 3
    # --no-snapshot-background: every snapshot synchronous, none in the background
    r = cli(
        "run", "t.ipynb", "o2.ipynb", "--run-dir", "rd2", "--snapshot", "every-cell",
        "--no-snapshot-background", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (attempt,) = json.loads(cli("status", "rd2", "--json", cwd=tmp_path).stdout)["attempts"]
    assert "background_snapshots" not in attempt and "snapshots_staged" not in attempt
    assert len(list((tmp_path / "rd2" / "state" / "snap").iterdir())) == 3


def test_a_staged_snapshot_is_taken_in_its_cells_own_request_and_prints_nothing_there(
    tmp_path: Path,
) -> None:
    """In a kernel whose snapshots are all staged, each one is asked for with the cell it
    follows (a user expression of the cell's execute request, not a request of its own):
    what pickling the state prints stays out of the cell's outputs, as a silent request's
    did, and the cell's number and outputs are as without snapshots."""
    write_notebook(
        tmp_path / "nb.ipynb",
        "import sys\nsys.spotbook_asked_in = []\n"
        "class Witness:\n    def __reduce__(self):\n"
        "        parent = get_ipython().kernel.get_parent()\n"
        "        sys.spotbook_asked_in.append(parent['content'].get('silent'))\n"
        "        print('pickled')\n        return (Witness, ())\n"
        "w = Witness()\nprint('cell 0')",
        "x = 1\nx",
        "print('cell 2')",
        "print(sys.spotbook_asked_in)",
    )
    env = {"SPOTBOOK_SNAPSHOT_STAGED": "1"}
    r = cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", "--snapshot", "every-cell",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (attempt,) = json.loads(cli("status", "rd", "--json", cwd=tmp_path).stdout)["attempts"]
    assert attempt["background_snapshots"] == 3 and "snapshots_sync" not in attempt
    out = json.loads((tmp_path / "out.ipynb").read_text())
    texts = [
        "".join(o["text"])
        for c in out["cells"]
        for o in c["outputs"]
        if o["output_type"] == "stream"
    ]
    # three snapshots, each pickled in a request that was not silent: the cell's own
    assert texts == ["cell 0\n", "cell 2\n", "[False, False, False]\n"]
    assert out["cells"][1]["outputs"][0]["data"]["text/plain"] == "1"
    assert [c["execution_count"] for c in out["cells"]] == [1, 2, 3, 4]


def _wipe(work: Path, env: dict[str, str]) -> None:
    """A new node: working directory (but the run store), home and temp dirs emptied."""
    node_lost(env["TMPDIR"])
    for entry in work.iterdir():
        if entry.name != "rd":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for var in ("HOME", "TMPDIR"):
        shutil.rmtree(env[var])
        os.makedirs(env[var])


def _killed_at_the_first_blob_after_cell_0(
    tmp_path: Path, node: str, cells: tuple[str, ...]
) -> tuple[Path, dict[str, str]]:
    """Run ``cells`` staged, every cell snapshotted; once cell 0 is committed, lose the
    node (the runner and its kernel SIGKILLed) the moment the next blob is created
    (inotify tells it); on a ``wiped`` node, empty it. Returns the working directory
    (the run store is ``rd`` in it) and the environment to resume with."""
    work = tmp_path / "work"
    env = {"SPOTBOOK_SNAPSHOT_STAGED": "1"}
    for var, name in (("HOME", "home"), ("TMPDIR", "tmp")):
        env[var] = str(tmp_path / name)
        os.makedirs(env[var])
    work.mkdir()
    write_notebook(work / "nb.ipynb", *cells)
    proc = start_cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", "--snapshot", "every-cell",
        cwd=work, env=env,
    )  # fmt: skip
    runner = psutil.Process(proc.pid)
    wait_for(lambda: cells_committed(work / "rd") == 1, what="cell 0 committed")

    def lose_the_node() -> list[psutil.Process]:
        everyone = [runner, *runner.children(recursive=True)]
        for p in everyone:
            p.send_signal(signal.SIGKILL)
        return everyone

    blobs = work / "rd" / "state" / "blobs"
    everyone = on_created(blobs, lambda name: ".tmp-" in name, lose_the_node)
    proc.communicate(timeout=60)
    psutil.wait_procs(everyone, timeout=30)
    assert cells_committed(work / "rd") == 1
    if node == "wiped":
        _wipe(work, env)
    return work, env


@pytest.mark.parametrize("node", ["same", "wiped"])
def test_kill_while_a_staged_snapshots_writer_runs(tmp_path: Path, node: str) -> None:
    """The writer thread of a staged snapshot is caught writing a 256 MiB blob (inotify
    tells its creation; writing it takes far longer than the kill), the node lost."""
    go = tmp_path / "go"
    cells = (
        "import numpy as np\nstate = np.arange(2_000_000)",
        "big = np.full(32 << 20, 7.0)  # 256 MiB, new: its blob is written by the thread\n"
        "with open('side.txt', 'a') as fh:\n    fh.write('cell 1\\n')",
        _gate(go) + "\nstate = state + 1",
        "print(int(state.sum()), float(big.sum()), open('side.txt').read().count('cell 1'))",
    )
    # the first blob created after cell 0's is big's (state's is there already)
    work, env = _killed_at_the_first_blob_after_cell_0(tmp_path, node, cells)
    snaps = sorted(p.name for p in (work / "rd" / "state" / "snap").iterdir())
    assert len(snaps) == 1 and snaps[0].startswith("00000-"), snaps  # only cell 0's
    go.touch()
    r = cli("resume", "rd", cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    status = json.loads(cli("status", "rd", "--json", cwd=work, env=env).stdout)
    first, second = status["attempts"]
    assert first["outcome"] == "killed" and second["resumed_from"] == 1
    assert second["replayed"] == [] and "SPOTBOOK_SNAPSHOT_STAGED" in second["snapshots_staged"]
    out = json.loads((work / "out.ipynb").read_text())
    want = f"{sum(range(1, 2_000_001))} {7.0 * (32 << 20)} 1\n"
    assert "".join(out["cells"][3]["outputs"][0]["text"]) == want
    assert (work / "side.txt").read_text() == "cell 1\n"


@pytest.mark.parametrize("node", ["same", "wiped"])
def test_a_snapshot_asked_with_its_cell_writes_nothing_before_the_cells_files_are_noted(
    tmp_path: Path, node: str
) -> None:
    """The writer of a snapshot asked with its cell starts only once the runner has noted
    the files the cell wrote: killed at its first blob, the resume gives the cell its file
    back before it runs again (it appends once, not twice). The cell prints 8 MiB, which
    the runner saves to the store before it notes the files: a writer that did not wait
    would have made its first blob long before."""
    go = tmp_path / "go"
    cells = (
        "x = 1",
        "with open('side.txt', 'a') as fh:\n    fh.write('cell 1\\n')\n"
        "print('y' * (8 << 20))\nsmall = list(range(1000))",
        _gate(go) + "\nprint(open('side.txt').read().count('cell 1'), len(small))",
    )
    # the first blob created after cell 0 is committed is the snapshot after cell 1's
    work, env = _killed_at_the_first_blob_after_cell_0(tmp_path, node, cells)
    go.touch()
    r = cli("resume", "rd", cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads((work / "out.ipynb").read_text())
    assert "".join(out["cells"][2]["outputs"][0]["text"]) == "1 1000\n"
    assert (work / "side.txt").read_text() == "cell 1\n"
    if node == "same":  # (a wiped node has no file to give back: the cell makes it anew)
        status = json.loads(cli("status", "rd", "--json", cwd=work, env=env).stdout)
        assert any("side.txt" in line for line in status["attempts"][1]["files_given_back"])


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


def _a_dropped_snapshot_resumed_on_a_wiped_node(
    tmp_path: Path, setup: str, step: str, frozen_bytes: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``setup`` makes a parameter ``w``, a tensor ``frozen`` of ``frozen_bytes`` never
    changed, and an optimizer; two cells of ``step``, then ``w`` changed through ``.data``
    (the snapshot after it dropped), then a cell held at a gate. Killed there, resumed on a
    wiped node: it gives what an uninterrupted run gives. Returns the snapshot after cell 2
    and the second attempt's record."""
    from spotbook.store.runstore import RunStore

    work, go = tmp_path / "work", tmp_path / "go"
    env = {}
    for var, name in (("HOME", "home"), ("TMPDIR", "tmp")):
        env[var] = str(tmp_path / name)
        os.makedirs(env[var])
    work.mkdir()
    cells = (
        setup,
        step,
        step,
        "w.data.mul_(0.5)  # a change torch's version counter does not see",
        _gate(go) + "\n" + step,
        "print(float(w.double().sum()), float(frozen.double().sum()), "
        "int(torch.random.get_rng_state().sum()))",
    )
    write_notebook(work / "nb.ipynb", *cells)
    go.touch()
    r = cli("run", "nb.ipynb", "ref.ipynb", "--run-dir", "ref", cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    want = json.loads((work / "ref.ipynb").read_text())["cells"][5]["outputs"][0]["text"]
    go.unlink()
    proc = start_cli(
        "run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", "--snapshot", "every-cell",
        cwd=work, env=env,
    )  # fmt: skip
    # cell 3's record is committed once its snapshot is settled (here: dropped)
    wait_for(lambda: cells_committed(work / "rd") == 4, what="cells 0-3 committed")
    code, err = kill(proc)
    assert code == -signal.SIGKILL, err
    store = RunStore(str(work / "rd"))
    keys = store.snapshot_keys()
    assert sorted(keys) == [0, 1, 2], keys  # the one after cell 3 was dropped
    after2 = store.read_snapshot(keys[2])
    assert after2 is not None and after2["reused_bytes"] >= frozen_bytes
    _wipe(work, env)
    go.touch()
    r = cli("resume", "rd", cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    second = json.loads(cli("status", "rd", "--json", cwd=work, env=env).stdout)["attempts"][1]
    assert second["restored_snapshot"].startswith("00002-") and second["replayed"] == [3]
    got = json.loads((work / "out.ipynb").read_text())["cells"][5]["outputs"][0]["text"]
    assert got == want
    return after2, second


def test_torch_tensors_unchanged_are_not_copied_and_a_change_behind_the_counter_is_caught(
    tmp_path: Path,
) -> None:
    """torch loaded: staged snapshots. A tensor whose version counter has not moved is
    neither copied nor written; one changed through ``.data`` (no count) is caught by the
    writer and that snapshot dropped. Killed after it, resumed on a wiped node, the run
    gives what an uninterrupted one gives."""
    pytest.importorskip("torch", reason="torch is not installed here (scripts/check.sh)")
    after2, second = _a_dropped_snapshot_resumed_on_a_wiped_node(
        tmp_path,
        "import torch\ntorch.manual_seed(0)\nw = torch.nn.Parameter(torch.randn(256, 256))\n"
        "frozen = torch.randn(4096, 256)  # 4 MiB, never changed\n"
        "opt = torch.optim.SGD([w], lr=0.01, momentum=0.9)",
        "for _ in range(3):\n"
        "    opt.zero_grad(); (w @ frozen.T).pow(2).mean().backward(); opt.step()",
        4096 * 256 * 4,
    )
    # of the notebook's pause, the kernel's own part (the rest: the request, the files)
    assert 0 < after2["kernel_pause_seconds"] <= after2["pause_seconds"]
    assert "torch is loaded" in second["snapshots_staged"]


def _staged_snapshot(blob_dir: Path, values: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """A staged snapshot of ``values`` taken in this process, flushed as its writer
    would: (its manifest's stream document with blob names, the StagedBlobs)."""
    from spotbook.kernel import pickling

    blobs = pickling.StagedBlobs(str(blob_dir))
    doc, failed = pickling.dump_namespace(values, {}, blobs)
    assert failed == {}
    blobs.flush()
    doc["stream"] = blobs.name(doc["stream"])
    doc["buffers"] = [blobs.name(d) for d in doc["buffers"]]
    return doc, blobs


def test_polars_columns_round_trip_and_unchanged_ones_are_not_copied(tmp_path: Path) -> None:
    """polars frames' plain numeric columns are saved from their own memory (not through
    polars' serialisation) and come back equal, schema and all, beside columns left to
    polars (nulls, strings, sorted); an unchanged frame's columns are neither copied nor
    written at the next staged snapshot, and one changed in place (``scatter``) is caught."""
    pl = pytest.importorskip("polars", reason="polars is not installed here (scripts/check.sh)")
    import numpy as np

    from spotbook.kernel import pickling

    frame = pl.DataFrame(
        {
            "f": np.linspace(0.0, 1.0, 100_000),
            "i32": np.arange(100_000, dtype=np.int32),
            "u8": (np.arange(100_000) % 251).astype(np.uint8),
            "nulls": [None, *range(99_999)],
            "s": ["x"] * 100_000,
        }
    ).with_columns(pl.col("u8").alias("sorted").sort().set_sorted())
    series = pl.Series("alone", np.arange(50_000, dtype=np.float32))

    def snapshot(values: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        return _staged_snapshot(tmp_path / "blobs", values)

    pickling._KNOWN.clear()
    doc, first = snapshot({"frame": frame, "series": series})
    assert first.reused == 0 and first.staged >= 100_000 * (8 + 4 + 1)
    back, _ = pickling.load_namespace(doc, pickling.Blobs(str(tmp_path / "blobs")))
    assert back["frame"].schema == frame.schema and back["frame"].equals(frame)
    assert back["series"].dtype == pl.Float32 and back["series"].equals(series)
    _, second = snapshot({"frame": frame, "series": series})
    assert second.reused >= 100_000 * (8 + 4 + 1) + 50_000 * 4 and not second.stale
    frame[0, "f"] = 5.0  # in place where polars may (the frame's own column)
    _, third = snapshot({"frame": frame, "series": series})
    changed = frame["f"].to_numpy()
    if third.reused and not third.stale:  # polars copied the column: nothing to catch
        assert third.staged >= changed.nbytes
    else:
        assert third.stale, "a column changed in place was taken as unchanged"


def test_numpy_arrays_left_alone_are_not_copied_and_a_change_is_caught(tmp_path: Path) -> None:
    """numpy arrays have no version counter: in a staged snapshot a hash of pieces spread
    over an array stands for one. An array left alone since the last snapshot is reused
    without a copy at once; one the cells keep changing is copied every time (and no
    snapshot dropped for it); a change too small for the pieces to see is caught by the
    writer (that snapshot dropped), and the array copied from then on."""
    import numpy as np

    from spotbook.kernel import pickling

    stable = np.random.default_rng(0).random((1000, 1000))  # 8 MB, left alone
    moving = np.zeros(500_000)  # 4 MB, changed before every snapshot
    view = stable[:10]

    def snapshot() -> tuple[dict[str, Any], Any]:
        moving[:] += 1.0
        values = {"stable": stable, "moving": moving, "view": view}
        return _staged_snapshot(tmp_path / "blobs", values)

    pickling._KNOWN.clear()
    seen = []
    for _ in range(3):
        doc, blobs = snapshot()
        seen.append((blobs.staged, blobs.reused, len(blobs.stale)))
        back, _ = pickling.load_namespace(doc, pickling.Blobs(str(tmp_path / "blobs")))
        assert np.array_equal(back["stable"], stable) and np.array_equal(back["moving"], moving)
        assert back["moving"].flags.writeable and back["view"].base is not None
    both, one = stable.nbytes + moving.nbytes, moving.nbytes
    assert seen == [(both, 0, 0), (one, stable.nbytes, 0), (one, stable.nbytes, 0)]
    stable[-1, -1] = -1.0  # where a piece lies: copied, nothing dropped
    _, blobs = snapshot()
    assert (blobs.staged, blobs.reused, blobs.stale) == (both, 0, [])
    # a byte between the first two pieces (the first is the array's first bytes)
    stable.reshape(-1)[(pickling._SAMPLE + 8) // 8] = -2.0
    _, blobs = snapshot()
    assert blobs.stale, "a change between the pieces was taken as unchanged"
    for _ in range(2):  # no longer trusted: copied each time
        _, blobs = snapshot()
        assert (blobs.staged, blobs.reused, blobs.stale) == (both, 0, [])


def _cuda() -> Any:
    """torch with a GPU, or the test skipped: these run on a GPU machine only (opt-in)."""
    torch = pytest.importorskip("torch", reason="opt-in: needs torch and a GPU")
    if shutil.which("nvidia-smi") is None or not torch.cuda.is_available():
        pytest.skip("opt-in: needs nvidia-smi and a GPU")
    return torch


@pytest.mark.gpu
def test_cuda_tensors_are_staged_through_pinned_memory_and_unchanged_ones_not_copied(
    tmp_path: Path,
) -> None:
    """In a staged snapshot a CUDA storage is copied into pinned memory in the pause and
    comes back on its device, shared by the tensors that shared it; one whose tensor's
    counter has not moved is neither copied nor written (the writer reads the device's
    bytes again); one changed through ``.data`` (no count) is caught by that reading."""
    torch = _cuda()
    from spotbook.kernel import pickling

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(1024, 1024, device="cuda"))  # 4 MiB
    frozen = torch.randn(2048, 1024, device="cuda")  # 8 MiB, never changed
    small = torch.arange(10.0, device="cuda")  # in band
    values = {"w": w, "view": w.data[10:20], "frozen": frozen, "small": small}
    big = w.numel() * 4 + frozen.numel() * 4
    # the pinned copies are let go once written, not when the cyclic collector runs (the
    # next snapshot could not reuse them: a new pinned allocation takes seconds a GiB)
    gc.disable()
    try:
        blobs = pickling.StagedBlobs(str(tmp_path / "blobs"))
        pickling.dump_namespace(values, {}, blobs)
        copies = [weakref.ref(h) for h in blobs._owned.values()]
        blobs.flush()
        del blobs
        assert len(copies) == 2 and all(r() is None for r in copies)
    finally:
        gc.enable()
    pickling._KNOWN.clear()

    def snapshot() -> Any:
        doc, blobs = _staged_snapshot(tmp_path / "blobs", values)
        back, failed = pickling.load_namespace(doc, pickling.Blobs(str(tmp_path / "blobs")))
        assert failed == {}
        for name, value in values.items():
            assert back[name].device == value.device and torch.equal(back[name], value)
        assert back["view"].untyped_storage().data_ptr() == back["w"].untyped_storage().data_ptr()
        assert isinstance(back["w"], torch.nn.Parameter) and back["w"].requires_grad
        return blobs

    first = snapshot()
    assert (first.staged, first.reused, first.stale) == (big, 0, [])
    second = snapshot()
    assert (second.staged, second.reused, second.stale) == (0, big, [])
    with torch.no_grad():
        w.add_(1.0)  # counted: copied again
    third = snapshot()
    assert (third.staged, third.reused, third.stale) == (w.numel() * 4, frozen.numel() * 4, [])
    frozen.data.mul_(0.5)  # not counted: reused, then caught by the writer
    _, blobs = _staged_snapshot(tmp_path / "blobs", values)
    assert blobs.stale, "a change behind the counter was taken as unchanged"
    again = snapshot()  # no longer trusted: copied
    assert again.staged == big and not again.stale


@pytest.mark.gpu
def test_a_cuda_training_run_killed_resumes_on_a_wiped_node(tmp_path: Path) -> None:
    """torch on the GPU: staged snapshots (a CUDA context may not fork). A weight matrix
    left alone is neither copied nor written again; one changed through ``.data`` is caught
    and that snapshot dropped. Killed after it and resumed on a wiped node (on the same
    GPU), the run gives what an uninterrupted one gives: the cells run after the resume
    draw from the CUDA generator the snapshot restored."""
    _cuda()
    _, second = _a_dropped_snapshot_resumed_on_a_wiped_node(
        tmp_path,
        "import torch\ntorch.manual_seed(0)\ndev = torch.device('cuda')\n"
        "w = torch.nn.Parameter(torch.randn(1024, 1024, device=dev) / 32)\n"
        "frozen = torch.randn(4096, 1024, device=dev) / 32  # 16 MiB, never changed\n"
        "opt = torch.optim.SGD([w], lr=0.01, momentum=0.9)",
        "for _ in range(3):\n"
        "    x = torch.randn(64, 1024, device=dev)\n"
        "    opt.zero_grad(); (x @ w @ frozen.T).pow(2).mean().backward(); opt.step()",
        4096 * 1024 * 4,
    )
    assert second["snapshots_staged"]
