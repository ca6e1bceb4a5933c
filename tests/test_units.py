"""Pure parts: parameters, notebook handling, snapshot policy, exit codes, exports."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

import spotbook
from spotbook._errors import (
    CellExecutionError,
    InputChangedError,
    KernelDiedError,
    NotebookFormatError,
    ParameterError,
    PreemptionBudgetError,
    RunTimeoutError,
    StorageError,
    SupersededError,
    Terminated,
)
from spotbook._models import Limits, RunSpec, SnapshotMode, SnapshotPolicy
from spotbook.cli.main import exit_code
from spotbook.notebook import document as nbs
from spotbook.notebook.parameters import collect_parameters, render_python, resolve_type
from spotbook.store.runstore import CellKey, RunStore

from .conftest import NOTEBOOKS


def test_all_is_sorted_and_complete() -> None:
    assert spotbook.__all__ == sorted(spotbook.__all__)
    for name in spotbook.__all__:  # every name resolves, lazily loaded ones included
        assert getattr(spotbook, name) is not None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1),
        ("-3", -3),
        ("0.5", 0.5),
        ("1e3", 1000.0),
        ("True", True),
        ("False", False),
        ("None", None),
        ("true", "true"),
        ("abc", "abc"),
        ("", ""),
    ],
)
def test_values_typed_like_papermill(text: str, value: object) -> None:
    got = resolve_type(text)
    assert got == value and type(got) is type(value)


def test_parameter_sources_merge_in_papermill_order(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("a: 1\nb: from-file\nc: [1, 2]\n")
    params = collect_parameters(
        files=[str(f)],
        yaml_strings=["b: from-yaml\nd: {x: 1}"],
        typed=[("a", "2")],
        raw=[("e", "3")],
    )
    assert params == {"a": 2, "b": "from-yaml", "c": [1, 2], "d": {"x": 1}, "e": "3"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"files": ["/nonexistent/p.yaml"]}, "does not exist"),
        ({"yaml_strings": ["a: [1, 2"]}, "not valid YAML"),
        ({"yaml_strings": ["- 1\n- 2"]}, "must be a YAML mapping"),
        ({"typed": [("1abc", "1")]}, "not a valid Python variable name"),
        ({"typed": [("class", "1")]}, "not a valid Python variable name"),
    ],
)
def test_bad_parameters_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ParameterError, match=message):
        collect_parameters(**kwargs)


def test_rendered_parameters_evaluate_back() -> None:
    params = {
        "a": 1,
        "b": 0.1,
        "s": 'it\'s "q"\n',
        "n": None,
        "t": True,
        "l": [1, "x"],
        "d": {"k": [1.5]},
        "inf": float("inf"),
    }
    ns: dict = {}
    exec(render_python(params), ns)
    assert {k: ns[k] for k in params} == params


def test_parameters_are_written_as_papermill_writes_them() -> None:
    """The injected cell is the text papermill's Python translator gives (double quotes,
    escapes), so output notebooks diff the same; spotbook renders on its own."""
    from papermill.translators import PythonTranslator

    params = {
        "msg": "Hello",
        "quote": 'it\'s "q"\n\\x',
        "accent": "café",
        "empty": "",
        "nested": {"k": [1.5, None, True], "s": "v"},
        "nan": float("nan"),
        "ninf": float("-inf"),
        "n": -3,
        "f": 0.1,
        "flag": False,
        "none": None,
    }
    assert render_python(params) == PythonTranslator.codify(params)


def _nb(path: str) -> nbs.Notebook:
    return nbs.parse((NOTEBOOKS / path).read_bytes(), path)


def test_parameters_injected_after_the_parameters_cell_and_replaced() -> None:
    nb = nbs.inject_parameters(_nb("params.ipynb"), {"alpha": 2})
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    assert tags[1] == ["parameters"] and tags[2] == ["injected-parameters"]
    again = nbs.inject_parameters(nb, {"alpha": 3})
    injected = [c for c in again.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "alpha = 3" in injected[0].source
    assert len(again.cells) == len(nb.cells)


def test_parameters_go_first_without_a_parameters_cell() -> None:
    nb = nbs.inject_parameters(_nb("error.ipynb"), {"x": 5})
    assert nb.cells[0].metadata["tags"] == ["injected-parameters"]
    assert nbs.inject_parameters(_nb("error.ipynb"), {}).cells == _nb("error.ipynb").cells


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("truncated.ipynb", "does not parse"),
        ("not_notebook.ipynb", "not a Jupyter notebook"),
        ("v3.ipynb", "format 3"),
    ],
)
def test_bad_notebooks_are_refused(name: str, message: str) -> None:
    with pytest.raises(NotebookFormatError, match=message):
        nbs.parse((NOTEBOOKS / name).read_bytes(), name)


def test_invalid_cell_is_refused() -> None:
    data = json.loads((NOTEBOOKS / "error.ipynb").read_text())
    data["cells"][0]["cell_type"] = "bogus"
    with pytest.raises(NotebookFormatError, match="not a valid notebook"):
        nbs.parse(json.dumps(data), "x")


def test_schema_problems_are_tolerated_as_nbclient_does() -> None:
    data = json.loads((NOTEBOOKS / "error.ipynb").read_text())
    data["cells"][0]["outputs"] = [{"output_type": "stream", "text": "no name"}]
    data["cells"][1]["source"] = ["print(1)\n", "print(2)"]
    nb = nbs.parse(json.dumps(data), "x")
    assert nb.cells[1].source == "print(1)\nprint(2)"


def test_failed_cell_gets_a_note_at_the_top() -> None:
    nb = _nb("error.ipynb")
    records = {
        0: {"status": "completed", "outputs": [], "execution_count": 1},
        1: {
            "status": "failed",
            "outputs": [],
            "execution_count": 2,
            "error": {"ename": "ValueError", "evalue": "bad value 1"},
        },
    }
    out = nbs.assemble(nb, records, run_meta={"parameters": {}})
    assert out.cells[0].cell_type == "markdown" and "In [2]" in out.cells[0].source
    assert out.cells[0].metadata.spotbook.ename == "ValueError"
    assert 'id="papermill-error-cell"' in out.cells[2].source  # the anchor, before it
    assert out.cells[3].metadata.spotbook.status == "failed"
    assert out.cells[3].metadata.papermill.status == "failed"
    assert out.cells[4].metadata.spotbook.status == "pending"
    assert out.metadata.papermill.exception is True
    # an earlier run's banners do not survive into the next run's notebook
    assert [c.source for c in nbs.remove_error_markers(out).cells] == [c.source for c in nb.cells]
    nbs.parse(nbs.dumps(out), "assembled")  # still a valid notebook


def test_compact_refreshes_write_what_a_whole_assembly_writes() -> None:
    """The store's refreshes re-encode only the cells that changed, and their bytes equal
    the whole notebook assembled and dumped, at every step of a run."""
    code = [
        {"cell_type": "code", "metadata": {}, "source": f"x = {i}", "outputs": [], "id": f"c{i}"}
        for i in range(3)
    ]
    doc = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": "# title", "id": "m0"},
            *[{**c, "execution_count": None} for c in code],
            {"cell_type": "markdown", "metadata": {}, "source": "end", "id": "m1"},
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "P"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    nb = nbs.parse(json.dumps(doc), "nb")
    writer = nbs.CompactWriter()
    meta = {"parameters": {"a": 1}, "final": False}

    def record(i: int, text: str, status: str = "completed") -> dict[str, Any]:
        out = {"output_type": "stream", "name": "stdout", "text": text}
        times = {"start": 1.0 + i, "end": 1.5 + i, "duration": 0.5}
        timing = {"execution": {"k": str(i)}}
        return {"status": status, "outputs": [out], "execution_count": i, **times,
                "metadata": timing}  # fmt: skip

    records: dict[int, dict[str, Any]] = {}
    steps: list[tuple[int | None, dict[int, dict[str, Any]]]] = [
        (1, {}),
        (1, {}),
        (2, {1: record(1, "one")}),
        (3, {2: record(2, "two")}),
        (3, {1: record(1, "one, updated")}),  # a display update re-records cell 1
        (None, {3: record(3, "three")}),
    ]
    for running, new in steps:
        records.update(new)
        whole = nbs.dumps(nbs.assemble(nb, records, run_meta=meta, running=running), False)
        assert writer.dumps(nb, records, run_meta=meta, running=running) == whole
    widgets = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    out = nbs.assemble(nb, records, run_meta=meta)
    out.metadata["widgets"] = widgets
    assert writer.dumps(nb, records, run_meta=meta, widgets=widgets) == nbs.dumps(out, False)

    # a failure puts banners before the cells: written whole (the banners' ids are new)
    def banner_ids_dropped(text: str) -> Any:
        found = json.loads(text)
        for cell in found["cells"]:
            if "papermill-error-cell-tag" in cell["metadata"].get("tags", []):
                del cell["id"]
        return found

    records[2] = {**record(2, "boom", "failed"), "error": {"ename": "E", "evalue": "v"}}
    whole = nbs.dumps(nbs.assemble(nb, records, run_meta=meta), False)
    got = writer.dumps(nb, records, run_meta=meta)
    assert banner_ids_dropped(got) == banner_ids_dropped(whole)
    nbs.parse(got, "refreshed")  # a valid notebook


def test_snapshot_policy_keeps_the_young_daly_interval() -> None:
    auto = SnapshotPolicy()  # one preemption per node-hour
    # a 0.1 s snapshot: Young's sqrt(2 C M) = sqrt(2 * 0.1 * 3600) s of compute apart
    gap = auto.gap(0.1)
    assert gap == pytest.approx(math.sqrt(2 * 0.1 * 3600), rel=0.01)
    assert not auto.due(gap - 0.5, 0.1) and auto.due(gap, 0.1)
    # dearer snapshots come less often, a higher hazard asks for more, never closer than
    # min_gap (0.5 s)
    assert auto.gap(0.01) < gap < auto.gap(1.0)
    assert SnapshotPolicy(hazard=100).gap(0.1) == pytest.approx(gap / 10, rel=0.05)
    assert SnapshotPolicy(hazard=1e6).gap(0.1) == 0.5
    assert not auto.due(0.4, None)
    assert SnapshotPolicy(interval=0.5).due(0.6, 10.0)
    assert SnapshotPolicy(SnapshotMode.EVERY_CELL).due(0.0, 100.0)
    assert not SnapshotPolicy(SnapshotMode.OFF).due(1e9, 0.0)
    with pytest.raises(spotbook.UsageError, match="every-cell, auto, off"):
        SnapshotPolicy.parse("sometimes")


def test_a_run_spec_of_an_older_version_still_loads() -> None:
    spec = RunSpec("r", "nb.ipynb", None, {}, "python3", None, "0" * 64)
    doc = spec.to_json()
    doc["snapshot"]["cost_ratio"] = 20.0  # a setting retired since
    assert RunSpec.from_json(doc).snapshot == spec.snapshot


def test_limits_validate() -> None:
    with pytest.raises(spotbook.UsageError):
        Limits(execution_timeout=0)
    with pytest.raises(spotbook.UsageError):
        Limits(max_preemptions=-1)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (CellExecutionError(cell_index=1, execution_count=1, ename="E", evalue="v"), 1),
        (KernelDiedError(cell_index=1, execution_count=None), 138),
        (ParameterError("x"), 2),
        (NotebookFormatError("x"), 2),
        (InputChangedError("x"), 2),
        (StorageError("x"), 3),
        (SupersededError("x"), 3),
        (RunTimeoutError(cell_index=0, timeout=1), 4),
        (PreemptionBudgetError("x"), 5),
        (Terminated("SIGTERM", "resume"), 75),
    ],
)
def test_exit_codes_follow_design(exc: Exception, code: int) -> None:
    assert exit_code(exc) == code


def test_retryable_errors_are_the_ones_the_job_retries() -> None:
    """Every error class says by its ``retryable`` attribute whether a rerun may pass,
    and the CLI's exit code for it agrees with the Job's failure policy: a retryable
    error never exits with a code that fails the Job at once, and every other does."""
    from spotbook._models import EXIT_CODES_FAIL_JOB, EXIT_STOPPED

    classes = [
        c
        for c in (getattr(spotbook, n) for n in spotbook.__all__)
        if isinstance(c, type) and issubclass(c, spotbook.SpotbookError)
    ]
    classes.remove(spotbook.SpotbookError)
    assert len(classes) >= 20
    for cls in classes:
        err = cls.__new__(cls)
        code = exit_code(err)
        if cls.retryable:
            assert code not in EXIT_CODES_FAIL_JOB, cls
        else:
            assert code in EXIT_CODES_FAIL_JOB and code != EXIT_STOPPED, cls
    assert {c.__name__ for c in classes if c.retryable} == {
        "ClusterError",
        "CommandFailedError",
        "KernelStartError",
        "StorageError",
        "SupersededError",
        "Terminated",
    }


def test_cell_timeout_is_also_a_builtin_timeout() -> None:
    assert issubclass(spotbook.CellTimeoutError, TimeoutError)


def test_fencing_ignores_records_of_a_superseded_attempt(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    a1 = store.claim_attempt({"resumed_from": 0})
    for i in range(4):
        store.write_cell(i, a1, {"index": i, "status": "completed", "by": a1})
    a2 = store.claim_attempt({"resumed_from": 2})
    assert store.superseded(a1) and not store.superseded(a2)
    store.write_cell(4, a1, {"index": 4, "status": "completed", "by": a1})  # stale write
    store.write_cell(2, a2, {"index": 2, "status": "completed", "by": a2})
    recs = store.cell_records()
    assert {i: r["by"] for i, r in recs.items()} == {0: 1, 1: 1, 2: 2}
    # A takeover also bounds attempts before the one it superseded.
    store.claim_attempt({"resumed_from": 1})
    assert sorted(store.cell_records()) == [0]


def test_exclusive_create_is_exclusive(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    assert store.create("attempts/0001.json", b"{}")
    assert not store.create("attempts/0001.json", b"{}")
    assert CellKey.parse(CellKey(12, 3).name) == CellKey(12, 3)


def test_a_torn_last_record_line_is_ignored(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    a1 = store.claim_attempt({"resumed_from": 0})
    store.write_cell(0, a1, {"index": 0, "status": "completed"})
    store.write_cell(1, a1, {"index": 1, "status": "completed", "v": 1})
    store.write_cell(1, a1, {"index": 1, "status": "completed", "v": 2})  # re-recorded
    store.close()
    with open(tmp_path / "run" / "cells" / "a0001.jsonl", "ab") as fh:
        fh.write(b'{"index": 2, "status": "compl')  # killed mid-write
    recs = store.cell_records()
    assert sorted(recs) == [0, 1] and recs[1]["v"] == 2


def test_progress_description_is_papermills_marker_or_the_first_line() -> None:
    from spotbook.attempt.progress import ProgressBar, description

    assert description("a = 1  # papermill_description=load-data\nb", first_line=False) == (
        "load-data"
    )
    assert description("\n\n  train(model)  \nmore", first_line=True) == "train(model)"
    assert description("train(model)", first_line=False) is None
    assert description("", first_line=True) is None
    long = description("x" * 100, first_line=True)
    assert long is not None and len(long) == 40 and long.endswith("…")
    with pytest.raises(spotbook.UsageError, match="progress_bar must be"):
        ProgressBar(3, describe_cells=True)  # type: ignore[arg-type]


PARAMETER_CELLS = [
    "msg = None\na: float = 2.25 # Variable a\n",
    "b = [\n    'Hello', # First element\n# Dummy comment\n    'World'\n]"
    " # type: List[str] Nice list\n",
    '# Interesting c\nc: "NoneType" = None\nlr = 1e-3  # learning rate\n',
    "%matplotlib inline\nx = 1  # the x\n",
    "n: int = 3\nname = 'a'  # the name # really\n",
]


@pytest.mark.parametrize("source", PARAMETER_CELLS)
def test_inspect_reads_parameters_as_papermill_does(source: str) -> None:
    """Same names, types, defaults and help as papermill's Python translator reports."""
    import nbformat
    from papermill.translators import PythonTranslator

    from spotbook.notebook.parameters import inspect_source

    theirs = [p._asdict() for p in PythonTranslator.inspect(nbformat.v4.new_code_cell(source))]
    ours = [dataclasses.asdict(p) for p in inspect_source(source)]
    assert ours == theirs


