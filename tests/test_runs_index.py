"""Runs are easy to find again: `spotbook runs` lists every run this user started on this
machine, wherever its store is, with its times and parameters; a run id works from any
folder; `runs rm` and `runs gc` delete old runs, never a running one. Real CLI, real
kernels; each test has an index of its own (conftest's SPOTBOOK_DATA_DIR)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from spotbook.store.index import index_dir

from .conftest import cli, start_cli, wait_for, write_notebook

pytestmark = pytest.mark.slow


def _notebook(path: Path, *sources: str) -> None:
    write_notebook(path, "x = 1", *sources)
    doc = json.loads(path.read_text())
    doc["cells"][0]["metadata"]["tags"] = ["parameters"]
    path.write_text(json.dumps(doc))


def _ids(where: Path, *flags: str) -> list[str]:
    r = cli("runs", "--json", *flags, cwd=where)
    assert r.returncode == 0, r.stderr
    return [d["run_id"] for d in json.loads(r.stdout)]


def test_runs_lists_every_run_this_user_started_from_any_folder(tmp_path: Path) -> None:
    a, b, elsewhere = (tmp_path / n for n in ("a", "b", "elsewhere"))
    for d in (a, b, elsewhere):
        d.mkdir()
    _notebook(a / "nb.ipynb", "print(x)")
    _notebook(b / "nb.ipynb", "print(x * 10)")
    r = cli("run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", "-p", "x", "2", cwd=a)
    assert r.returncode == 0, r.stderr
    assert cli("run", "nb.ipynb", "out.ipynb", cwd=b).returncode == 0
    run_a = json.loads((a / "rd" / "run.json").read_text())["spec"]["run_id"]
    (run_b,) = os.listdir(b / ".spotbook" / "runs")
    # what the index cannot trust is skipped, never read without end: a FIFO, a huge
    # file, a folder, a link, an entry that is not one
    idx = Path(index_dir())
    os.mkfifo(idx / "fifo.json")
    (idx / "huge.json").write_bytes(b"{" + b" " * (1 << 20) + b"}")
    (idx / "dir.json").mkdir()
    (idx / "link.json").symlink_to(idx / f"{run_a}.json")
    (idx / "list.json").write_text("[1, 2]")

    assert _ids(elsewhere) == sorted([run_a, run_b], reverse=True)
    r = cli("runs", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    row_a = next(line for line in r.stdout.splitlines() if line.startswith(run_a))
    assert "succeeded" in row_a and "x=2" in row_a and str(a / "rd") in row_a, r.stdout
    header = r.stdout.splitlines()[0].split()
    assert header[:6] == ["RUN", "NAME", "STATUS", "CELLS", "STARTED", "TOOK"]
    assert header[6:9] == ["TRIES", "PREEMPT", "PARAMETERS"]
    assert row_a.split()[1] == "rd"  # a --run-dir run is named by its folder
    # a run id works from any folder (the README's `spotbook status r1`)
    r = cli("status", run_b, "--json", cwd=elsewhere)
    assert r.returncode == 0 and json.loads(r.stdout)["run_dir"].startswith(str(b)), r.stderr
    assert _ids(elsewhere, "--status", "succeeded", "--since", "1h") == _ids(elsewhere)
    assert _ids(elsewhere, "--status", "failed") == []
    r = cli("runs", "--since", "soon", cwd=elsewhere)
    assert r.returncode == 2 and "--since 'soon'" in r.stderr, r.stderr


def test_rm_and_gc_delete_old_runs_but_never_a_running_one(tmp_path: Path) -> None:
    _notebook(tmp_path / "nb.ipynb", "print(x)")
    for n in range(3):
        r = cli("run", "nb.ipynb", f"out{n}.ipynb", "--run-dir", f"rd{n}", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    newest_first = _ids(tmp_path)
    assert len(newest_first) == 3

    r = cli("runs", "gc", "--keep", "1", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0 and "would remove 2 run(s)" in r.stderr, r.stderr
    assert _ids(tmp_path) == newest_first  # nothing deleted
    r = cli("runs", "gc", cwd=tmp_path)
    assert r.returncode == 2 and "needs a retention rule" in r.stderr, r.stderr
    r = cli("runs", "gc", "--keep", "1", cwd=tmp_path)
    assert r.returncode == 0 and "removed 2 run(s)" in r.stderr, r.stderr
    assert _ids(tmp_path) == newest_first[:1]
    assert sorted(p.name for p in tmp_path.glob("rd*")) == ["rd2"]  # the newest

    # a running run is never deleted
    _notebook(
        tmp_path / "gated.ipynb",
        "import os, time\n"
        "open('started', 'w').close()\n"
        "while not os.path.exists('go'):\n"
        "    time.sleep(0.01)",
    )
    proc = start_cli("run", "gated.ipynb", "--run-dir", "live", cwd=tmp_path)
    try:
        wait_for(lambda: (tmp_path / "started").exists(), timeout=120, what="the gated cell")
        r = cli("runs", "rm", "live", cwd=tmp_path)
        assert r.returncode == 2 and "stop it first" in r.stderr, r.stderr
        assert (tmp_path / "live" / "run.json").exists()
        r = cli("runs", "gc", "--keep", "0", cwd=tmp_path)
        assert r.returncode == 0 and "kept" in r.stderr and "running" in r.stderr, r.stderr
        assert (tmp_path / "live" / "run.json").exists() and not (tmp_path / "rd2").exists()
    finally:
        (tmp_path / "go").write_text("")
        proc.communicate(timeout=120)
    r = cli("runs", "rm", "live", "nosuch", cwd=tmp_path)
    assert r.returncode == 2 and "no spotbook run" in r.stderr, r.stderr  # the one it could not
    assert not (tmp_path / "live").exists() and _ids(tmp_path) == []
    assert proc.returncode == 0


@pytest.mark.parametrize("where", ["run.json", "cells/a0001.jsonl", "attempts/0001.json"])
def test_a_fifo_in_a_store_is_refused_never_waited_on(tmp_path: Path, where: str) -> None:
    """A writer of a local store plants a FIFO where a file belongs: every command that
    reads it says so (exit 2) instead of waiting for a writer that never comes, and
    `runs` lists the other runs and names the bad store."""
    _notebook(tmp_path / "nb.ipynb", "print(x)")
    for rd in ("good", "bad"):
        r = cli("run", "nb.ipynb", "--run-dir", rd, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    good = _ids(tmp_path)
    (tmp_path / "bad" / where).unlink()
    os.mkfifo(tmp_path / "bad" / where)
    for argv in (["status", "bad"], ["resume", "bad"], ["logs", "bad"]):
        r = cli(*argv, cwd=tmp_path, timeout=60)  # a hang fails here
        assert r.returncode == 2, (argv, r.stderr)
        assert f"bad/{where} is a FIFO" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = cli("runs", "--json", cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and f"bad/{where} is a FIFO" in r.stderr, r.stderr
    assert [d["run_id"] for d in json.loads(r.stdout)] == [
        i for i in good if (tmp_path / "good" / "run.json").read_text().count(i)
    ]


@pytest.mark.parametrize(
    ("where", "size"),
    [("run.json", 65 << 20), ("attempts/0001.json", 65 << 20), ("cells/a0001.jsonl", 1025 << 20)],
)
def test_a_huge_document_in_a_store_is_refused(tmp_path: Path, where: str, size: int) -> None:
    """A writer of a local store makes a document huge (a sparse file here): commands
    refuse it by its size, exit 2, having read no more than the bound (64 MiB for a
    document, 1 GiB for an attempt's records), never the whole file."""
    _notebook(tmp_path / "nb.ipynb", "print(x)")
    assert cli("run", "nb.ipynb", "--run-dir", "rd", cwd=tmp_path).returncode == 0
    with open(tmp_path / "rd" / where, "r+b") as fh:
        fh.truncate(size)
    for argv in (["status", "rd"], ["resume", "rd"]):
        r = cli(*argv, cwd=tmp_path)
        assert r.returncode == 2, (argv, r.stderr)
        assert f"rd/{where} is larger than the" in r.stderr and "Traceback" not in r.stderr


def test_a_named_run_is_found_by_its_name_from_any_folder(tmp_path: Path) -> None:
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    _notebook(here / "nb.ipynb", "print(x)")
    r = cli("run", "nb.ipynb", "out.ipynb", "--name", "exp1", "-p", "x", "3", cwd=here)
    assert r.returncode == 0, r.stderr
    assert (here / ".spotbook" / "runs" / "exp1" / "run.json").exists()
    run_id = json.loads((here / ".spotbook/runs/exp1/run.json").read_text())["spec"]["run_id"]
    r = cli("status", "exp1", "--json", cwd=elsewhere)
    assert r.returncode == 0 and json.loads(r.stdout)["run_id"] == run_id, r.stderr
    r = cli("runs", cwd=elsewhere)
    (row,) = [line for line in r.stdout.splitlines() if line.startswith(run_id)]
    assert row.split()[1] == "exp1" and "x=3" in row, r.stdout
    r = cli("logs", "exp1", cwd=elsewhere)
    assert r.returncode == 0 and "\n3\n" in r.stdout, r.stdout
    # the same --name again is the same run (it finished: OUTPUT is written again)
    r = cli("run", "nb.ipynb", "out.ipynb", "--name", "exp1", "-p", "x", "3", cwd=here)
    assert r.returncode == 0 and run_id in r.stderr, r.stderr
