"""Whoever can write a run store cannot make a resume run their code or change the result.

Two real runs of one notebook are stopped after three cells (SIGTERM, so an object store
also holds the checkpoint directory's manifest), once per store kind. Each case below
copies run A, changes one thing as an attacker with write access to the bucket would
(but without the run key, which never is in the store), and runs ``spotbook resume`` on
the copy. Every case must exit 2, name the object, leave no trace of the attacker's code,
and (where the check comes before the kernel starts) write nothing to the store.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spotbook.store.integrity import Key, Seal, load_key, safe_relpath
from spotbook.store.runstore import CellKey, RunStore

from .conftest import Place, cli, on, start_cli, wait_for, write_notebook

pytestmark = pytest.mark.slow

CELLS = (
    "import os, pathlib\nx = 100\n"
    "pathlib.Path(os.environ['SPOTBOOK_CHECKPOINT_DIR'], 'ck.txt').write_text('one')",
    "x += 21",
    "x += 21\nprint('y' * 3000)",
    "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.02)\nx += 100",
    "print(x)",
)
CANARY = "pwned"


class Evil:
    """A pickle that, loaded, creates the canary file in the working directory."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (CANARY, "w"))


@dataclass
class Template:
    kind: str
    env: dict[str, str]
    a: str  # run A's store (URL for this process)
    b: str  # run B: the same notebook, another run
    work: Path  # where the runs ran: a resumed kernel's working directory (restored)


def _stop_after_three(work: Path, rd: str, url: str, env: dict[str, str]) -> None:
    proc = start_cli(
        "run",
        "t.ipynb",
        "out.ipynb",
        "--run-dir",
        rd,
        "--snapshot",
        "every-cell",
        "--max-output-bytes",
        "1000",
        "--grace",
        "0",
        cwd=work,
        env=env,
    )
    wait_for(lambda: len(RunStore(url).cell_records()) >= 3, timeout=120, what="3 cells")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    # the snapshot attacks need one snapshot per committed cell (every-cell)
    store = RunStore(url)
    assert len(store.names("state/snap")) == 3, (store.attempts(), err)