def test_inspect_keeps_what_papermill_skips_and_survives_broken_lines() -> None:
    from spotbook.notebook.parameters import inspect_source

    found = inspect_source("d = a == 3\n= 2\nlr = {'a': 1,\n  'b': 2}  # rates\nfor i in x: pass\n")
    assert [(p.name, p.default, p.help) for p in found] == [
        ("d", "a == 3", ""),
        ("lr", "{'a': 1,'b': 2}", "rates"),
    ]
    assert [p.shown_type() for p in found] == ["Unknown type", "dict"]
    assert inspect_source("def f(:\n") == []


LANGUAGE_VALUES = {
    "s": "say \"hi\"\n\tto ünïcode \\ $HOME 'q'",
    "n": 3,
    "big": 2**40,
    "neg": -5,
    "f": 1e-05,
    "inf": float("inf"),
    "yes": True,
    "no": False,
    "nothing": None,
    "items": [1, "two", [3.5, None], False],
    "table": {"a": 1, "b c": ["x", {"d": True}], "e": None},
    "_private": "p",
}
# papermill's (kernel name, language) keys, and what it cannot write in each
LANGUAGE_KEYS = {
    ("ir", "R"): (),
    ("sparkrkernel", ""): (),
    ("scala", "scala"): (),
    ("sparkkernel", ""): (),
    ("julia-1.9", "julia"): (),
    ("matlab", "matlab"): (),
    (".net-csharp", "C#"): ("nothing", "items", "table"),  # C#: no spelling of None
    (".net-fsharp", "F#"): (),
    (".net-powershell", "PowerShell"): (),
    ("bash", "bash"): ("table",),  # bash: no maps
    ("python3", "python"): (),
    ("pysparkkernel", ""): (),
}


