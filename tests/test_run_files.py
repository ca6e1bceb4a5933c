"""The run's files and environment cells, without a kernel: capture, restore, the pieces
that decide what a new node gets back; and a snapshot stream whose one segment fails."""

from __future__ import annotations

import functools
import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from spotbook.attempt.env_cells import env_cell, env_cells
from spotbook.attempt.run_files import (
    FilesIntegrityError,
    FilesPolicy,
    RunFiles,
    check_blob,
    fetch_blob,
    missing,
    restore,
)
from spotbook.kernel.pickling import Blobs, dump_namespace, load_namespace
from spotbook.store.integrity import copy_checked
from spotbook.store.runstore import RunStore


def copy_blob(blob_dir: Path | str) -> Callable[[str, str], None]:
    """``fetch`` from blobs in a plain folder, checked as a local store's are."""

    def fetch(digest: str, path: str) -> None:
        check = functools.partial(check_blob, digest=digest, path=path)
        copy_checked(os.path.join(blob_dir, digest), path, check)

    return fetch


def _files(tmp_path: Path, **policy: object) -> tuple[RunFiles, Path, Path]:
    work, blobs = tmp_path / "work", tmp_path / "blobs"
    work.mkdir()
    (work / "input.csv").write_text("there before the run")
    files = RunFiles([str(work)], policy=FilesPolicy(**policy))  # type: ignore[arg-type]
    files.begin(None)
    return files, work, blobs


def test_what_a_cell_made_is_captured_and_put_back_on_an_empty_node(tmp_path: Path) -> None:
    files, work, blobs = _files(tmp_path)
    (work / "out").mkdir()
    (work / "out" / "x.npy").write_bytes(b"\x93NUMPY" + bytes(1000))
    (work / "log.txt").write_text("one\n")
    os.symlink("log.txt", work / "link.txt")
    os.chmod(work / "log.txt", 0o640)
    doc, written = files.capture(str(blobs))
    entries = doc["entries"]
    assert str(work / "input.csv") not in entries  # an input, never changed
    assert entries[str(work / "link.txt")] == {"kind": "link", "target": "log.txt", "created": True}
    assert entries[str(work / "out")]["kind"] == "dir"
    assert written == 1006 + 4
    # a new node: nothing there
    for p in sorted(work.rglob("*"), key=lambda p: -len(str(p))):
        p.unlink() if p.is_file() or p.is_symlink() else p.rmdir()
    assert sorted(missing(doc)) == sorted(entries)
    done = restore(doc, copy_blob(str(blobs)))
    assert done.files == 3 and not done.failed  # two files, one link; the folder first
    assert (work / "out" / "x.npy").read_bytes()[:6] == b"\x93NUMPY"
    assert os.readlink(work / "link.txt") == "log.txt"
    assert (work / "log.txt").stat().st_mode & 0o777 == 0o640
    assert (work / "log.txt").stat().st_mtime_ns == entries[str(work / "log.txt")]["mtime_ns"]
    # the same node again: nothing to copy
    assert missing(doc) == [] and restore(doc, copy_blob(str(blobs))).files == 0


def test_a_changed_file_is_captured_again_and_a_deleted_one_dropped(tmp_path: Path) -> None:
    files, work, blobs = _files(tmp_path)
    (work / "a.txt").write_text("1")
    (work / "b.txt").write_text("2")
    files.capture(str(blobs))
    (work / "a.txt").write_text("11")
    (work / "b.txt").unlink()
    (work / "input.csv").write_text("changed by the run")
    doc, _ = files.capture(str(blobs))
    assert doc["entries"][str(work / "a.txt")]["size"] == 2
    assert str(work / "b.txt") not in doc["entries"]
    changed = doc["entries"][str(work / "input.csv")]
    assert changed["created"] is False  # there before the run: never removed on a fallback
    removed = files.remove_created()
    assert removed == [str(work / "a.txt")] and (work / "input.csv").exists()


def test_budget_and_exclude_are_listed_as_skipped(tmp_path: Path) -> None:
    files, work, blobs = _files(tmp_path, budget=100, exclude=("*.tmp",))
    (work / "big.bin").write_bytes(bytes(500))
    (work / "scratch.tmp").write_text("x")
    (work / "small.txt").write_text("y")
    doc, _ = files.capture(str(blobs))
    assert "over --files-budget" in doc["skipped"][str(work / "big.bin")]["why"]
    assert doc["skipped"][str(work / "scratch.tmp")]["why"] == "--files-exclude *.tmp"
    assert str(work / "small.txt") in doc["entries"]


