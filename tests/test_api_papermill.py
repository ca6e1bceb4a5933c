"""The Python API and the equivalence with papermill on the same inputs."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import spotbook

from .conftest import (
    NOTEBOOKS,
    SHARED,
    cells_committed,
    cli,
    comparable,
    kill,
    load,
    start_cli,
    wait_for,
)

pytestmark = pytest.mark.slow


def _param_values(nb: dict) -> dict:
    cell = next(c for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", []))
    tree = ast.parse("".join(cell["source"]))
    return {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
    }


def _papermill(*args: str, cwd: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "papermill", *args, "--no-progress-bar"],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    ("notebook", "params"),
    [
        (
            NOTEBOOKS / "params.ipynb",
            [
                "-p",
                "alpha",
                "2.5",
                "-p",
                "name",
                "x y",
                "-r",
                "opt",
                "1",
                "-y",
                "items: [1, {a: 2}]",
                "-p",
                "flag",
                "True",
            ],
        ),
        (SHARED / "papermill/simple_execute.ipynb", ["-p", "msg", "hello"]),
        (SHARED / "nbclient/update-display-id.ipynb", []),
        (SHARED / "nbclient/Clear Output.ipynb", []),
        (SHARED / "papermill/report_mode_test.ipynb", ["-p", "a", "3", "-p", "b", "4"]),
    ],
)
def test_same_result_as_papermill(tmp_path: Path, notebook: Path, params: list[str]) -> None:
    if not notebook.exists():
        pytest.skip(f"{notebook.name}: the shared test notebooks are not beside the repository")
    cwd = ["--cwd", str(notebook.parent)]
    # papermill needs -k for notebooks without a kernelspec name; spotbook defaults to python3
    _papermill(str(notebook), "pm.ipynb", *params, *cwd, "-k", "python3", cwd=tmp_path)
    r = cli("run", str(notebook), "sb.ipynb", *params, *cwd, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    pm, sb = load(tmp_path / "pm.ipynb"), load(tmp_path / "sb.ipynb")
    if params:
        assert _param_values(sb) == _param_values(pm)
        assert (
            sb["metadata"]["papermill"]["parameters"] == pm["metadata"]["papermill"]["parameters"]
        )
    # the injected cell too: parameters are written as papermill writes them
    assert comparable(sb) == comparable(pm)


def test_failure_marked_like_papermill_marks_it(tmp_path: Path) -> None:
    nb = NOTEBOOKS / "error.ipynb"
    subprocess.run(
        [sys.executable, "-m", "papermill", str(nb), "pm.ipynb"], cwd=tmp_path, capture_output=True
    )
    assert cli("run", str(nb), "sb.ipynb", cwd=tmp_path).returncode == 1
    pm, sb = load(tmp_path / "pm.ipynb"), load(tmp_path / "sb.ipynb")
    # both put a visible note first and keep the traceback on the failing cell
    assert pm["cells"][0]["cell_type"] == sb["cells"][0]["cell_type"] == "markdown"
    pm_err = [o for c in pm["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    sb_err = [o for c in sb["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert [(o["ename"], o["evalue"]) for o in sb_err] == [
        (o["ename"], o["evalue"]) for o in pm_err
    ]
    assert sb["metadata"]["papermill"]["exception"] is True

    # the banner and the anchor before the failing cell, as papermill writes them
    def markers(nb: dict) -> list[tuple[int, str]]:
        return [
            (i, "".join(c["source"]).split("</span>")[0])
            for i, c in enumerate(nb["cells"])
            if "papermill-error-cell-tag" in c["metadata"].get("tags", [])
        ]

    assert markers(sb) == markers(pm)
    # the metadata papermill's readers use, with the same keys and kinds of value
    assert set(sb["metadata"]["papermill"]) >= set(pm["metadata"]["papermill"])
    for key in ("start_time", "end_time", "duration", "input_path"):
        assert type(sb["metadata"]["papermill"][key]) is type(pm["metadata"]["papermill"][key])
    assert [
        c["metadata"]["papermill"]["status"] for c in sb["cells"] if "papermill" in c["metadata"]
    ] == [c["metadata"]["papermill"]["status"] for c in pm["cells"] if "papermill" in c["metadata"]]
    # a stale banner in the input is removed, not kept beside the new one
    again = cli("run", "sb.ipynb", "sb2.ipynb", cwd=tmp_path)
    assert again.returncode == 1
    assert markers(load(tmp_path / "sb2.ipynb")) == markers(pm)


def test_execute_notebook_is_a_drop_in(tmp_path: Path) -> None:
    out = tmp_path / "o.ipynb"
    nb = spotbook.execute_notebook(
        str(NOTEBOOKS / "params.ipynb"),
        str(out),
        parameters={"alpha": 7, "name": "api"},
        cwd=str(tmp_path),
        request_save_on_cell_execute=False,
        run_dir=str(tmp_path / "rd"),
    )
    texts = json.dumps([c.get("outputs") for c in nb.cells])
    assert "7 api False [1] None" in texts
    assert load(out)["metadata"]["spotbook"]["run_id"] == nb.metadata.spotbook.run_id


def test_a_library_call_leaves_no_folder_in_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """papermill writes only the output notebook: without run_dir the run store goes in
    the user's cache ($SPOTBOOK_CACHE_DIR here), not the working directory."""
    monkeypatch.chdir(tmp_path)
    nb = spotbook.execute_notebook(str(NOTEBOOKS / "params.ipynb"), "o.ipynb")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.ipynb"]
    store = Path(os.environ["SPOTBOOK_CACHE_DIR"]) / "runs" / nb.metadata.spotbook.run_id
    assert (store / "run.json").exists() and (store / "output.ipynb").exists()