def _template(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Template:
    work = tmp_path_factory.mktemp(f"tamper-{kind}")
    write_notebook(work / "t.ipynb", *CELLS)
    env: dict[str, str] = {}
    base = str(work)
    if kind != "local":
        st = request.getfixturevalue("storages")[kind]
        env, base = dict(st.env), st.bucket()
    runs = {n: f"{base}/{n}" for n in ("A", "B")}
    for url in runs.values():
        _stop_after_three(work, url, url, env)
    (work / "go").write_text("")  # a resumed run's fourth cell may go on
    return Template(kind, env, runs["A"], runs["B"], work)


# one fixture per store kind (not one parametrised fixture): each is made once per module
@pytest.fixture(scope="module")
def local(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Template:
    return _template("local", request, tmp_path_factory)


@pytest.fixture(scope="module")
def s3(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Template:
    return _template("s3", request, tmp_path_factory)


@pytest.fixture(params=["local", "s3"])
def template(request: pytest.FixtureRequest) -> Template:
    t: Template = request.getfixturevalue(request.param)
    return t


class Copy:
    """A copy of run A that a case tampers with, through the store's own client."""

    def __init__(self, template: Template, name: str, work: Path) -> None:
        self.t = template
        self.url = f"{template.a}-{name}" if template.kind != "local" else str(work / "rd")
        self.store = RunStore(self.url)
        _copy(RunStore(template.a), self.store)

    def names(self, rel_dir: str) -> list[str]:
        return self.store.names(rel_dir)

    def read(self, rel: str) -> bytes:
        data = self.store.read(rel)
        assert data is not None, rel
        return data

    def json(self, rel: str) -> Any:
        return json.loads(self.read(rel))

    def write(self, rel: str, data: bytes) -> None:
        self.store.write(rel, data)

    def put_json(self, rel: str, doc: Any) -> None:
        self.write(rel, json.dumps(doc).encode())

    def delete(self, rel: str) -> None:
        self.store.fs.rm(self.store.path(rel))

    def cells(self) -> list[str]:
        return [f"cells/{n}" for n in self.names("cells")]

    def lines(self) -> list[bytes]:
        return self.read("cells/a0001.jsonl").splitlines()

    def set_lines(self, lines: list[bytes]) -> None:
        self.write("cells/a0001.jsonl", b"\n".join(lines) + b"\n")

    def listing(self) -> dict[str, int]:
        found = self.store.fs.find(self.store.root, detail=True)
        return {p: int(info.get("size") or 0) for p, info in found.items()}


def _copy(src: RunStore, dst: RunStore) -> None:
    if src.local:
        shutil.copytree(src.root, dst.root, symlinks=True)
        return
    for path in src.fs.find(src.root):
        rel = path[len(src.root.rstrip("/")) + 1 :]
        dst.write(rel, bytes(src.fs.cat_file(path)))


def _last_snap(c: Copy) -> str:
    return f"state/snap/{c.names('state/snap')[-1]}"


# -- the attacks ---------------------------------------------------------------------
def evil_blob_resigned(c: Copy) -> str:
    """The first report: an evil pickle, its hash fixed, re-signed with a key object."""
    blob = pickle.dumps(Evil())
    digest = hashlib.sha256(blob).hexdigest()
    c.write(f"state/blobs/{digest}", blob)
    c.write("key", b"attacker-key")
    rel = _last_snap(c)
    doc = c.json(rel)
    doc["stream"]["stream"] = digest
    forged = Seal(Key(b"attacker-key", "the attacker"), doc["run_id"], c.url)
    c.put_json(rel, forged.sign(rel, doc))
    return rel


def evil_blob_in_place(c: Copy) -> str:
    doc = c.json(_last_snap(c))
    c.write(f"state/blobs/{doc['stream']['stream']}", pickle.dumps(Evil()))
    return "does not match its hash"


def input_cell_edited(c: Copy) -> str:
    nb = c.json("input.ipynb")
    nb["cells"][-1]["source"] = f"open({CANARY!r}, 'w')"
    c.put_json("input.ipynb", nb)
    return "input.ipynb"


def input_truncated(c: Copy) -> str:
    c.write("input.ipynb", c.read("input.ipynb")[:-40])
    return "input.ipynb"


def input_deleted(c: Copy) -> str:
    c.delete("input.ipynb")
    return "input.ipynb"


def attempt_from_other_run(c: Copy) -> str:
    c.write("attempts/0001.json", RunStore(c.t.b).read("attempts/0001.json") or b"")
    return "attempts/0001.json"


def spec_edited(c: Copy) -> str:
    run = c.json("run.json")
    run["spec"]["parameters"] = {"x": 1}
    c.put_json("run.json", run)
    return "run.json"


def seal_format_downgraded(c: Copy) -> str:
    """Format 1 sealed with the key itself: a writer who could make a store pass for one
    would have the cheap check of a guess back. Without the key, the id does not match."""
    run = c.json("run.json")
    run["seal"]["format"] = 1
    c.put_json("run.json", run)
    return "another key"


def seal_format_unknown(c: Copy) -> str:
    run = c.json("run.json")
    run["seal"]["format"] = 3
    c.put_json("run.json", run)
    return "sealed in format 3, which this spotbook does not know"


def seal_removed_key_added(c: Copy) -> str:
    run = c.json("run.json")
    del run["seal"]
    c.put_json("run.json", run)
    c.write("key", b"attacker-key")
    return "older spotbook"


def run_json_truncated(c: Copy) -> str:
    c.write("run.json", c.read("run.json")[:-30])
    return "run.json"


def run_json_from_other_run(c: Copy) -> str:
    c.write("run.json", RunStore(c.t.b).read("run.json") or b"")
    return "attempts/0001.json"  # the first object bound to run A that is read


def forged_completed_record(c: Copy) -> str:
    rec = {"index": 3, "attempt": 1, "status": "completed", "outputs": [], "seq": 4}
    if c.store.local:
        c.set_lines([*c.lines(), json.dumps(rec).encode()])
        return "cells/a0001.jsonl"
    c.put_json("cells/00003-a0001.json", rec)
    return "cells/00003-a0001"


def record_edited(c: Copy) -> str:
    if c.store.local:
        lines = c.lines()
        rec = json.loads(lines[1])
        rec["execution_count"] = 99
        lines[1] = json.dumps(rec).encode()
        c.set_lines(lines)
        return "cells/a0001.jsonl, line 2"
    rec = c.json("cells/00001-a0001.json")
    rec["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "forged"}]
    c.put_json("cells/00001-a0001.json", rec)
    return "cells/00001-a0001"


def record_moved_to_another_cell(c: Copy) -> str:
    if c.store.local:  # a line of another attempt's file
        c.write("cells/a0002.jsonl", c.read("cells/a0001.jsonl"))
        return "attempts/0002.json"
    c.write("cells/00003-a0001.json", c.read("cells/00001-a0001.json"))
    return "cells/00003-a0001"


def records_reordered(c: Copy) -> str:
    lines = c.lines()
    c.set_lines([lines[1], lines[0], *lines[2:]])
    return "cells/a0001.jsonl, line 1"


def record_duplicated(c: Copy) -> str:
    lines = c.lines()
    c.set_lines([*lines[:2], lines[1], *lines[2:]])
    return "cells/a0001.jsonl, line 3"


def middle_record_deleted(c: Copy) -> str:
    if c.store.local:
        lines = c.lines()
        c.set_lines([lines[0], *lines[2:]])
        return "cells/a0001.jsonl, line 2"
    c.delete("cells/00001-a0001.json")
    return "cell 1"


def garbage_line(c: Copy) -> str:
    lines = c.lines()
    c.set_lines([lines[0], b"{not json", *lines[1:]])
    return "cells/a0001.jsonl, line 2"


def run_json_nested_deep(c: Copy) -> str:
    c.write("run.json", b"[" * 100_000 + b"]" * 100_000)  # the parser's stack, not a run
    return "run.json is not valid JSON (nested too deeply)"


def run_json_a_list(c: Copy) -> str:
    c.write("run.json", b"[1, 2]")
    return "run.json holds no run (a JSON list"


def run_json_lone_surrogate(c: Copy) -> str:
    doc = c.json("run.json")
    doc["spec"]["source"] = "LONE"
    c.write("run.json", json.dumps(doc).replace("LONE", "\\ud800").encode())
    return "run.json is not valid JSON (not text"


def record_lone_surrogate(c: Copy) -> str:
    lines = c.lines()
    c.set_lines([lines[0].replace(b'"completed"', b'"\\ud800"'), *lines[1:]])
    return "cells/a0001.jsonl, line 1, is not a record"


def record_nested_deep(c: Copy) -> str:
    lines = c.lines()
    c.set_lines([b"[" * 100_000 + b"]" * 100_000, *lines[1:]])
    return "cells/a0001.jsonl, line 1, is not a record"


def cells_from_other_run(c: Copy) -> str:
    other = RunStore(c.t.b)
    for name in other.names("cells"):
        c.write(f"cells/{name}", other.read(f"cells/{name}") or b"")
    return "cells/"


def snapshot_after_changed(c: Copy) -> str:
    rel = _last_snap(c)
    doc = c.json(rel)
    doc["after"] = 0
    c.put_json(rel, doc)
    return rel


def older_snapshot_over_newer(c: Copy) -> str:
    names = c.names("state/snap")
    c.write(f"state/snap/{names[-1]}", c.read(f"state/snap/{names[0]}"))
    return f"state/snap/{names[-1]}"


def snapshot_from_other_run(c: Copy) -> str:
    other = RunStore(c.t.b)
    for name in other.names("state/blobs"):
        c.write(f"state/blobs/{name}", other.read(f"state/blobs/{name}") or b"")
    rel = _last_snap(c)
    c.write(rel, other.read(rel) or b"")
    return rel


def snapshot_truncated(c: Copy) -> str:
    rel = _last_snap(c)
    c.write(rel, c.read(rel)[:-20])
    return rel


def attempt_edited(c: Copy) -> str:
    doc = c.json("attempts/0001.json")
    doc["resumed_from"] = 2
    c.put_json("attempts/0001.json", doc)
    return "attempts/0001.json"


def attempt_deleted(c: Copy) -> str:
    c.delete("attempts/0001.json")
    return "attempts/0001.json"


def attempt_forged(c: Copy) -> str:
    c.put_json("attempts/0002.json", {"attempt": 2, "outcome": "restart", "resumed_from": 0})
    return "attempts/0002.json"


def attempt_truncated(c: Copy) -> str:
    c.write("attempts/0001.json", c.read("attempts/0001.json")[:-5])
    return "attempts/0001.json"


def files_manifest_escapes(c: Copy) -> str:
    """The first report: a checkpoint path that climbs out of the directory."""
    doc = c.json(f"files/{c.names('files')[-1]}")
    entry = next(iter(doc["files"].values()))
    doc["files"] = {f"../../../../tmp/{CANARY}-{os.getpid()}": entry}
    c.put_json("files/a0001-000099.json", doc)
    return "files/a0001-000099.json"


def files_manifest_escapes_signed(c: Copy) -> str:
    """Even a manifest carrying a good seal cannot place a file outside the directory."""
    doc = c.json(f"files/{c.names('files')[-1]}")
    entry = next(iter(doc["files"].values()))
    doc["files"] = {f"../../../../tmp/{CANARY}-{os.getpid()}": entry}
    run_id = c.json("run.json")["spec"]["run_id"]
    rel = "files/a0001-000099.json"
    c.put_json(rel, Seal(load_key(), run_id, c.url).sign(rel, doc))
    return "not a plain relative path"


def files_blob_replaced(c: Copy) -> str:
    doc = c.json(f"files/{c.names('files')[-1]}")
    digest = doc["files"]["ck.txt"]["sha256"]
    c.write(f"state/blobs/{digest}", b"evil checkpoint")
    return "does not match its hash"


def checkpoint_file_planted(c: Copy) -> str:
    """A local store once held the checkpoint directory itself, as plain files no seal
    covered: a pickle put there ran code when the notebook loaded it (issue 31). Now no
    plain file under files/ is used: it is refused by name."""
    c.write("files/ck.txt", pickle.dumps(Evil()))
    return "files/ck.txt is not a sealed checkpoint manifest"


def checkpoint_link_planted(c: Copy) -> str:
    """A link in the old checkpoint folder sent the notebook's writes out of the store."""
    os.symlink(f"/tmp/{CANARY}-{os.getpid()}", c.store.path("files/ck.txt"))
    return "files/ck.txt is not a sealed checkpoint manifest"


def symlinked_records(c: Copy) -> str:
    path = Path(c.store.path("cells/a0001.jsonl"))
    elsewhere = path.parent.parent / "elsewhere.jsonl"
    shutil.move(path, elsewhere)
    path.symlink_to(elsewhere)
    return "cells/a0001.jsonl is a symbolic link"


def symlinked_blob(c: Copy) -> str:
    doc = c.json(_last_snap(c))
    path = Path(c.store.path(f"state/blobs/{doc['stream']['stream']}"))
    elsewhere = path.parent.parent.parent / "blob"
    shutil.move(path, elsewhere)
    path.symlink_to(elsewhere)
    return "is a symbolic link"


def symlinked_state(c: Copy) -> str:
    path = Path(c.store.path("state"))
    elsewhere = path.parent.parent / "state-elsewhere"
    shutil.move(path, elsewhere)
    path.symlink_to(elsewhere)
    return "state is a symbolic link"


# name -> (attack, store kinds, refused before the kernel starts)
ATTACKS: dict[str, tuple[Callable[[Copy], str], tuple[str, ...], bool]] = {
    "evil blob re-signed with a key object": (evil_blob_resigned, ("local", "s3"), True),
    "evil blob in place": (evil_blob_in_place, ("local", "s3"), False),
    "input cell edited": (input_cell_edited, ("local", "s3"), True),
    "input truncated": (input_truncated, ("local", "s3"), True),
    "input deleted": (input_deleted, ("local", "s3"), True),
    "spec edited": (spec_edited, ("local", "s3"), True),
    "seal removed, key object added": (seal_removed_key_added, ("local", "s3"), True),
    "seal format downgraded": (seal_format_downgraded, ("local", "s3"), True),
    "seal format unknown": (seal_format_unknown, ("local", "s3"), True),
    "run.json truncated": (run_json_truncated, ("local", "s3"), True),
    "run.json of another run": (run_json_from_other_run, ("local", "s3"), True),
    "forged completed record": (forged_completed_record, ("local", "s3"), True),
    "record edited": (record_edited, ("local", "s3"), True),
    "record moved": (record_moved_to_another_cell, ("local", "s3"), True),
    "records reordered": (records_reordered, ("local",), True),
    "record duplicated": (record_duplicated, ("local",), True),
    "middle record deleted": (middle_record_deleted, ("local", "s3"), True),
    "garbage line": (garbage_line, ("local",), True),
    "records of another run": (cells_from_other_run, ("local", "s3"), True),
    "run.json nested deep": (run_json_nested_deep, ("local", "s3"), True),
    "run.json a list": (run_json_a_list, ("local", "s3"), True),
    "run.json with a lone surrogate": (run_json_lone_surrogate, ("local", "s3"), True),
    "record with a lone surrogate": (record_lone_surrogate, ("local",), True),
    "record nested deep": (record_nested_deep, ("local",), True),
    "snapshot after changed": (snapshot_after_changed, ("local", "s3"), True),
    "older snapshot over newer": (older_snapshot_over_newer, ("local", "s3"), True),
    "snapshot of another run": (snapshot_from_other_run, ("local", "s3"), True),
    "snapshot truncated": (snapshot_truncated, ("local", "s3"), True),
    "attempt edited": (attempt_edited, ("local", "s3"), True),
    "attempt deleted": (attempt_deleted, ("local", "s3"), True),
    "attempt forged": (attempt_forged, ("local", "s3"), True),
    "attempt truncated": (attempt_truncated, ("local", "s3"), True),
    "attempt of another run": (attempt_from_other_run, ("local", "s3"), True),
    "checkpoint path escapes": (files_manifest_escapes, ("local", "s3"), True),
    "checkpoint path escapes, signed": (files_manifest_escapes_signed, ("local", "s3"), True),
    "checkpoint blob replaced": (files_blob_replaced, ("local", "s3"), False),
    "checkpoint file planted in the store": (checkpoint_file_planted, ("local", "s3"), True),
    "checkpoint link planted in the store": (checkpoint_link_planted, ("local",), True),
    "symlinked records": (symlinked_records, ("local",), True),
    "symlinked blob": (symlinked_blob, ("local",), True),
    "symlinked state": (symlinked_state, ("local",), True),
}


def _cases() -> list[Any]:
    return [
        pytest.param(kind, name, id=f"{kind}-{name}")
        for name, (_, kinds, _) in ATTACKS.items()
        for kind in kinds
    ]


@pytest.mark.parametrize(("kind", "attack"), _cases())
def test_tampered_store_is_refused(
    kind: str, attack: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    template: Template = request.getfixturevalue(kind)
    fn, _, before_kernel = ATTACKS[attack]
    copy = Copy(template, f"c-{tmp_path.name}", tmp_path)
    (tmp_path / "go").write_text("")
    named = fn(copy)
    before = copy.listing()
    r = cli("resume", copy.url, cwd=tmp_path, env=template.env)
    assert r.returncode == 2, (attack, r.returncode, r.stderr)
    assert named in r.stderr, (named, r.stderr)
    assert "Traceback" not in r.stderr
    for where in (tmp_path, template.work, Path("/tmp")):
        assert not list(where.glob(f"{CANARY}*")), where
    if before_kernel:  # refused before anything was written: no attempt, no record
        assert copy.listing() == before


def test_untampered_copy_resumes(template: Template, tmp_path: Path) -> None:
    """The control: the same copy, unchanged, resumes to the uninterrupted result."""
    copy = Copy(template, f"ok-{tmp_path.name}", tmp_path)
    (tmp_path / "go").write_text("")
    r = cli("resume", copy.url, cwd=tmp_path, env=template.env)
    assert r.returncode == 0, r.stderr
    out = json.loads(RunStore(copy.url).read("output.ipynb") or b"")
    assert "".join(out["cells"][-1]["outputs"][0]["text"]).strip() == "242"
    # the checkpoint file came back from the store's sealed manifest, local or not
    assert "ck.txt" in json.dumps(RunStore(copy.url).files_manifest())


def _as_format_one(c: Copy) -> None:
    """Re-seal the copy as a spotbook before the derived key sealed it (format 1: the
    HMACs made with the key itself, run.json recording the key's id of then)."""
    key = load_key()
    run = c.json("run.json")
    run_id = run["spec"]["run_id"]
    old = Seal(key, run_id, c.url, fmt=1)
    info = {k: v for k, v in run["seal"].items() if k != "mac"}
    info.update(format=1, key_id=key.id_for(1))
    run["seal"] = {**info, "mac": old.mac("run.json", {"spec": run["spec"], **info})}
    c.put_json("run.json", run)
    for d in ("cells", "attempts", "state/snap", "files"):
        for name in c.names(d):
            rel = f"{d}/{name}"
            if name.endswith(".jsonl"):  # a local store's records: one sealed line each
                docs = [json.loads(line) for line in c.read(rel).splitlines() if line]
                c.set_lines([
                    json.dumps(old.sign(f"cells/{CellKey(r['index'], r['attempt']).name[:-5]}",
                                        {k: v for k, v in r.items() if k != "mac"})).encode()
                    for r in docs
                ])  # fmt: skip
            elif name.endswith(".json"):
                doc = c.json(rel)
                # a record's place is its cell and attempt, without the object's suffix
                place = rel[:-5] if d == "cells" else rel
                if isinstance(doc, dict) and "mac" in doc:
                    c.put_json(rel, old.sign(place, {k: v for k, v in doc.items() if k != "mac"}))


def test_a_store_sealed_with_the_key_itself_still_resumes(
    template: Template, tmp_path: Path
) -> None:
    """Runs sealed before the derived key (format 1) resume to their end in format 1: the
    records the resume adds are checked with the key itself, as the older ones are, and
    `spotbook run` of the same notebook, which re-seals run.json, keeps that format. (On
    the same node, not a wiped one: what it checks is the seal's format, which the node
    does not change; test_node_loss resumes sealed stores on wiped nodes.)"""
    copy = Copy(template, f"f1-{tmp_path.name}", tmp_path)
    _as_format_one(copy)
    fresh = RunStore(copy.url)
    assert fresh.unseal()["seal"]["format"] == 1 and fresh.seal is not None
    assert fresh.seal.format == 1
    (tmp_path / "go").write_text("")
    r = cli("run", str(template.work / "t.ipynb"), "--run-dir", copy.url, "--snapshot",
            "every-cell", "--max-output-bytes", "1000", cwd=tmp_path, env=template.env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(RunStore(copy.url).read("output.ipynb") or b"")
    assert "".join(out["cells"][-1]["outputs"][0]["text"]).strip() == "242"
    after = RunStore(copy.url)
    seal = after.unseal()["seal"]
    assert seal["format"] == 1 and seal["generation"] == 1, seal
    assert len(after.cell_records()) == len(CELLS)  # every record checks in format 1
    # and a run made now is sealed with the derived key, its id not the key's own
    made = RunStore(template.a).unseal()["seal"]
    assert made["format"] == 2 and made["key_id"] == load_key().id != load_key().id_for(1)


def test_logs_show_a_cut_output_whole_and_refuse_a_changed_one(
    template: Template, tmp_path: Path
) -> None:
    """The text a cell printed past --max-output-bytes is in the store whole; its hash is
    in the cell's sealed record. `spotbook logs` shows it as printed, and refuses it
    (exit 2, by name) once someone without the key changed it."""
    copy = Copy(template, f"spill-{tmp_path.name}", tmp_path)
    r = cli("logs", copy.url, cwd=tmp_path, env=template.env)
    assert r.returncode == 0, r.stderr
    assert "y" * 3000 in r.stdout and "characters omitted" not in r.stdout
    rel = copy.store.cell_records()[2]["spilled"]["path"]
    copy.write(rel, b"z" * 3000)
    r = cli("logs", copy.url, cwd=tmp_path, env=template.env)
    assert r.returncode == 2 and rel in r.stderr and "does not match" in r.stderr, r.stderr
    assert "z" * 100 not in r.stdout and "Traceback" not in r.stderr


def test_wrong_key_is_named(template: Template, tmp_path: Path) -> None:
    copy = Copy(template, f"key-{tmp_path.name}", tmp_path)
    env = {**template.env, "SPOTBOOK_SNAPSHOT_KEY": "not the run's key, " * 2}
    r = cli("resume", copy.url, cwd=tmp_path, env=env)
    assert r.returncode == 2 and "another key" in r.stderr, r.stderr


# -- paths and permissions -------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        "../x",
        "a/../../x",
        "/etc/passwd",
        "C:/x",
        "c:x",
        "a\\..\\x",
        "",
        ".",
        "a//b",
        "a/./b",
        "..",
        "x/..",
        "a\x00b",
        "a\nb",
    ],
)
def test_paths_from_a_store_must_stay_inside(bad: str) -> None:
    from spotbook._errors import StoreIntegrityError

    with pytest.raises(StoreIntegrityError):
        safe_relpath(bad, "a manifest")


def test_plain_relative_paths_pass() -> None:
    assert safe_relpath("sub/dir/model.pt", "m") == "sub/dir/model.pt"
    assert safe_relpath("..hidden/x..y", "m") == "..hidden/x..y"


def _modes(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath, name)
            out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    out["."] = stat.S_IMODE(root.stat().st_mode)
    return out


def test_local_store_and_key_are_private_under_umask_022(tmp_path: Path) -> None:
    write_notebook(tmp_path / "t.ipynb", "import os\nx = 1", "y = [x] * 3", "print(y)")
    config = tmp_path / "config"
    env = {"SPOTBOOK_CONFIG_DIR": str(config)}
    script = (
        "import os, subprocess, sys; os.umask(0o022); "
        "sys.exit(subprocess.call([sys.executable, '-m', 'spotbook', 'run', 't.ipynb', "
        "'out.ipynb', '--run-dir', 'rd', '--snapshot', 'every-cell']))"
    )
    r = subprocess.run(
        [os.environ.get("PYTHON", __import__("sys").executable), "-c", script],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    modes = _modes(tmp_path / "rd")
    assert {"cells", "state", "state/blobs", "state/snap", "attempts", "files"} <= set(modes)
    for rel, mode in modes.items():
        p = tmp_path / "rd" / rel
        want = 0o700 if p.is_dir() else 0o600
        assert mode == want, (rel, oct(mode))
    assert stat.S_IMODE((config / "key").stat().st_mode) == 0o600
    assert stat.S_IMODE(config.stat().st_mode) == 0o700
    assert not (tmp_path / "rd" / "key").exists()  # the key is never in the store


def test_processes_starting_together_agree_on_one_new_key(tmp_path: Path) -> None:
    """The first runs on a fresh machine (a sweep's points) make the key at once: each
    gets the whole key, the same one, and no half-written file is ever read."""
    config, gate = tmp_path / "config", tmp_path / "go"
    script = (
        "import os, sys, time\n"
        "from spotbook.store.integrity import load_key\n"
        "open(sys.argv[2], 'w').close()\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    time.sleep(0.0005)  # a poll: the test's gate file is the event\n"
        "print(load_key().secret.hex())\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(gate), str(tmp_path / f"ready{i}")],
            env={**os.environ, "SPOTBOOK_CONFIG_DIR": str(config)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(12)
    ]
    wait_for(lambda: all((tmp_path / f"ready{i}").exists() for i in range(12)), what="ready")
    gate.touch()  # all twelve at the gate: they make the key at once
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    keys = {out.strip() for out, _ in results}
    assert len(keys) == 1 and len(keys.pop()) == 128  # 64 hex characters, as bytes in hex
    assert sorted(os.listdir(config)) == ["key"]  # no temporary file left beside it


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "key").write_text("k" * 64)
    (config / "key").chmod(0o644)
    write_notebook(tmp_path / "t.ipynb", "x = 1")
    r = cli("run", "t.ipynb", "out.ipynb", cwd=tmp_path, env={"SPOTBOOK_CONFIG_DIR": str(config)})
    assert r.returncode == 2 and "chmod 600" in r.stderr, r.stderr


def test_the_key_never_reaches_the_notebook(tmp_path: Path) -> None:
    write_notebook(
        tmp_path / "t.ipynb",
        "import os\nprint(sorted(k for k in os.environ if 'SNAPSHOT_KEY' in k))",
    )
    env = {"SPOTBOOK_SNAPSHOT_KEY": "k-secret-value" * 3}
    r = cli("run", "t.ipynb", "out.ipynb", "--run-dir", "rd", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "out.ipynb").read_text()
    assert "[]" in text and "k-secret-value" * 3 not in text
    for p in (tmp_path / "rd").rglob("*"):
        if p.is_file():
            assert b"k-secret-value" * 3 not in p.read_bytes(), p


def test_a_run_written_by_the_previous_format_is_refused_unless_trusted(tmp_path: Path) -> None:
    """A store from before the seal (key object inside) resumes only on request."""
    write_notebook(tmp_path / "t.ipynb", "x = 1", "import os\nassert os.path.exists('go')")
    r = cli("run", "t.ipynb", "out.ipynb", "--run-dir", "rd", cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # the second cell fails: a run to resume
    store = RunStore(str(tmp_path / "rd"))
    run = store.read_json("run.json")
    del run["seal"]  # what the previous version wrote: no seal, a key object
    store.write_json("run.json", run)
    store.write("key", b"legacy-key")
    shutil.copytree(tmp_path / "rd", tmp_path / "other")  # another store of that format
    (tmp_path / "go").write_text("")
    r = cli("resume", "rd", cwd=tmp_path)
    assert r.returncode == 2 and f"`spotbook trust {tmp_path / 'rd'}`" in r.stderr, r.stderr
    # the old variable trusts no store by itself any more: trust is per store
    r = cli("resume", "rd", cwd=tmp_path, env={"SPOTBOOK_TRUST_LEGACY_STORE": "1"})
    assert r.returncode == 2 and "no longer trusts every such store" in r.stderr, r.stderr
    r = cli("trust", "rd", cwd=tmp_path)
    assert r.returncode == 0 and "trusting" in r.stderr, r.stderr
    r = cli("resume", "rd", "--strict-resume", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    # a worker (a pod: the variable may come through envFrom) never takes the variable
    env = {"SPOTBOOK_TRUST_LEGACY_STORE": "1", "SPOTBOOK_RUN_DIR": str(tmp_path / "other")}
    r = cli("worker", cwd=tmp_path, env=env)
    assert r.returncode == 2 and "is ignored by spotbook worker" in r.stderr, r.stderr
    r = cli("resume", "other", cwd=tmp_path)  # trusting one store trusts no other
    assert r.returncode == 2 and "spotbook trust" in r.stderr, r.stderr
    r = cli("resume", "rd", cwd=tmp_path)
    assert r.returncode == 0 and "older spotbook" in r.stderr, r.stderr
    # a sealed store has nothing to trust; trust can be taken back
    assert cli("trust", "--remove", "rd", cwd=tmp_path).returncode == 0
    write_notebook(tmp_path / "s.ipynb", "x = 1")
    assert cli("run", "s.ipynb", "s.out.ipynb", "--run-dir", "sealed", cwd=tmp_path).returncode == 0
    r = cli("trust", "sealed", cwd=tmp_path)
    assert r.returncode == 2 and "nothing to trust" in r.stderr, r.stderr


@on("local", "s3")
def test_a_restart_cannot_be_undone_by_deleting_what_it_wrote(place: Place, work: Path) -> None:
    """A run, then --restart with another value; a writer of the store deletes what the
    restart wrote (its attempts and records). The old run's objects still carry valid
    seals, but of the old run's id: the resume refuses them, never resuming the old run
    under the new one's name (it once exited 0 with the old value)."""
    write_notebook(
        work / "t.ipynb",
        "import os\nlr = os.environ['LR']",
        "assert os.path.exists('go')",
        "print('lr', lr)",
    )
    argv = ("run", "t.ipynb", "out.ipynb", "--run-dir", place.rd)
    r = cli(*argv, cwd=work, env={**place.env, "LR": "0.5"})
    assert r.returncode == 1, r.stderr
    old_id = place.store().require_run()["spec"]["run_id"]
    r = cli(*argv, "--restart", cwd=work, env={**place.env, "LR": "0.1"})
    assert r.returncode == 1, r.stderr
    store = place.store()
    assert store.require_run()["spec"]["run_id"] != old_id
    for folder in ("attempts", "cells"):
        for name in store.names(folder):
            if not name.startswith(("0001", "a0001")):  # the restart's attempts and records
                store.fs.rm(store.path(f"{folder}/{name}"))
    (work / "go").write_text("")
    r = cli("resume", place.rd, cwd=work, env={**place.env, "LR": "0.1"})
    assert r.returncode == 2, r.stderr
    assert "attempts/0001.json" in r.stderr, r.stderr
    assert not (work / "out.ipynb").exists() or "lr 0.5" not in (work / "out.ipynb").read_text()


@on("local", "s3")
def test_an_older_run_json_put_back_is_refused(place: Place, work: Path) -> None:
    """The same command again with --strict-resume re-seals run.json; a writer puts back
    the one from before (a valid seal, of this run) to drop the flag. Every attempt since
    carries the newer run.json's generation: the resume refuses the older one."""
    write_notebook(work / "t.ipynb", "x = 1", "import os\nassert os.path.exists('go')")
    argv = ("run", "t.ipynb", "out.ipynb", "--run-dir", place.rd)
    r = cli(*argv, cwd=work, env=place.env)
    assert r.returncode == 1, r.stderr
    older = place.store().read("run.json")
    assert older is not None
    r = cli(*argv, "--strict-resume", cwd=work, env=place.env)
    assert r.returncode == 1, r.stderr
    assert place.store().require_run()["spec"]["strict_resume"]
    place.store().write("run.json", older)
    (work / "go").write_text("")
    r = cli("resume", place.rd, cwd=work, env=place.env)
    assert r.returncode == 2, r.stderr
    assert "run.json is older than" in r.stderr and "put back" in r.stderr, r.stderr


def test_restart_discards_a_tampered_history(tmp_path: Path) -> None:
    """--restart starts over even where the old records no longer check."""
    write_notebook(tmp_path / "t.ipynb", "x = 1", "import os\nassert os.path.exists('go')")
    r = cli("run", "t.ipynb", "out.ipynb", "--run-dir", "rd", cwd=tmp_path)
    assert r.returncode == 1
    store = RunStore(str(tmp_path / "rd"))
    store.write("cells/a0001.jsonl", b'{"index": 0, "status": "completed"}\n')
    (tmp_path / "go").write_text("")
    assert cli("resume", "rd", cwd=tmp_path).returncode == 2
    r = cli("run", "t.ipynb", "out.ipynb", "--run-dir", "rd", "--restart", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_a_whole_other_store_put_in_a_runs_place_is_refused(tmp_path: Path) -> None:
    """Run B's store, sealed with the same key (every run of a cluster shares its Secret's
    key), copied over run A's: each of its objects is validly sealed, for B. Named by A's
    id (`spotbook resume A`), and in a pod of the Job submitted for A (SPOTBOOK_RUN_ID),
    it is refused with exit 2, before an attempt is claimed; named by its place (a path or
    URL: stores move), it is B, and resumes as B."""
    write_notebook(
        tmp_path / "t.ipynb", "import os\nlr = os.environ['LR']", "assert os.path.exists('go')",
        "print('lr', lr)",
    )  # fmt: skip
    for name, lr in (("a", "0.1"), ("b", "0.5")):
        r = cli("run", "t.ipynb", f"{name}.ipynb", "--run-dir", f"runs/{name}", cwd=tmp_path,
                env={"LR": lr})  # fmt: skip
        assert r.returncode == 1, r.stderr  # stopped at cell 1, as a kill would leave it
    a_id = RunStore(str(tmp_path / "runs" / "a")).require_run()["spec"]["run_id"]
    shutil.rmtree(tmp_path / "runs" / "a")
    shutil.copytree(tmp_path / "runs" / "b", tmp_path / "runs" / "a")
    (tmp_path / "go").write_text("")
    before = sorted((tmp_path / "runs" / "a" / "attempts").iterdir())
    r = cli("resume", a_id, cwd=tmp_path, env={"LR": "0.1"})
    assert r.returncode == 2, r.stderr
    assert f"not run '{a_id}'" in r.stderr and "another run's store" in r.stderr, r.stderr
    pod = {
        "SPOTBOOK_RUN_DIR": str(tmp_path / "runs" / "a"),
        "SPOTBOOK_RUN_ID": a_id,
        "POD_NAME": "p1",
        "NODE_NAME": "n1",
        "LR": "0.1",
    }
    r = cli("worker", cwd=tmp_path, env=pod)
    assert r.returncode == 2, r.stderr
    assert f"not run '{a_id}'" in r.stderr, r.stderr
    assert sorted((tmp_path / "runs" / "a" / "attempts").iterdir()) == before
    b_id = RunStore(str(tmp_path / "runs" / "b")).require_run()["spec"]["run_id"]
    r = cli("resume", "runs/a", cwd=tmp_path, env={"LR": "0.5"})
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "b.ipynb").read_text())  # B's own OUTPUT: it is B
    assert out["metadata"]["spotbook"]["run_id"] == b_id