def test_a_large_file_changed_before_its_copy_is_not_kept(tmp_path: Path) -> None:
    """Large files are copied beside the next cell: one that cell rewrote first is listed
    as skipped (a resume that lacks it names it), never saved with the next cell's bytes."""
    from spotbook.attempt import run_files

    files, work, blobs = _files(tmp_path)
    (work / "ckpt.pt").write_bytes(bytes(run_files.SMALL + 1))
    rest = files.stage(str(blobs))
    (work / "ckpt.pt").write_bytes(b"the next cell's" + bytes(run_files.SMALL))
    doc, _ = rest()
    assert str(work / "ckpt.pt") not in doc["entries"]
    assert "changed by the next cell" in doc["skipped"][str(work / "ckpt.pt")]["why"]
    rest = files.stage(str(blobs))  # at the next boundary it is saved as it is then
    doc, _ = rest()
    assert doc["entries"][str(work / "ckpt.pt")]["size"] == run_files.SMALL + 15


def test_restore_checks_blobs_and_paths(tmp_path: Path) -> None:
    files, work, blobs = _files(tmp_path)
    (work / "a.txt").write_text("genuine")
    doc, _ = files.capture(str(blobs))
    digest = doc["entries"][str(work / "a.txt")]["sha256"]
    (blobs / digest).write_text("forged!")
    (work / "a.txt").unlink()
    with pytest.raises(FilesIntegrityError, match="does not match its hash"):
        restore(doc, copy_blob(str(blobs)))
    assert not (work / "a.txt").exists()
    with pytest.raises(FilesIntegrityError):
        restore({"entries": {"relative/path": {"kind": "file"}}}, copy_blob(str(blobs)))
    with pytest.raises(FilesIntegrityError):
        restore({"entries": {"/a/../etc/passwd": {"kind": "file"}}}, copy_blob(str(blobs)))


@pytest.mark.parametrize("kind", ["fifo", "dir", "link"])
def test_a_local_stores_blob_that_is_not_a_plain_file_is_refused_never_waited_on(
    tmp_path: Path, kind: str
) -> None:
    store = RunStore(str(tmp_path / "rd"))
    files, work, _ = _files(tmp_path)
    blobs = tmp_path / "rd" / "state" / "blobs"
    (work / "a.txt").write_text("genuine")
    doc, _ = files.capture(str(blobs))
    blob = blobs / doc["entries"][str(work / "a.txt")]["sha256"]
    (tmp_path / "elsewhere").write_bytes(blob.read_bytes())  # the right bytes, behind a link
    blob.unlink()
    if kind == "fifo":
        os.mkfifo(blob)  # no writer: a reader that waited would wait for ever
    elif kind == "dir":
        blob.mkdir()
    else:
        os.symlink(tmp_path / "elsewhere", blob)
    (work / "a.txt").unlink()
    if kind == "link":  # refused by the open itself: that one file is not restored
        done = restore(doc, fetch_blob(store))
        assert list(done.failed) == [str(work / "a.txt")] and done.files == 0
    else:
        with pytest.raises(FilesIntegrityError, match="is not a plain file"):
            restore(doc, fetch_blob(store))
    assert not (work / "a.txt").exists()
    assert [p.name for p in work.iterdir()] == ["input.csv"]  # no download left behind


def test_an_object_stores_blob_is_downloaded_then_checked(tmp_path: Path) -> None:
    store = RunStore(f"memory://blobs-{tmp_path.name}")
    files, work, blobs = _files(tmp_path)
    (work / "a.txt").write_text("genuine")
    doc, _ = files.capture(str(blobs))
    digest = doc["entries"][str(work / "a.txt")]["sha256"]
    (work / "a.txt").unlink()
    store.write(store.blob_path(digest), b"forged!")
    with pytest.raises(FilesIntegrityError, match="does not match its hash"):
        restore(doc, fetch_blob(store))
    assert [p.name for p in work.iterdir()] == ["input.csv"]  # the download was removed
    store.write(store.blob_path(digest), (blobs / digest).read_bytes())
    assert restore(doc, fetch_blob(store)).files == 1
    assert (work / "a.txt").read_text() == "genuine"