def test_execute_notebook_raises_the_cell_error(tmp_path: Path) -> None:
    with pytest.raises(spotbook.CellExecutionError) as info:
        spotbook.execute_notebook(
            str(NOTEBOOKS / "error.ipynb"), str(tmp_path / "o.ipynb"), run_dir=str(tmp_path / "rd")
        )
    assert info.value.ename == "ValueError" and info.value.cell_index == 1
    assert (tmp_path / "o.ipynb").exists()


def test_a_papermill_user_catches_papermills_error(tmp_path: Path) -> None:
    """`except PapermillExecutionError` keeps working after switching the import, with
    papermill's attributes; the error still pickles (multiprocessing pools)."""
    import pickle

    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError) as info:
        spotbook.execute_notebook(
            str(NOTEBOOKS / "error.ipynb"), str(tmp_path / "o.ipynb"), run_dir=str(tmp_path / "rd")
        )
    err = info.value
    assert isinstance(err, spotbook.CellExecutionError)
    assert (err.cell_index, err.ename, err.exec_count) == (1, "ValueError", 2)
    assert "raise ValueError" in err.source
    assert any("ValueError" in line for line in err.traceback)
    assert str(err).startswith("cell 1 (In [2]) raised ValueError")
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, PapermillExecutionError) and again.traceback == err.traceback


def test_without_papermill_loaded_the_error_has_the_same_attributes(tmp_path: Path) -> None:
    """spotbook never imports papermill itself (it takes most of a second)."""
    code = (
        "import sys, spotbook\n"
        "try:\n"
        f"    spotbook.execute_notebook({str(NOTEBOOKS / 'error.ipynb')!r}, None,"
        f" run_dir={str(tmp_path / 'rd')!r})\n"
        "except spotbook.CellExecutionError as e:\n"
        "    print(e.ename, e.exec_count, bool(e.traceback), 'papermill' in sys.modules,"
        " [c.__module__ for c in type(e).__mro__ if 'papermill' in c.__module__])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.stdout.split() == ["ValueError", "2", "True", "False", "[]"], r.stderr


def test_papermills_kinds_of_arguments(tmp_path: Path) -> None:
    """Path and NotebookNode inputs, papermill's positional order, report_mode, the
    stdout/stderr files; engine and language values spotbook cannot honour are refused."""
    import io

    import nbformat

    out = tmp_path / "o.ipynb"
    stdout, stderr = io.StringIO(), io.StringIO()
    nb = spotbook.execute_notebook(
        NOTEBOOKS / "params.ipynb",  # a Path
        out,
        {"alpha": 3},
        "nbclient",  # engine_name, in papermill's positional order
        True,
        False,
        "python3",
        "python",
        False,
        False,
        stdout,
        stderr,
        60,
        True,  # report_mode
        tmp_path,  # cwd, a Path
        run_dir=str(tmp_path / "rd"),
    )
    assert "3 default False [1] None" in stdout.getvalue()
    assert load(out)["metadata"]["spotbook"]["run_id"] == nb.metadata.spotbook.run_id
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.metadata["jupyter"]["source_hidden"] is True for c in code)
    node = nbformat.read(str(NOTEBOOKS / "params.ipynb"), as_version=4)
    again = spotbook.execute_notebook(
        node, None, {"alpha": 4}, run_dir=str(tmp_path / "rd2"), stdout_file=stdout
    )
    assert "4 default False [1] None" in stdout.getvalue()
    assert again.metadata.spotbook.run_id != nb.metadata.spotbook.run_id
    with pytest.raises(spotbook.UsageError, match="engine_name 'dask'"):
        spotbook.execute_notebook(node, None, engine_name="dask")
    with pytest.raises(spotbook.UsageError, match="R notebook: spotbook runs Python"):
        spotbook.execute_notebook(node, None, language="R")


