"""Objects of 150+ classes (standard library and the data-science libraries installed
here), each made in a cell, killed after a snapshot, resumed on a wiped node, and
checked by behaviour. The table in docs/object-classes.md is this test's output
(``python -m tests.object_classes``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .object_classes import available, markdown, run_table

pytestmark = pytest.mark.slow


def test_every_class_behaves_the_same_after_a_kill_and_resume(tmp_path: Path) -> None:
    rows = run_table(tmp_path, {"PYTHONHASHSEED": "0"})
    assert len(rows) >= 150, available()
    differ = [r for r in rows if not r["same"]]
    assert not differ, markdown(differ)
    # most come back from the snapshot; what no pickler takes is rebuilt by replay
    replayed = {r["class"] for r in rows if r["how"] == "replayed"}
    assert {"generator", "socket", "sqlite3.Cursor"} <= replayed
    assert {"sqlite3 (memory)", "Lock", "file (binary, write)"}.isdisjoint(replayed)