def test_restore_never_writes_through_a_link(tmp_path: Path) -> None:
    files, work, blobs = _files(tmp_path)
    (work / "a.txt").write_text("mine")
    doc, _ = files.capture(str(blobs))
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    (work / "a.txt").unlink()
    os.symlink(outside, work / "a.txt")  # planted where the file goes
    assert restore(doc, copy_blob(str(blobs))).files == 1
    assert outside.read_text() == "untouched"
    assert not (work / "a.txt").is_symlink() and (work / "a.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("source", "packages", "checkable"),
    [
        ("%pip install -q numpy==2.1 'pandas>=2'", ("numpy", "pandas"), True),
        ("!pip install --no-index -f /wheels nlpkg", ("nlpkg",), True),
        ("%pip install /w/nlpkg-0.1-py3-none-any.whl", ("nlpkg",), True),
        ("!{sys.executable} -m pip install torch --index-url https://x/cpu", ("torch",), True),
        ("%pip install -r requirements.txt", (), False),
        ("%pip install -e .", (), False),
        ("%pip install $WHEEL", (), False),
        ("!git clone https://example.org/r.git", (), False),
        ("%%bash\ncd /tmp\napt-get install -y libx", (), False),
        ("!apt-get install -y graphviz", (), False),
        ("%conda install -y scipy", (), False),
    ],
)
def test_environment_cells_are_found_by_their_source(
    source: str, packages: tuple[str, ...], checkable: bool
) -> None:
    cell = env_cell(3, source)
    assert cell is not None and cell.packages == packages and cell.checkable is checkable


def test_other_cells_are_not_environment_cells() -> None:
    for source in ("import pip", "x = 'pip install y'", "%%bash\necho hi", "!ls", "# %pip"):
        assert env_cell(0, source) is None
    cells = env_cells(
        ["%pip install a", "x = 1", "%pip install b"], [[], [], ["spotbook-no-replay"]], 2
    )
    assert [c.index for c in cells] == [0]


