"""One suite of run-store behaviour that every storage backend runs, as fsspec runs one
suite against each of its implementations: this machine's disk, fsspec's memory
filesystem, and the S3, GCS and Azure emulators on loopback (S3 and GCS behind the
fault proxy). What differs between backends is in ``spotbook.store.backends``; what a
run store promises is here.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotbook.store.backends import LocalBackend, ObjectBackend
from spotbook.store.integrity import load_key
from spotbook.store.runstore import RunStore

BACKENDS = ["local", "memory", "s3", "gs", "az"]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new, empty run store location on the backend."""
    kind: str = request.param
    if kind == "local":
        yield str(tmp_path / "rd")
    elif kind == "memory":
        where = f"memory://contract-{secrets.token_hex(6)}/rd"
        yield where
        import fsspec

        with contextlib.suppress(FileNotFoundError):
            fsspec.filesystem("memory").rm(where.split("://", 1)[1].split("/")[0], recursive=True)
    else:
        yield f"{request.getfixturevalue('storages')[kind].bucket()}/rd"


def _sealed(url: str, run_id: str = "r1") -> RunStore:
    """A store armed as a new run arms it: run.json written with its seal."""
    store = RunStore(url)
    spec = {"run_id": run_id}
    seal = store.seal_run(load_key(), spec, b"{}")
    store.write_json("run.json", {"spec": spec, "seal": seal})
    return store


def test_the_backend_is_chosen_by_the_url(url: str) -> None:
    store = RunStore(url)
    local = "://" not in url
    assert store.local is local
    assert isinstance(store.backend, LocalBackend if local else ObjectBackend)


def test_write_read_replace_and_missing(url: str) -> None:
    store = RunStore(url)
    assert store.read("a/b.json") is None and not store.exists("a/b.json")
    store.write("a/b.json", b"one")
    assert store.read("a/b.json") == b"one" and store.exists("a/b.json")
    store.write("a/b.json", b"two, longer")
    assert store.read("a/b.json") == b"two, longer"
    store.write_json("doc.json", {"x": [1, "é"]})
    assert store.read_json("doc.json") == {"x": [1, "é"]}
    assert store.bytes_written > 0


def test_create_is_exclusive(url: str) -> None:
    """The fence: one writer wins a name; the loser's bytes are never there."""
    a, b = RunStore(url), RunStore(url)
    assert a.create("attempts/0001.json", b"first")
    assert not b.create("attempts/0001.json", b"second")
    assert b.read("attempts/0001.json") == b"first"


def test_listings_are_fresh(url: str) -> None:
    """Another writer's new object is seen at once (no cached listing hides a fence)."""
    writer, reader = RunStore(url), RunStore(url)
    assert reader.names("cells") == []
    writer.write("cells/00000-a0001.json", b"{}")
    assert reader.names("cells") == ["00000-a0001.json"]
    writer.write("cells/00001-a0001.json", b"{}")
    writer.write("cells/sub/deeper.json", b"{}")
    assert reader.names("cells") == ["00000-a0001.json", "00001-a0001.json", "sub"]


def test_files_go_up_and_come_back(url: str, tmp_path: Path) -> None:
    # (under 1 MiB: gcsfs sends a bigger body in a way aiohttp warns about)
    data = os.urandom(512 << 10)
    (tmp_path / "blob").write_bytes(data)
    store = RunStore(url)
    assert store.put_file(str(tmp_path / "blob"), "state/blobs/x") == len(data)
    assert store.read("state/blobs/x") == data
    store.get_file("state/blobs/x", str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == data


def test_attempts_fence_each_other(url: str) -> None:
    """Two runners claim different attempts; the older is superseded, the newer not."""
    first, second = _sealed(url), RunStore(url)
    second.unseal()
    assert first.claim_attempt({"resumed_from": 0}) == 1
    assert second.claim_attempt({"resumed_from": 0}) == 2
    assert first.superseded(1) and not second.superseded(2)
    reader = RunStore(url)
    reader.unseal()
    assert [a["attempt"] for a in reader.attempts()] == [1, 2]


def test_records_of_a_superseded_attempt_stop_where_the_next_took_over(url: str) -> None:
    """Cell records are sealed and read back whole; a record an older attempt wrote for a
    cell the newer attempt took over does not count."""
    old = _sealed(url)
    n1 = old.claim_attempt({"resumed_from": 0})
    old.write_cell(0, n1, {"status": "completed", "outputs": []})
    old.write_cell(1, n1, {"status": "completed", "outputs": [], "v": "old"})
    new = RunStore(url)
    new.unseal()
    n2 = new.claim_attempt({"resumed_from": 1})
    new.write_cell(1, n2, {"status": "completed", "outputs": [], "v": "new"})
    new.write_cell(2, n2, {"status": "executed", "undo": {"f": None}})
    old.write_cell(3, n1, {"status": "completed", "outputs": []})  # too late: superseded
    old.close()
    new.close()
    reader = RunStore(url)
    reader.unseal()
    records, notes = reader.records_and_notes()
    assert sorted(records) == [0, 1] and records[1]["v"] == "new"
    assert records[0]["attempt"] == n1 and records[1]["attempt"] == n2
    assert list(notes) == [2]


def test_a_changed_record_is_refused(url: str) -> None:
    store = _sealed(url)
    n = store.claim_attempt({"resumed_from": 0})
    store.write_cell(0, n, {"status": "completed", "outputs": ["x"]})
    store.close()
    name = RunStore(url).names("cells")[0]
    raw = RunStore(url).read(f"cells/{name}")
    assert raw is not None
    RunStore(url).write(f"cells/{name}", raw.replace(b'"x"', b'"y"'))
    reader = RunStore(url)
    reader.unseal()
    from spotbook import StoreIntegrityError

    with pytest.raises(StoreIntegrityError):
        reader.records_and_notes()
