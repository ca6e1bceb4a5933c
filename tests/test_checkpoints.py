"""Checkpoint-directory sync (object stores) and what an attempt records about where it ran."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
from pathlib import Path

import pytest

from spotbook._errors import StoreIntegrityError, SupersededError
from spotbook.store.checkpoints import CheckpointDir
from spotbook.store.runstore import RunStore

from .conftest import cli


def _store() -> RunStore:
    return RunStore(f"memory://ckpt-{secrets.token_hex(4)}")


def test_sync_uploads_only_what_changed_and_restores_it(tmp_path: Path) -> None:
    store, src = _store(), tmp_path / "a"
    (src / "sub").mkdir(parents=True)
    (src / "model.bin").write_bytes(b"x" * 100_000)
    (src / "sub" / "state.json").write_text('{"epoch": 1}')
    ck = CheckpointDir(store, str(src), attempt=1)
    first = ck.sync()
    assert (first.files, first.uploaded_files, first.uploaded_bytes) == (2, 2, 100_012)
    again = ck.sync()  # nothing changed: nothing uploaded, no new manifest
    assert again.uploaded_bytes == 0 and len(store.names("files")) == 1
    (src / "sub" / "state.json").write_text('{"epoch": 2}')
    third = ck.sync()
    assert third.uploaded_files == 1 and len(store.names("files")) == 2

    dst = tmp_path / "b"
    dst.mkdir()
    fetched = CheckpointDir(store, str(dst), attempt=2).restore(store.files_manifest())
    assert fetched == 100_012
    assert (dst / "sub" / "state.json").read_text() == '{"epoch": 2}'
    assert (dst / "model.bin").read_bytes() == b"x" * 100_000


def test_newest_attempts_manifest_wins(tmp_path: Path) -> None:
    store = _store()
    for attempt, text in ((1, "old"), (2, "new")):
        d = tmp_path / str(attempt)
        d.mkdir()
        (d / "f").write_text(text)
        CheckpointDir(store, str(d), attempt).sync()
    out = tmp_path / "out"
    out.mkdir()
    CheckpointDir(store, str(out), 3).restore(store.files_manifest())
    assert (out / "f").read_text() == "new"


def test_a_superseded_attempt_writes_no_manifest(tmp_path: Path) -> None:
    store, src = _store(), tmp_path / "a"
    src.mkdir()
    assert store.claim_attempt({"outcome": "running"}) == 1
    ck = CheckpointDir(store, str(src), 1)
    (src / "f").write_text("first")
    ck.sync()
    # a new attempt starts (the old pod lives on behind a network partition)
    assert store.claim_attempt({"outcome": "running"}) == 2
    (src / "f").write_text("stale")
    with pytest.raises(SupersededError):
        ck.sync()
    assert store.names("files") == ["a0001-000001.json"]
    out = tmp_path / "out"
    out.mkdir()
    CheckpointDir(store, str(out), 3).restore(store.files_manifest())
    assert (out / "f").read_text() == "first"


def test_a_corrupted_blob_is_not_restored(tmp_path: Path) -> None:
    store, src = _store(), tmp_path / "a"
    src.mkdir()
    (src / "f").write_text("good")
    CheckpointDir(store, str(src), 1).sync()
    manifest = store.files_manifest()
    assert manifest is not None
    store.write(store.blob_path(manifest["files"]["f"]["sha256"]), b"evil")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(StoreIntegrityError, match="does not match its hash"):
        CheckpointDir(store, str(out), 2).restore(store.files_manifest())
    assert not (out / "f").exists()


def test_attempt_records_gpus_from_nvidia_smi(work: Path) -> None:
    """A stand-in nvidia-smi (a real executable on PATH) answers the query."""
    bin_dir = work / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--query-gpu=index,name,memory.total,driver_version,uuid*) ;;'
        " *) exit 9;; esac\n"
        'echo "0, NVIDIA L4, 23034, 550.90.07, GPU-1234"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SPOTBOOK_IMAGE": "img:1"}
    r = cli("run", "params.ipynb", "--run-dir", "rd", cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(cli("status", "rd", "--json", cwd=work).stdout)
    (attempt,) = doc["attempts"]
    assert attempt["gpus"] == [
        {
            "index": "0",
            "name": "NVIDIA L4",
            "memory.total": "23034",
            "driver_version": "550.90.07",
            "uuid": "GPU-1234",
        }
    ]
    assert attempt["image"] == "img:1"
    text = cli("status", "rd", cwd=work).stdout
    assert "gpus 1: NVIDIA L4 (23034 MiB)" in text and "image img:1" in text


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="opt-in: needs nvidia-smi")
def test_attempt_records_the_machines_real_gpus(work: Path) -> None:
    r = cli("run", "params.ipynb", "--run-dir", "rd", cwd=work)
    assert r.returncode == 0, r.stderr
    (attempt,) = json.loads(cli("status", "rd", "--json", cwd=work).stdout)["attempts"]
    assert attempt["gpus"] and all(g["name"] and g["uuid"] for g in attempt["gpus"])