@pytest.mark.parametrize(("kernel", "language"), list(LANGUAGE_KEYS))
def test_parameters_are_written_in_each_language_as_papermill_writes_them(
    kernel: str, language: str
) -> None:
    from papermill.translators import translate_parameters

    from spotbook.notebook.languages import parameters_cell

    unsupported = LANGUAGE_KEYS[(kernel, language)]
    params = {k: v for k, v in LANGUAGE_VALUES.items() if k not in unsupported}
    ours = parameters_cell(kernel, language, params)
    assert ours == translate_parameters(kernel, language, params, "Parameters")
    assert ours.count("\n") >= len(params)
    for name in unsupported:
        with pytest.raises(spotbook.ParameterError, match="no "):
            parameters_cell(kernel, language, {name: LANGUAGE_VALUES[name]})


def test_an_unknown_language_is_refused_by_name() -> None:
    from spotbook.notebook.languages import parameters_cell

    with pytest.raises(spotbook.ParameterError, match=r"kernel 'cobol'.*pass -k/-l"):
        parameters_cell("cobol", "cobol", {"a": 1})


def test_files_given_back_are_never_changed_through_a_symbolic_link(tmp_path: Path) -> None:
    """A cell that runs again gets its files back as they were before it first ran; a
    link planted at one of those paths since must not carry the cut to the file it names."""
    from spotbook.attempt.restore import undo_files

    precious = tmp_path / "precious.txt"
    precious.write_text("not the run's to cut")
    (tmp_path / "log.txt").symlink_to(precious)
    (tmp_path / "made.txt").symlink_to(precious)
    (tmp_path / "grown.txt").write_text("before" + "after")
    done = undo_files(
        3,
        {
            str(tmp_path / "log.txt"): 0,
            str(tmp_path / "made.txt"): None,
            str(tmp_path / "grown.txt"): 6,
        },
    )
    assert precious.read_text() == "not the run's to cut"
    assert (tmp_path / "grown.txt").read_text() == "before"
    assert not (tmp_path / "made.txt").exists() and not (tmp_path / "made.txt").is_symlink()
    assert any("could not restore" in line and "log.txt" in line for line in done), done


def test_a_whole_file_write_never_goes_through_a_planted_link(tmp_path: Path) -> None:
    """OUTPUT, report -o and a local store's documents are written under a temporary name,
    then renamed: links planted at the names a writer could foresee (this process's pid
    and a counter, as they once were) and at the target itself change nothing else."""
    import os

    from spotbook.store.backends import atomic_write

    precious = tmp_path / "precious.txt"
    precious.write_text("not the run's")
    out = tmp_path / "out.ipynb"
    out.symlink_to(precious)
    for n in range(10):
        Path(f"{out}.tmp-{os.getpid()}-{n}").symlink_to(precious)
    atomic_write(str(out), b"the notebook")
    assert precious.read_text() == "not the run's"
    assert out.read_bytes() == b"the notebook" and not out.is_symlink()