def test_the_library_draws_papermills_bar(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """As papermill's execute_notebook: tqdm on stderr by default, tqdm's arguments from
    a dict, nothing with progress_bar=False, a clear error for anything else."""
    src = str(NOTEBOOKS / "params.ipynb")
    spotbook.execute_notebook(src, None, run_dir=str(tmp_path / "a"))
    out, err = capfd.readouterr()
    assert out == "" and "| 5/5 [" in err and "Executing import os: " in err
    spotbook.execute_notebook(
        src, None, progress_bar={"desc": "Training", "unit": "step"}, run_dir=str(tmp_path / "b")
    )
    err = capfd.readouterr().err
    assert "Training import os: " in err and "step/s]" in err
    spotbook.execute_notebook(src, None, progress_bar=False, run_dir=str(tmp_path / "c"))
    assert capfd.readouterr().err == ""
    with pytest.raises(spotbook.UsageError, match="progress_bar must be"):
        spotbook.execute_notebook(src, None, progress_bar="yes", run_dir=str(tmp_path / "d"))
    assert not (tmp_path / "d").exists()


def test_execute_notebook_rejects_unknown_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="engine_kwarg"):
        spotbook.execute_notebook("x.ipynb", None, engine_kwarg=1)


def test_nbclients_arguments_reach_every_attempts_kernel(tmp_path: Path) -> None:
    """papermill passes its extra keyword arguments to nbclient: iopub_timeout and the
    kernel's extra_arguments are taken, kept in the (sealed) run, and used again by a
    resume after a kill; one spotbook cannot honour is refused by name, before anything
    is written. (The resume is on the same disk: the subject is the arguments.)"""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    arg = "--InteractiveShell.banner1=from-spotbook"
    check = f"import sys\nprint({arg!r} in sys.argv)"
    gate = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.01)"
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (check, gate, check)]
    src = tmp_path / "nb.ipynb"
    nbformat.write(nb, src)
    rd = tmp_path / "rd"
    call = (
        f"import spotbook; spotbook.execute_notebook({str(src)!r}, None, run_dir={str(rd)!r}, "
        f"iopub_timeout=9, extra_arguments=[{arg!r}], record_timing=True, progress_bar=False)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", call], cwd=tmp_path, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: cells_committed(rd) >= 1, timeout=120, what="cell 0's record")
    finally:
        kill(proc)
    spec = json.loads((rd / "run.json").read_text())["spec"]
    assert spec["nbclient"] == {"iopub_timeout": 9, "extra_arguments": [arg], "record_timing": True}
    (tmp_path / "go").touch()
    r = cli("resume", str(rd), cwd=tmp_path)  # a new kernel, started as the first was
    assert r.returncode == 0, r.stderr
    out = json.loads((rd / "output.ipynb").read_text())
    assert [json.dumps(out["cells"][i]["outputs"]).count("True") for i in (0, 2)] == [1, 1]
    with pytest.raises(TypeError, match=r"\['kernel_manager_class'\] \(it takes .*iopub_timeout"):
        spotbook.execute_notebook(
            str(src), None, run_dir=str(tmp_path / "rd2"), kernel_manager_class="x.Y"
        )
    with pytest.raises(spotbook.UsageError, match="iopub_timeout=-1"):
        spotbook.execute_notebook(str(src), None, run_dir=str(tmp_path / "rd3"), iopub_timeout=-1)
    assert not (tmp_path / "rd2").exists() and not (tmp_path / "rd3").exists()