class _LoadsBadly:
    """Pickles, but does not load back (a ``__reduce__`` that lies)."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (int, ("not a number",))


def test_a_segment_that_fails_to_load_does_not_drop_the_later_ones(tmp_path: Path) -> None:
    """The minimal case of the statsmodels notebook: one variable that fails to load
    used to drop every variable bound after it (and IPython's history with them)."""
    blobs = Blobs(str(tmp_path))
    shared = [1, 2, 3]
    values = {
        "a": np.arange(100_000.0),
        "bad": _LoadsBadly(),
        "alias": shared,
        "holder": {"k": shared},
        "b": np.ones(50_000),
    }
    doc, failed = dump_namespace(values, {}, blobs)
    assert not failed
    loaded, failed = load_namespace(doc, blobs)
    assert set(failed) == {"bad"}
    assert loaded["holder"]["k"] is loaded["alias"]  # shared references still shared
    assert float(loaded["b"].sum()) == 50_000.0 and loaded["a"][-1] == 99_999.0


class _Holds:
    """Pickles with a reference to another object, and fails to load."""

    def __init__(self, ref: object) -> None:
        self.ref = ref

    def __reduce__(self) -> tuple[object, tuple[object]]:
        return (_refuse, (self.ref,))


def _refuse(ref: object) -> None:
    raise ValueError("cannot be rebuilt here")


def test_a_variable_that_shares_an_object_with_a_failed_one_fails_by_name(tmp_path: Path) -> None:
    """An object made inside the failed segment is never replaced by a placeholder in a
    later one: the later variable fails too, and says why; a later variable that shares
    only a constant (a dict key) with it still loads."""
    blobs = Blobs(str(tmp_path))
    inner = {"z": 9}
    values = {"bad": _Holds(inner), "dep": {"k": inner}, "other": {"k": 1}}
    doc, _ = dump_namespace(values, {}, blobs)
    loaded, failed = load_namespace(doc, blobs)
    assert failed["bad"] == "ValueError: cannot be rebuilt here"
    assert failed["dep"] == "refers to an object of a variable that failed to load"
    assert loaded == {"other": {"k": 1}}


def test_the_load_check_cuts_a_type_that_does_not_load_back(tmp_path: Path) -> None:
    """In the background snapshot's copy, each segment with a type not yet seen to load
    is loaded back once; one that fails is cut out when the snapshot is taken (replayed
    on resume) instead of failing the load."""
    from spotbook.kernel import pickling

    pickling.LOAD_CHECK["on"] = True
    try:
        doc, failed = dump_namespace(
            {"ok": {"x": 1}, "bad": _LoadsBadly(), "after": [4]}, {}, Blobs(str(tmp_path))
        )
    finally:
        pickling.LOAD_CHECK["on"] = False
    assert "pickles but does not load back" in failed["bad"]
    loaded, lost = load_namespace(doc, Blobs(str(tmp_path)))
    assert loaded == {"ok": {"x": 1}, "after": [4]} and not lost
    assert pickle.loads(pickle.dumps([1])) == [1]


def test_a_view_larger_than_the_only_top_level_array_is_saved_whole(tmp_path: Path) -> None:
    """The statsmodels case, minimal: ``data["x"]`` views the memory ``head`` (a 10-item
    top-level slice) starts; it was saved as a view of ``head`` past its end, which numpy
    refused on load. A view is saved against a root only when its whole extent is in it."""
    blobs = Blobs(str(tmp_path))
    data = {"x": np.arange(100_000.0)[:]}
    values = {"data": data, "head": data["x"][:10], "rev": np.arange(50.0)[::-1], "after": 1}
    doc, failed = dump_namespace(values, {}, blobs)
    loaded, failed = load_namespace(doc, blobs)
    assert not failed
    assert loaded["data"]["x"].sum() == 4_999_950_000.0 and loaded["head"].tolist() == list(
        range(10)
    )
    assert loaded["rev"][0] == 49.0 and loaded["after"] == 1


class _SizeRaises:
    """Like torch's sparse tensors: ``nbytes`` raises RuntimeError, not AttributeError."""

    @property
    def nbytes(self) -> int:
        raise RuntimeError("nbytes is not defined for sparse tensors")


def test_a_value_whose_size_raises_does_not_stop_the_snapshots(tmp_path: Path) -> None:
    """The state's size estimate read ``nbytes`` of every variable; a torch sparse tensor
    raised there, the snapshot failed in the kernel, and snapshots were off for the rest
    of the run. The value is sized another way and saved like any other."""
    from spotbook.kernel.session import state_bytes

    assert state_bytes({"s": _SizeRaises(), "a": np.zeros(10)}) >= 80
    blobs = Blobs(str(tmp_path))
    doc, failed = dump_namespace({"s": _SizeRaises(), "after": 1}, {}, blobs)
    loaded, lost = load_namespace(doc, blobs)
    assert not failed and not lost and isinstance(loaded["s"], _SizeRaises)


def test_a_plotly_figure_keeps_its_arrays(tmp_path: Path) -> None:
    """plotly pickles a figure as its JSON form, where numpy arrays are base64 dicts:
    after a resume ``fig.data[0].y`` was ``{'dtype': 'i1', 'bdata': 'AQM='}``."""
    px = pytest.importorskip("plotly.express")
    figure = px.bar(x=["a", "b"], y=[1, 3], title="t")
    blobs = Blobs(str(tmp_path))
    doc, failed = dump_namespace({"fig": figure}, {}, blobs)
    loaded, lost = load_namespace(doc, blobs)
    again = loaded["fig"]
    assert not failed and not lost and type(again) is type(figure)
    assert isinstance(again.data[0].y, np.ndarray) and again.data[0].y.tolist() == [1, 3]
    assert again.layout.title.text == "t"
    assert json.loads(again.to_json()) == json.loads(figure.to_json())


def test_a_handle_is_never_restored_on_a_missing_or_shorter_file(tmp_path: Path) -> None:
    """A restored write handle used to be reopened create-if-missing and sought to its
    old position (a log came back as NUL bytes and the new lines), and a SQLite
    connection to a missing file made a new empty database. Now either refuses, so the
    variable is rebuilt by its cells or named."""
    from spotbook.kernel.pickling import reopen, restore_sqlite

    log = tmp_path / "train.log"
    with pytest.raises(FileNotFoundError, match="not here"):
        reopen(str(log), "a", 8, 8, {}, False)
    assert not log.exists()
    log.write_text("one\n")
    with pytest.raises(OSError, match="fewer than the 8"):
        reopen(str(log), "a", 8, 8, {}, False)
    handle = reopen(str(log), "a", 4, 4, {}, False)
    handle.write("two\n")
    handle.close()
    assert log.read_text() == "one\ntwo\n"
    with pytest.raises(FileNotFoundError, match="SQLite"):
        restore_sqlite(str(tmp_path / "gone.db"), None, "")
    assert not (tmp_path / "gone.db").exists()


def test_other_runs_stores_and_environments_are_not_the_runs_files(tmp_path: Path) -> None:
    """A sweep's points share a working directory: each point's store (and a venv, a
    sweep's own store) there is never captured as this run's files; a plain run.json is."""
    files, work, blobs = _files(tmp_path)
    for folder, markers in (
        ("sw/points/0", ("run.json", "input.ipynb")),
        ("sw", ("sweep.json",)),
        ("venv", ("pyvenv.cfg",)),
        ("results", ("run.json",)),
    ):
        (work / folder).mkdir(parents=True, exist_ok=True)
        for m in markers:
            (work / folder / m).write_text("{}")
    doc, _ = files.capture(str(blobs))
    kept = {os.path.relpath(p, work) for p in doc["entries"]}
    assert kept == {"results", "results/run.json"}
