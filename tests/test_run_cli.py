"""`spotbook run` as a user runs it: real subprocess, real ipykernel."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import cells_committed, cli, kill, load, start_cli, wait_for, write_notebook

pytestmark = pytest.mark.slow


def _injected(nb: dict) -> str:
    cell = next(c for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", []))
    return "".join(cell["source"])


def _texts(nb: dict) -> str:
    return "".join(
        o.get("text", "") + json.dumps(o.get("data", {}))
        for c in nb["cells"]
        for o in c.get("outputs", [])
    )


def test_parameters_flags_and_store(work: Path) -> None:
    (work / "p.yaml").write_text("items: [1, 2]\nname: from-file\n")
    sub = work / "sub"
    sub.mkdir()
    r = cli(
        "run",
        "params.ipynb",
        "out.ipynb",
        "-p",
        "alpha",
        "2",
        "-p",
        "flag",
        "True",
        "-r",
        "opt",
        "7",
        "-f",
        "p.yaml",
        "-y",
        "name: from-yaml",
        "--cwd",
        "sub",
        "--log-output",
        "--start-timeout",
        "30",
        "-k",
        "python3",
        cwd=work,
    )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    out = load(work / "out.ipynb")
    src = _injected(out)
    assert "alpha = 2\n" in src and "flag = True\n" in src and 'opt = "7"' in src
    assert "items = [1, 2]" in src and 'name = "from-yaml"' in src
    texts = _texts(out)
    assert "2 from-yaml True [1, 2] 7" in texts
    assert "sub\n" in texts  # --cwd
    assert "2 from-yaml True [1, 2] 7" in r.stderr  # --log-output
    # with papermill's separators, each cell numbered as papermill numbers it (the
    # markdown cell 1, the parameters 2, the injected ones 3, the print 4)
    lines = r.stderr.splitlines()
    at = lines.index("2 from-yaml True [1, 2] 7")
    assert lines[at - 1] == "Executing Cell 4" + "-" * 39
    assert lines[at + 1] == "Ending Cell 4" + "-" * 42
    assert "Executing Cell 1-" not in r.stderr  # a markdown cell is not executed
    assert out["metadata"]["papermill"]["parameters"]["alpha"] == 2
    # the run store: where it was said to be, with every part of the layout
    line = next(ln for ln in r.stderr.splitlines() if ", store " in ln)
    run_dir = Path(line.split(", store ")[1])
    assert run_dir.parent == work / ".spotbook" / "runs"
    assert not (run_dir / "key").exists()  # the run key is never in the store
    for part in ("run.json", "input.ipynb", "output.ipynb", "attempts/0001.json"):
        assert (run_dir / part).exists(), part
    assert cells_committed(run_dir) == 5  # one record per executed cell
    assert load(run_dir / "output.ipynb")["cells"] == out["cells"]
    assert load(run_dir / "attempts" / "0001.json")["outcome"] == "completed"
    frozen = load(run_dir / "input.ipynb")
    assert _injected(frozen) == src


def test_status_json_and_runs_table(work: Path) -> None:
    r = cli("run", "params.ipynb", "--no-progress-bar", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "Executing:" not in r.stderr
    run_id = r.stderr.split("spotbook: run ")[1].split(",")[0]
    st = cli("status", run_id, "--json", cwd=work)
    doc = json.loads(st.stdout)
    assert doc["status"] == "succeeded" and doc["cells_done"] == doc["cells_total"] == 4
    assert doc["failing_cell"] is None
    (a,) = doc["attempts"]
    assert a["outcome"] == "completed" and a["ended"] >= a["started"]
    table = cli("runs", cwd=work).stdout
    assert run_id in table and "succeeded" in table and "4/4" in table
    human = cli("status", run_id, cwd=work).stdout
    assert "succeeded" in human and "4/4" in human


def test_a_command_does_not_import_jsonschemas_format_checkers(work: Path) -> None:
    """A command's process imports nbformat but not the libraries of jsonschema's optional
    format checks, among them rfc3987_syntax, whose import builds a grammar's parser (2 s
    of every command's start; bench/bench_cli_start.py), even where they are installed,
    as they are in this environment beside JupyterLab; and a command that reads a
    notebook (nbformat validates it) still works without them."""
    import importlib.util
    import subprocess
    import sys

    from spotbook.cli.main import FORMAT_CHECK_MODULES

    assert importlib.util.find_spec("rfc3987_syntax") is not None  # it is here to skip
    installed = [m for m in FORMAT_CHECK_MODULES if importlib.util.find_spec(m) is not None]
    assert {"rfc3987_syntax", "arrow", "isoduration"} <= set(installed), installed
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['spotbook', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('spotbook', run_name='__main__')\n"
        "except SystemExit as exc:\n    code = exc.code\n"
        "print(code, 'nbformat' in sys.modules,\n"
        f"      *[sys.modules.get(m, 'absent') for m in {installed!r}])\n"
    )
    for argv, code in ((["status", "no-such-run"], "2"), (["inspect", "params.ipynb"], "0")):
        r = subprocess.run([sys.executable, "-c", probe, *argv], cwd=work, capture_output=True,
                           text=True, check=False, env={**os.environ})  # fmt: skip
        last = r.stdout.splitlines()[-1].split()  # (the command's own output comes first)
        assert last == [code, "True", *["None"] * len(installed)], (r.stdout, r.stderr)


def test_progress_bar_is_tqdms_on_stderr_by_default(work: Path) -> None:
    """papermill's bar: one step per cell (markdown too), percent, rate; the running
    cell's first line as its description unless cell output is echoed."""
    r = cli("run", "params.ipynb", "out.ipynb", cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert "100%" in r.stderr and "| 5/5 [" in r.stderr and "cell/s]" in r.stderr
    assert "Executing print(alpha, name, flag, items, opt): " in r.stderr
    assert "Executing import os: " in r.stderr
    # as papermill: --log-output turns the bar off unless it is asked for
    r = cli("run", "params.ipynb", "out.ipynb", "--log-output", cwd=work)
    assert "default False" in r.stderr and "%|" not in r.stderr
    r = cli("run", "params.ipynb", "out.ipynb", "--log-output", "--progress-bar", cwd=work)
    assert "Executing: 100%" in r.stderr and "Executing import os" not in r.stderr
    # papermill's marker names a cell whatever --log-output says
    write_notebook(work / "named.ipynb", "x = 1  # papermill_description=setup", "y = 2")
    r = cli("run", "named.ipynb", "o2.ipynb", "--log-output", "--progress-bar", cwd=work)
    assert "Executing setup: " in r.stderr and "| 2/2 [" in r.stderr
    # the bar never reaches the log (the pod's worker leaves it off)
    r = cli("run", "params.ipynb", "out.ipynb", "--no-progress-bar", cwd=work)
    assert "Executing" not in r.stderr and "%|" not in r.stderr


def test_output_and_input_as_urls(work: Path) -> None:
    r = cli(
        "run",
        f"file://{work}/params.ipynb",
        f"file://{work}/o.ipynb",
        "--run-dir",
        f"file://{work}/store",
        cwd=work,
    )
    assert r.returncode == 0, r.stderr
    assert load(work / "o.ipynb")["metadata"]["spotbook"]["final"] is True
    assert (work / "store" / "run.json").exists()


def test_failing_cell_is_marked_and_exits_1(work: Path) -> None:
    r = cli("run", "error.ipynb", "out.ipynb", "--run-dir", "rd", cwd=work)
    assert r.returncode == 1
    assert "cell 1 (In [2]) raised ValueError: bad value 1" in r.stderr
    assert "Traceback" not in r.stderr
    out = load(work / "out.ipynb")
    top = out["cells"][0]
    # papermill's banner word for word, what failed in its metadata
    assert top["cell_type"] == "markdown" and "In [2]</a>" in "".join(top["source"])
    assert top["metadata"]["tags"] == ["papermill-error-cell-tag"]
    assert top["metadata"]["spotbook"] == {
        "failed_cell": 1,
        "ename": "ValueError",
        "evalue": "bad value 1",
    }
    # the banner first, papermill's anchor just before the failing cell (input cell 1)
    assert "papermill-error-cell" in "".join(out["cells"][2]["source"])
    assert out["cells"][3]["metadata"]["spotbook"]["status"] == "failed"
    assert out["cells"][3]["metadata"]["papermill"]["status"] == "failed"
    assert out["cells"][4]["metadata"]["spotbook"]["status"] == "pending"
    assert "before" in _texts(out)
    doc = json.loads(cli("status", "rd", "--json", cwd=work).stdout)
    assert doc["status"] == "failed"
    assert doc["failing_cell"]["index"] == 1 and doc["failing_cell"]["ename"] == "ValueError"


def test_allow_errors_goes_on_past_a_failing_cell(work: Path) -> None:
    """nbconvert's --allow-errors (nbclient's allow_errors through the library): the
    error stays in the notebook, the cells after it run, the run succeeds, and a resume
    that replays the failing cell accepts its error again."""
    r = cli("run", "error.ipynb", "out.ipynb", "--run-dir", "rd", "--allow-errors", cwd=work)
    assert r.returncode == 0, r.stderr
    out = load(work / "out.ipynb")
    code = [c for c in out["cells"] if c["cell_type"] == "code"]
    assert [o["output_type"] for o in code[1]["outputs"]][-1] == "error"
    assert "never" in json.dumps(code[2]["outputs"])
    assert json.loads(cli("status", "rd", "--json", cwd=work).stdout)["status"] == "succeeded"
    import spotbook

    nb = spotbook.execute_notebook(
        str(work / "error.ipynb"), str(work / "lib.ipynb"), allow_errors=True,
        run_dir=str(work / "lib"), progress_bar=False,
    )  # fmt: skip
    assert "never" in json.dumps(nb.cells[-1].outputs)
    r = cli("run", "error.ipynb", "o2.ipynb", "--run-dir", "rd2", cwd=work)
    assert r.returncode == 1  # without it, as before
    write_notebook(
        work / "again.ipynb",
        "x = 1",
        "raise ValueError('expected')",
        "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.01)",
        "print(x + 1)",
    )
    proc = start_cli(
        "run", "again.ipynb", "again-out.ipynb", "--run-dir", "rd3", "--allow-errors",
        "--snapshot", "off", cwd=work,
    )  # fmt: skip
    wait_for(lambda: cells_committed(work / "rd3") >= 2, what="the failing cell's record")
    kill(proc)
    (work / "go").touch()
    r = cli("resume", "rd3", cwd=work)  # replays cells 0 and 1: the error is allowed again
    assert r.returncode == 0, r.stderr
    doc = json.loads(cli("status", "rd3", "--json", cwd=work).stdout)
    assert doc["attempts"][-1]["replayed"] == [0, 1] and doc["status"] == "succeeded"
    assert "2" in json.dumps(load(work / "again-out.ipynb")["cells"][3]["outputs"])


def test_cell_timeout_exits_4_and_keeps_finished_cells(work: Path) -> None:
    r = cli(
        "run",
        "slow_cell.ipynb",
        "out.ipynb",
        "--execution-timeout",
        "1",
        "--run-dir",
        "rd",
        cwd=work,
    )
    assert r.returncode == 4, r.stderr
    assert "--execution-timeout" in r.stderr
    out = load(work / "out.ipynb")
    statuses = [
        c["metadata"]["spotbook"]["status"] for c in out["cells"] if c["cell_type"] == "code"
    ]
    assert statuses == ["completed", "failed", "pending"]
    assert (
        json.loads(cli("status", "rd", "--json", cwd=work).stdout)["attempts"][0]["outcome"]
        == "timed-out"
    )


def test_run_timeout_exits_4(work: Path) -> None:
    r = cli("run", "slow_cell.ipynb", "--timeout", "2", cwd=work)
    assert r.returncode == 4, r.stderr
    assert "--timeout" in r.stderr and "Traceback" not in r.stderr


def test_kernel_death_is_reported(work: Path) -> None:
    r = cli("run", "kernel_exit.ipynb", "out.ipynb", cwd=work)
    assert r.returncode == 138, r.stderr  # papermill's code for a dead kernel
    assert "kernel died while running cell 1" in r.stderr
    out = load(work / "out.ipynb")
    assert "about to exit" in _texts(out)
    assert out["cells"][3]["metadata"]["spotbook"]["status"] == "failed"


def test_huge_output_is_capped_and_kept_whole_in_the_store(work: Path) -> None:
    r = cli("run", "big_output.ipynb", "out.ipynb", "--run-dir", "rd", cwd=work)
    assert r.returncode == 0, r.stderr
    size = (work / "out.ipynb").stat().st_size
    assert size < 10 * 1024 * 1024
    assert "characters omitted" in _texts(load(work / "out.ipynb"))
    (full,) = (work / "rd" / "outputs").iterdir()
    assert full.stat().st_size == 50 * 1024 * 1024
    assert "after" in _texts(load(work / "out.ipynb"))


def test_stream_flushes_are_joined_in_order(work: Path) -> None:
    """Each flush is its own kernel message; the saved notebook must not depend on
    how they fell (a loaded CI machine split one print in two), nor reorder them."""
    write_notebook(
        work / "flushes.ipynb",
        "import sys\n"
        "for part in 'abc':\n"
        "    sys.stdout.write(part); sys.stdout.flush()\n"
        "print('!', file=sys.stderr); sys.stderr.flush()\n"
        "print('d')",
        "from IPython.display import clear_output\n"
        "print('gone'); sys.stdout.flush()\n"
        "clear_output(wait=True)\n"
        "print('kept')",
    )
    r = cli("run", "flushes.ipynb", "out.ipynb", cwd=work)
    assert r.returncode == 0, r.stderr
    first, second = (c["outputs"] for c in load(work / "out.ipynb")["cells"])
    assert [(o["name"], "".join(o["text"])) for o in first] == [
        ("stdout", "abc"),
        ("stderr", "!\n"),
        ("stdout", "d\n"),
    ]
    assert [(o["name"], "".join(o["text"])) for o in second] == [("stdout", "kept\n")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["truncated.ipynb"], "does not parse"),
        (["not_notebook.ipynb"], "not a Jupyter notebook"),
        (["v3.ipynb"], "nbconvert --to notebook --nbformat 4"),
        (["missing.ipynb"], "does not exist"),
        (["params.ipynb", "-k", "no-such-kernel"], "no Jupyter kernel named 'no-such-kernel'"),
        (["params.ipynb", "-p", "9lives", "1"], "not a valid Python variable name"),
        (["params.ipynb", "-f", "nope.yaml"], "does not exist"),
        (["params.ipynb", "-f", "bad.yaml"], "not valid YAML"),
        (["params.ipynb", "-y", "[1, 2]"], "must be a YAML mapping"),
        (["params.ipynb", "/nonexistent-dir/out.ipynb"], "does not exist; create it first"),
        (["params.ipynb", "--snapshot", "sometimes"], "--snapshot must be one of"),
        (["params.ipynb", "--execution-timeout", "-1"], "positive"),
        (["params.ipynb", "--cwd", "nowhere"], "not a directory"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(work: Path, args: list[str], message: str) -> None:
    (work / "bad.yaml").write_text("a: [1, 2\n")
    r = cli("run", *args, cwd=work)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_unwritable_output_fails_before_running(work: Path) -> None:
    r = cli("run", "params.ipynb", "/proc/out.ipynb", cwd=work)
    assert r.returncode == 2 and "not writable" in r.stderr, r.stderr
    assert not (work / ".spotbook").exists() or not any((work / ".spotbook").rglob("cells/*"))


def test_output_path_that_is_a_directory(work: Path) -> None:
    (work / "adir").mkdir()
    r = cli("run", "params.ipynb", "adir", cwd=work)
    assert r.returncode == 2 and "is a directory" in r.stderr


def test_argparse_usage_errors_exit_2(work: Path) -> None:
    r = cli("run", cwd=work)
    assert r.returncode == 2 and "usage:" in r.stderr
    r = cli("status", "no-such-run", cwd=work)
    assert r.returncode == 2 and "no spotbook run" in r.stderr


def test_prepare_only_writes_the_parameterised_notebook(work: Path) -> None:
    r = cli("run", "params.ipynb", "prep.ipynb", "-p", "alpha", "9", "--prepare-only", cwd=work)
    assert r.returncode == 0, r.stderr
    nb = load(work / "prep.ipynb")
    assert "alpha = 9" in _injected(nb)
    assert all(not c.get("outputs") for c in nb["cells"])


def test_an_unknown_parameter_is_warned_of_as_papermill_does(work: Path) -> None:
    """A misspelt ``-p`` name is injected all the same (papermill's behaviour), with
    papermill's warning and the closest name the parameters cell assigns."""
    r = cli(
        "run", "params.ipynb", "prep.ipynb", "-p", "alpah", "9", "-p", "name", "x",
        "--prepare-only", cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Passed unknown parameter: alpah (did you mean 'alpha'?)" in r.stderr
    assert "name" not in r.stderr.split("unknown parameter", 1)[1].split("\n", 1)[1]
    assert "alpah = 9" in _injected(load(work / "prep.ipynb"))
    r = cli("run", "no_kernelspec.ipynb", "o.ipynb", "-p", "alpha", "1", cwd=work)
    assert r.returncode == 0 and "has no cell tagged 'parameters'" in r.stderr, r.stderr
    r = cli("run", "params.ipynb", "o2.ipynb", "-p", "alpha", "1", cwd=work)
    assert r.returncode == 0 and "unknown parameter" not in r.stderr, r.stderr


def test_notebook_without_kernelspec_uses_python3(work: Path) -> None:
    r = cli("run", "no_kernelspec.ipynb", "o.ipynb", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "hi" in _texts(load(work / "o.ipynb"))


@pytest.mark.parametrize("where", ["IPYTHONDIR", "JUPYTER_PATH"])
def test_a_kernel_is_found_where_jupyter_looks(work: Path, where: str) -> None:
    """spotbook gives jupyter_client the folders to search (its default imports IPython
    in every command): a kernelspec in IPython's folder or on JUPYTER_PATH is still found,
    and a missing one is named with those that are there."""
    import sys

    base = work / where.lower()
    folder = base / "kernels" / f"py-{where.lower()}"
    folder.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": where,
        "language": "python",
    }
    (folder / "kernel.json").write_text(json.dumps(spec))
    env = {where: str(base)}
    r = cli("run", "no_kernelspec.ipynb", "o.ipynb", "-k", folder.name, cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    assert "hi" in _texts(load(work / "o.ipynb"))
    r = cli("run", "no_kernelspec.ipynb", "o.ipynb", "-k", "nope", cwd=work, env=env)
    assert r.returncode == 2 and folder.name in r.stderr, r.stderr


def test_a_deep_temporary_folder_still_starts_the_kernel(work: Path) -> None:
    """The kernel's sockets live in a temporary folder; under a $TMPDIR as deep as a pod's
    or a CI worker's, their paths would pass an AF_UNIX address's 107 bytes (exit 3,
    "File name too long"), so they go to a shorter one."""
    deep = work / ("t" * 60) / ("m" * 60)
    deep.mkdir(parents=True)
    r = cli("run", "no_kernelspec.ipynb", "o.ipynb", cwd=work, env={"TMPDIR": str(deep)})
    assert r.returncode == 0, r.stderr
    assert "hi" in _texts(load(work / "o.ipynb"))


def test_rerun_of_a_finished_run_dir_does_not_recompute(work: Path) -> None:
    assert cli("run", "params.ipynb", "--run-dir", "rd", cwd=work).returncode == 0
    r = cli("run", "params.ipynb", "o2.ipynb", "--run-dir", "rd", cwd=work)
    assert r.returncode == 0, r.stderr
    assert len(os.listdir(work / "rd" / "attempts")) == 1  # no second attempt
    assert (work / "o2.ipynb").exists()


def test_changed_notebook_is_refused_without_restart(work: Path) -> None:
    assert cli("run", "params.ipynb", "--run-dir", "rd", cwd=work).returncode == 0
    r = cli("run", "params.ipynb", "--run-dir", "rd", "-p", "alpha", "3", cwd=work)
    assert r.returncode == 2 and "--restart" in r.stderr
    r = cli(
        "run",
        "params.ipynb",
        "o.ipynb",
        "--run-dir",
        "rd",
        "-p",
        "alpha",
        "3",
        "--restart",
        cwd=work,
    )
    assert r.returncode == 0, r.stderr
    assert "3 default" in _texts(load(work / "o.ipynb"))


def test_papermills_other_flags(work: Path) -> None:
    """-b, the injected paths, --report-mode, --no-log-output, --start_timeout,
    --autosave-cell-every, --stdout-file/--stderr-file, and engine or language values
    spotbook cannot honour refused (exit 2), as papermill's users write them."""
    import base64

    b64 = base64.b64encode(b"alpha: 5\nname: b64").decode()
    r = cli(
        "run",
        "params.ipynb",
        "out.ipynb",
        "-b",
        b64,
        "--inject-paths",
        "--report-mode",
        "--no-log-output",
        "--start_timeout",
        "30",
        "--autosave-cell-every",
        "10",
        "--stdout-file",
        "so.txt",
        "--engine",
        "nbclient",
        "-l",
        "python",
        cwd=work,
    )
    assert r.returncode == 0, r.stderr
    out = load(work / "out.ipynb")
    src = _injected(out)
    assert 'PAPERMILL_INPUT_PATH = "params.ipynb"' in src
    assert 'PAPERMILL_OUTPUT_PATH = "out.ipynb"' in src
    assert "alpha = 5" in src and 'name = "b64"' in src
    assert "5 b64" in (work / "so.txt").read_text()
    code = [c for c in out["cells"] if c["cell_type"] == "code"]
    assert all(c["metadata"]["jupyter"]["source_hidden"] for c in code)
    assert r.stderr.rstrip().endswith("output in " + str(work / "out.ipynb"))
    for flag, value in (("--engine", "dask"), ("--language", "R")):
        bad = cli("run", "params.ipynb", "o2.ipynb", flag, value, cwd=work)
        assert bad.returncode == 2 and value in bad.stderr, bad.stderr


def test_dash_reads_stdin_and_writes_stdout(work: Path) -> None:
    """`-` as INPUT and OUTPUT, as papermill pipes notebooks; only the notebook goes to
    stdout, also when a cell fails."""
    import subprocess
    import sys

    def pipe(src: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "spotbook", "run", "-", "-", "-p", "alpha", "9"],
            input=(work / src).read_bytes(),
            capture_output=True,
            cwd=work,
            timeout=180,
            check=False,
        )

    r = pipe("params.ipynb")
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout)
    assert "9 default" in json.dumps([c.get("outputs") for c in out["cells"]])
    failed = pipe("error.ipynb")
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["metadata"]["papermill"]["exception"] is True


def test_left_out_paths_follow_papermills_pipes(work: Path) -> None:
    """papermill's rules for left-out paths: a pipe on stdin is INPUT (one path given is
    OUTPUT), OUTPUT left out with stdout not a terminal is stdout; with --run-dir the
    result stays in the store; an empty pipe says which path was taken as OUTPUT."""
    import subprocess
    import sys

    def run(*args: str, stdin: bytes | None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "spotbook", "run", *args],
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            cwd=work,
            timeout=180,
            check=False,
        )

    text = (work / "params.ipynb").read_bytes()
    both = run("-p", "alpha", "7", stdin=text)  # `spotbook run < in.ipynb | less`
    assert both.returncode == 0, both.stderr.decode()
    assert "7 default" in json.dumps([c.get("outputs") for c in json.loads(both.stdout)["cells"]])
    into = run("piped.ipynb", stdin=text)  # `spotbook run out.ipynb < in.ipynb`
    assert into.returncode == 0 and not into.stdout, into.stderr.decode()
    assert "0.5 default" in json.dumps(
        [c.get("outputs") for c in load(work / "piped.ipynb")["cells"]]
    )
    out = run("params.ipynb", stdin=None)  # `spotbook run in.ipynb | jq`
    assert out.returncode == 0 and json.loads(out.stdout)["cells"], out.stderr.decode()
    kept = run("params.ipynb", "--run-dir", "rd", stdin=None)
    assert kept.returncode == 0 and not kept.stdout, kept.stderr.decode()
    empty = run("params.ipynb", stdin=b"")
    assert empty.returncode == 2 and "taken as OUTPUT" in empty.stderr.decode()
    assert (work / "params.ipynb").read_bytes() == text
    none = run(stdin=None)
    assert none.returncode == 2 and "required: INPUT" in none.stderr.decode()


def test_output_grows_as_the_run_goes_and_survives_a_kill(work: Path) -> None:
    """OUTPUT is rewritten as cells commit, as papermill keeps it: a user opens it during
    a long cell and finds the cells before it; after kill -9 it is still a whole notebook
    with those cells; the resume finishes it."""
    write_notebook(
        work / "live.ipynb",
        "print('first')",
        "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.01)\nprint('second')",
    )
    out = work / "live-out.ipynb"

    def shows_first() -> bool:
        try:
            doc = load(out)
        except (OSError, ValueError):  # not there yet (it is replaced whole, never partial)
            return False
        return "first" in json.dumps(doc["cells"][0].get("outputs"))

    proc = start_cli("run", "live.ipynb", str(out), "--run-dir", "rd", cwd=work)
    wait_for(shows_first, what="cell 0 in OUTPUT while cell 1 runs")
    assert proc.poll() is None
    kill(proc)
    assert shows_first() and not load(out)["cells"][1].get("outputs")
    (work / "go").touch()
    assert cli("resume", "rd", cwd=work).returncode == 0
    assert "second" in json.dumps(load(out)["cells"][1]["outputs"])


def test_output_shows_the_running_cells_output_so_far(work: Path) -> None:
    """A long cell's prints reach OUTPUT (and the store's notebook, which the dashboard
    shows) while it still runs, as papermill's autosave has them; after kill -9 they are
    there, marked running; the resume's OUTPUT has the cell's whole output, once."""
    write_notebook(
        work / "epochs.ipynb",
        "x = 1",
        "import os, time\nprint('epoch 1', flush=True)\n"
        "while not os.path.exists('go'):\n    time.sleep(0.01)\nprint('epoch 2')",
    )
    out = work / "epochs-out.ipynb"

    def running_cell_shows(where: Path) -> bool:
        try:
            cell = load(where)["cells"][1]
        except (OSError, ValueError, IndexError):
            return False
        return cell["metadata"]["papermill"]["status"] == "running" and "epoch 1" in json.dumps(
            cell["outputs"]
        )

    proc = start_cli("run", "epochs.ipynb", str(out), "--run-dir", "rd", cwd=work)
    wait_for(lambda: running_cell_shows(out), timeout=120, what="cell 1's print in OUTPUT")
    wait_for(lambda: running_cell_shows(work / "rd" / "output.ipynb"), what="the store's")
    assert proc.poll() is None
    kill(proc)
    assert running_cell_shows(out)
    (work / "go").touch()
    assert cli("resume", "rd", cwd=work).returncode == 0
    final = json.dumps(load(out)["cells"][1]["outputs"])
    assert final.count("epoch 1") == 1 and "epoch 2" in final, final


def test_the_same_command_again_continues_an_interrupted_run(work: Path) -> None:
    """papermill users rerun the command after a crash: without --run-dir, the same
    notebook, parameters, OUTPUT and kernel continue the run the kill interrupted (said on
    the first line); after it succeeded the command is a new run, as papermill's is;
    other parameters or --restart are new runs too."""
    write_notebook(
        work / "again.ipynb",
        "x = 1",
        "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.01)",
        "print(x + 1)",
    )
    runs_dir = work / ".spotbook" / "runs"

    def runs() -> list[Path]:
        return [p for p in runs_dir.iterdir() if p.is_dir()] if runs_dir.is_dir() else []

    proc = start_cli("run", "again.ipynb", "again-out.ipynb", "--snapshot", "every-cell", cwd=work)
    wait_for(lambda: any(cells_committed(p) >= 1 for p in runs()))
    kill(proc)
    (first,) = runs()
    (work / "go").touch()
    r = cli("run", "again.ipynb", "again-out.ipynb", "--snapshot", "every-cell", cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"spotbook: continuing run {first.name}, interrupted with 1 of 3")
    # in a person's words, cells numbered as papermill numbers them
    assert "restored the kernel's state after cell 1 of 3; no cell replayed" in r.stderr
    doc = json.loads(cli("status", str(first), "--json", cwd=work).stdout)
    assert [a["outcome"] for a in doc["attempts"]] == ["killed", "completed"]
    assert doc["attempts"][1]["resumed_from"] == 1
    assert sorted(p.name for p in runs()) == [first.name]
    assert list(runs_dir.iterdir()) == [first]  # the identity is kept beside, not in it
    r = cli("run", "again.ipynb", "again-out.ipynb", cwd=work)  # succeeded: a new run
    assert r.returncode == 0 and "continuing" not in r.stderr, r.stderr
    assert len(runs()) == 2
    (work / "go").unlink()
    proc = start_cli("run", "again.ipynb", "again-out.ipynb", cwd=work)
    wait_for(lambda: sum(cells_committed(p) for p in runs()) >= 3 * 2 + 1)
    kill(proc)
    (work / "go").touch()
    for args in (["-p", "x", "2"], ["--restart"]):
        r = cli("run", "again.ipynb", "again-out.ipynb", *args, cwd=work)
        assert r.returncode == 0 and "continuing" not in r.stderr, (args, r.stderr)
    assert len(runs()) == 5