def test_prepare_only(tmp_path: Path) -> None:
    nb = spotbook.execute_notebook(
        str(NOTEBOOKS / "params.ipynb"),
        str(tmp_path / "p.ipynb"),
        parameters={"alpha": 1},
        prepare_only=True,
        run_dir=str(tmp_path / "rd"),
    )
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in nb.cells)
    assert not (tmp_path / "rd" / "cells").exists()


def _store_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names every RunStore reads from here on, in order."""
    from spotbook.store.runstore import RunStore

    reads: list[str] = []
    read = RunStore.read

    def counted(self: RunStore, rel: str, *args: object, **kwargs: object) -> bytes | None:
        reads.append(rel)
        return read(self, rel, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RunStore, "read", counted)
    return reads


def test_a_new_run_reads_its_run_json_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the look for a run already there; what the command then sealed is not read back
    # (each read of an object store is a request)
    from spotbook.cli.main import main

    reads = _store_reads(monkeypatch)
    out, rd = tmp_path / "p.ipynb", tmp_path / "rd"
    nb = str(NOTEBOOKS / "params.ipynb")
    args = ["run", nb, str(out), "-p", "alpha", "3", "--run-dir", str(rd), "--prepare-only"]
    assert main(args) == 0
    assert reads.count("run.json") == 1, reads
    assert "injected-parameters" in out.read_text()


def test_a_resume_reads_its_run_json_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the check that the store holds the run asked for reads it; the runner checks the
    # seal of what that read found, rather than reading it twice more
    from spotbook.cli.main import main

    rd = tmp_path / "rd"
    spotbook.prepare_run(str(NOTEBOOKS / "params.ipynb"), run_dir=str(rd))
    reads = _store_reads(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(["resume", str(rd), "--no-progress-bar"]) == 0
    assert reads.count("run.json") == 1, reads


def test_the_same_command_on_an_interrupted_run_reads_its_run_json_once(
    work: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the run is looked for and its seal checked once; the start line's "interrupted with
    # N of M cells done" comes from what the attempt has read, not from a second status
    # (run.json, the notebook and job.json read again). Not run on a wiped node too: it
    # counts this process's reads of the store, which a wiped node does not change
    from spotbook.cli.main import main

    rd = work / "rd"
    runner = start_cli("run", "sleepy.ipynb", "out.ipynb", "--run-dir", "rd", cwd=work)
    wait_for(lambda: cells_committed(rd) >= 2, what="2 cells")
    kill(runner)
    reads = _store_reads(monkeypatch)
    monkeypatch.chdir(work)
    assert main(["run", "sleepy.ipynb", "out.ipynb", "--run-dir", "rd", "--no-progress-bar"]) == 0
    err = capsys.readouterr().err
    assert "continuing run " in err and " interrupted with " in err, err
    assert reads.count("run.json") == 1 and "job.json" not in reads, reads
    assert reads.count("input.ipynb") == 2, reads  # the seal's check, then the runner's


def test_resume_run_api(tmp_path: Path) -> None:
    rd = tmp_path / "rd"
    spotbook.prepare_run(str(NOTEBOOKS / "params.ipynb"), run_dir=str(rd))
    result = spotbook.resume_run(str(rd))
    assert result.status is spotbook.RunStatus.SUCCEEDED and result.cells_done == 4


def test_spotbook_run_is_one_call_of_a_request(tmp_path: Path) -> None:
    # what `spotbook run` does, as the library call it makes: a typed request in, the
    # run's start told once before its kernel starts, a typed result out
    started: list[spotbook.RunStarted] = []
    nb = str(NOTEBOOKS / "params.ipynb")
    request = spotbook.RunRequest(
        nb, str(tmp_path / "out.ipynb"), parameters={"alpha": 0.5}, run_dir=str(tmp_path / "a")
    )
    result = spotbook.run_here(request, on_start=started.append)
    assert result.status is spotbook.RunStatus.SUCCEEDED
    assert (result.cells_done, result.cells_total, result.attempt) == (5, 5, 1)  # one injected
    (start,) = started
    assert (start.run_id, start.url, start.interrupted_at) == (result.run_id, result.url, None)
    assert start.notebook("output") == (tmp_path / "out.ipynb").read_bytes()
    # --prepare-only: frozen with its parameters and written to OUTPUT, nothing run
    frozen = spotbook.RunRequest(
        nb, str(tmp_path / "p.ipynb"), run_dir=str(tmp_path / "b"), prepare_only=True
    )
    result = spotbook.run_here(frozen, on_start=started.append)
    assert result.status is spotbook.RunStatus.PENDING
    assert (result.cells_done, result.cells_total, result.attempt) == (0, 4, 0)
    assert started[1].notebook("output") is None
    assert started[1].notebook("input") == (tmp_path / "p.ipynb").read_bytes()


def test_a_run_request_is_checked_when_made_and_prepared_whole(tmp_path: Path) -> None:
    # one typed request from the caller down to the store: what the command line and
    # prepare_run's keywords build, and what submit and a sweep's points pass on
    with pytest.raises(spotbook.UsageError, match="iopub_timeout"):
        spotbook.RunRequest("nb.ipynb", nbclient={"iopub_timeout": -1})
    with pytest.raises(spotbook.UsageError, match="--timeout"):
        spotbook.RunRequest("nb.ipynb", limits=spotbook.Limits(run_timeout=0))
    request = spotbook.RunRequest(
        str(NOTEBOOKS / "params.ipynb"),
        parameters={"alpha": 0.5},
        limits=spotbook.Limits(execution_timeout=30),
        strict_resume=True,
        run_dir=str(tmp_path / "a"),
    )
    spec = spotbook.prepare(request).require_run()["spec"]
    kwargs = spotbook.prepare_run(
        request.notebook,
        parameters={"alpha": 0.5},
        limits=spotbook.Limits(execution_timeout=30),
        strict_resume=True,
        run_dir=str(tmp_path / "b"),
    ).require_run()["spec"]
    assert spec["parameters"] == {"alpha": 0.5} and spec["strict_resume"] is True
    assert spec["limits"]["execution_timeout"] == 30
    same = ("run_id", "created", "hash_seed")
    assert {k: v for k, v in spec.items() if k not in same} == {
        k: v for k, v in kwargs.items() if k not in same
    }


def _tagged_notebook(path: Path, *cells: tuple[str, list[str]]) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_markdown_cell("# Training")]
    for source, tags in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = tags
        nb.cells.append(cell)
    nbformat.write(nb, path)


def test_inspect_like_papermill(tmp_path: Path) -> None:
    """inspect_notebook returns papermill's dict; `spotbook inspect` and `run
    --help-notebook` list the parameters and run nothing."""
    import papermill

    nb = tmp_path / "train_v2.ipynb"
    _tagged_notebook(
        nb,
        ("import os", []),
        (
            "lr: float = 0.1  # learning rate\nepochs = 3\nlayers = [\n  64,\n  32,\n]  # widths",
            ["parameters"],
        ),
        ("print(lr)", []),
    )
    ours = spotbook.inspect_notebook(nb)
    assert ours == papermill.inspect_notebook(str(nb))
    assert list(ours) == ["lr", "epochs", "layers"]
    assert ours["layers"] == {
        "name": "layers",
        "inferred_type_name": "None",
        "default": "[64,32,]",
        "help": "widths",
    }
    # a templated path, filled from the parameters as papermill fills it
    assert spotbook.inspect_notebook(str(tmp_path / "train_v{v}.ipynb"), {"v": 2}) == ours
    plain = tmp_path / "plain.ipynb"
    _tagged_notebook(plain, ("x = 1", []))
    assert spotbook.inspect_notebook(plain) == {} == papermill.inspect_notebook(str(plain))

    r = cli("inspect", "train_v2.ipynb", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "Parameters inferred for notebook 'train_v2.ipynb':"
    assert lines[1].startswith("  lr: float (default 0.1)") and lines[1].endswith("learning rate")
    assert lines[2] == "  epochs: int (default 3)"
    assert json.loads(cli("inspect", "train_v2.ipynb", "--json", cwd=tmp_path).stdout) == ours
    again = cli("run", "train_v2.ipynb", "out.ipynb", "--help-notebook", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == r.stdout
    assert not (tmp_path / "out.ipynb").exists() and not (tmp_path / ".spotbook").exists()
    none = cli("inspect", "plain.ipynb", cwd=tmp_path)
    assert none.returncode == 0 and "No cell tagged 'parameters'" in none.stdout
    missing = cli("inspect", "nope.ipynb", cwd=tmp_path)
    assert missing.returncode == 2 and "nope.ipynb" in missing.stderr


def test_paths_are_templates_as_in_papermill(tmp_path: Path) -> None:
    """`out_{alpha}.ipynb -p alpha 2` writes out_2.ipynb; papermill's pm built-ins; a
    name no parameter gives is bad input (exit 2), with nothing written."""
    src = tmp_path / "params.ipynb"
    src.write_bytes((NOTEBOOKS / "params.ipynb").read_bytes())
    r = cli(
        "run", "params.ipynb", "out_{alpha}_{pm[run_uuid]}.ipynb", "-p", "alpha", "2",
        "--no-progress-bar", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (out,) = tmp_path.glob("out_2_*.ipynb")
    assert len(out.name) == len("out_2_.ipynb") + 36  # a uuid
    assert f"output in {out}" in r.stderr
    bad = cli("run", "params.ipynb", "out_{beta}.ipynb", "-p", "alpha", "2", cwd=tmp_path)
    assert bad.returncode == 2 and "pass -p beta VALUE" in bad.stderr
    assert list(tmp_path.glob("out_{*")) == []
    assert len(list((tmp_path / ".spotbook" / "runs").iterdir())) == 1  # the first run's
    nb = spotbook.execute_notebook(
        str(tmp_path / "params.ipynb"),
        str(tmp_path / "api_{name}.ipynb"),
        {"name": "x"},
        progress_bar=False,
        run_dir=str(tmp_path / "rd"),
    )
    assert (tmp_path / "api_x.ipynb").exists()
    assert nb.metadata.papermill.output_path == str(tmp_path / "api_x.ipynb")


def test_other_languages_are_parameterised_but_not_run(tmp_path: Path) -> None:
    """An R notebook gets papermill's R parameters with --prepare-only (no R kernel is
    needed); running it is refused by name (exit 2) with nothing written."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "ir", "display_name": "R", "language": "R"}
    cell = nbformat.v4.new_code_cell("alpha = 0.5")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell("print(alpha)")]
    nbformat.write(nb, tmp_path / "r.ipynb")
    r = cli(
        "run", "r.ipynb", "p.ipynb", "-p", "alpha", "2", "-y", "ok: true",
        "--prepare-only", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    injected = load(tmp_path / "p.ipynb")["cells"][1]
    assert "".join(injected["source"]) == "# Parameters\nok = TRUE\nalpha = 2\n"
    bad = cli("run", "r.ipynb", "o.ipynb", "-p", "alpha", "2", cwd=tmp_path)
    assert bad.returncode == 2 and "R notebook" in bad.stderr and "--prepare-only" in bad.stderr
    assert not (tmp_path / "o.ipynb").exists()
    # -l names the language for a notebook that does not say it
    py = cli(
        "run", str(NOTEBOOKS / "params.ipynb"), "j.ipynb", "-l", "julia", "-p", "name", "x",
        "--prepare-only", cwd=tmp_path,
    )  # fmt: skip
    assert py.returncode == 0, py.stderr
    sources = ["".join(c["source"]) for c in load(tmp_path / "j.ipynb")["cells"]]
    assert '# Parameters\nname = "x"\n' in sources
    with pytest.raises(spotbook.UsageError, match="julia notebook"):
        spotbook.execute_notebook(str(NOTEBOOKS / "params.ipynb"), None, language="julia")
