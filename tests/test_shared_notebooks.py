"""nbclient's and papermill's own test notebooks: the outcome their users expect.

Successful notebooks must also produce the same outputs as raw nbclient.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from traitlets.config import Config

from .conftest import SHARED, cells_committed, cli, comparable, kill, load, start_cli, wait_for

pytestmark = pytest.mark.slow

if not SHARED.is_dir():  # an extra compatibility suite: the project's own tests stand alone
    pytest.skip(
        f"nbclient's and papermill's test notebooks are not beside the repository ({SHARED})",
        allow_module_level=True,
    )

OK = 0
SEED = int(os.environ.get("SPOTBOOK_TEST_SEED", "20261129"))
# notebook -> (exit code, text the user sees on stderr)
EXPECTED = {
    "nbclient/Autokill.ipynb": (138, "kernel died while running cell 0"),
    "nbclient/Check History in Memory.ipynb": (OK, "succeeded"),
    "nbclient/Clear Output.ipynb": (OK, "succeeded"),
    "nbclient/Disable Stdin.ipynb": (1, "StdinNotImplementedError"),
    "nbclient/Empty Cell.ipynb": (OK, "succeeded"),
    "nbclient/Error.ipynb": (1, "raised ZeroDivisionError: division by zero"),
    "nbclient/Factorials.ipynb": (OK, "succeeded"),
    "nbclient/HelloWorld.ipynb": (OK, "succeeded"),
    "nbclient/Inline Image.ipynb": (OK, "succeeded"),
    "nbclient/Interrupt.ipynb": (4, "--execution-timeout"),
    "nbclient/JupyterWidgets.ipynb": (OK, "succeeded"),
    "nbclient/Other Comms.ipynb": (OK, "succeeded"),
    "nbclient/Output.ipynb": (OK, "succeeded"),
    "nbclient/SVG.ipynb": (OK, "succeeded"),
    "nbclient/Skip Exceptions with Cell Tags.ipynb": (OK, "succeeded"),
    "nbclient/Skip Exceptions.ipynb": (1, "raised Exception: message"),
    "nbclient/Skip Execution with Cell Tag.ipynb": (OK, "succeeded"),
    "nbclient/Sleep1s.ipynb": (OK, "succeeded"),
    "nbclient/Unicode.ipynb": (OK, "succeeded"),
    "nbclient/UnicodePy3.ipynb": (OK, "succeeded"),
    "nbclient/update-display-id.ipynb": (OK, "succeeded"),
    "papermill/broken.ipynb": (1, "SyntaxError"),
    "papermill/broken1.ipynb": (1, "raised AssertionError"),
    "papermill/complex_parameters.ipynb": (1, "SyntaxError"),
    "papermill/keyboard_interrupt.ipynb": (4, "--execution-timeout"),
    "papermill/line_magic_error.ipynb": (1, "UsageError: Line magic function"),
    "papermill/nb_version_4.4.ipynb": (OK, "succeeded"),
    "papermill/no_parameters.ipynb": (OK, "succeeded"),
    "papermill/read_check.ipynb": (1, "raised AssertionError"),
    "papermill/report_mode_test.ipynb": (OK, "succeeded"),
    "papermill/result_no_exec.ipynb": (OK, "succeeded"),
    "papermill/simple_execute.ipynb": (OK, "succeeded"),
    "papermill/sysexit.ipynb": (OK, "2/3 cells"),
    "papermill/sysexit0.ipynb": (OK, "2/3 cells"),
    "papermill/sysexit1.ipynb": (1, "raised SystemExit: 1"),
    "papermill/systemexit.ipynb": (OK, "2/3 cells"),
    "papermill/test_autosave.ipynb": (2, "no Jupyter kernel named 'python'"),
}
# Outputs that differ between any two runs (clock readings, object addresses).
NONDETERMINISTIC = {
    "nbclient/Sleep1s.ipynb",
    "nbclient/JupyterWidgets.ipynb",
    "nbclient/Output.ipynb",
}
# Succeed under papermill's rule (sys.exit(0) ends a run successfully); raw nbclient
# raises on them, so there is no nbclient output to compare with.
PAPERMILL_SEMANTICS = {
    "papermill/sysexit.ipynb",
    "papermill/sysexit0.ipynb",
    "papermill/systemexit.ipynb",
}


def test_every_shared_notebook_has_an_expectation() -> None:
    present = {f"{p.parent.name}/{p.name}" for p in SHARED.glob("*/*.ipynb")}
    not_covered = (
        present
        - set(EXPECTED)
        - {
            "nbclient/Parallel Execute A.ipynb",
            "nbclient/Parallel Execute B.ipynb",
            "papermill/binder.ipynb",
            "papermill/broken2.ipynb",
            "papermill/test_logging.ipynb",
        }
    )
    assert not_covered == set()


def _nbclient_outputs(path: Path) -> dict:
    """Raw nbclient's outputs. Its kernel talks over local sockets, as spotbook's does:
    on TCP, a kernel started while other tests start theirs can find a port it was given
    taken before it binds it, and die before it replies (seen once in CI)."""
    nb = nbformat.read(path, as_version=4)
    sockets = tempfile.mkdtemp(prefix="sb-nbclient-")  # short: a socket's path has a limit
    try:
        ipc = {"transport": "ipc", "ip": os.path.join(sockets, "kernel")}
        NotebookClient(
            nb,
            config=Config({"KernelManager": ipc}),
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
            allow_errors=False,
        ).execute()
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    return json.loads(nbformat.writes(nb))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shared_notebook_outcome(tmp_path: Path, name: str) -> None:
    src = SHARED / name
    code, text = EXPECTED[name]
    # the two endless notebooks are stopped by a short cell limit; the rest get a long
    # one, so a loaded CI machine cannot turn a slow cell into a false failure
    limit = "5" if code == 4 else "60"
    r = cli(
        "run",
        str(src),
        "out.ipynb",
        "--cwd",
        str(src.parent),
        "--execution-timeout",
        limit,
        cwd=tmp_path,
    )
    assert r.returncode == code, r.stderr
    assert text in r.stderr
    assert "Traceback (most recent call last)" not in r.stderr.split("spotbook: ")[-1]
    if code == 2:
        assert not (tmp_path / "out.ipynb").exists()
        return
    out = load(tmp_path / "out.ipynb")
    nbformat.validate(nbformat.from_dict(out))
    if code == 1:
        # papermill's banner, with papermill's tag alone (papermill's tools compare it)
        assert out["cells"][0]["metadata"]["tags"] == ["papermill-error-cell-tag"]
    if code == OK and name not in NONDETERMINISTIC | PAPERMILL_SEMANTICS:
        assert comparable(out) == comparable(_nbclient_outputs(src))


def test_skip_execution_tag_is_respected(tmp_path: Path) -> None:
    src = SHARED / "nbclient/Skip Execution with Cell Tag.ipynb"
    assert cli("run", str(src), "o.ipynb", cwd=tmp_path).returncode == 0
    first = load(tmp_path / "o.ipynb")["cells"][0]
    assert first["outputs"] == [] and first["execution_count"] is None


def test_read_check_passes_in_a_directory_with_its_file(tmp_path: Path) -> None:
    (tmp_path / "check.txt").write_text("x")
    r = cli(
        "run", str(SHARED / "papermill/read_check.ipynb"), "o.ipynb", "--cwd", ".", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr


def test_kernel_alias_with_k_runs_autosave_notebook(tmp_path: Path) -> None:
    r = cli(
        "run",
        str(SHARED / "papermill/test_autosave.ipynb"),
        "o.ipynb",
        "-k",
        "python3",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr


def test_parallel_notebooks_run_side_by_side(tmp_path: Path) -> None:
    env = {"NBEXECUTE_TEST_PARALLEL_TMPDIR": str(tmp_path)}
    procs = [
        start_cli(
            "run",
            str(SHARED / f"nbclient/Parallel Execute {x}.ipynb"),
            f"{x}.ipynb",
            "--no-progress-bar",
            cwd=tmp_path,
            env=env,
        )
        for x in "AB"
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err


def test_ctrl_c_during_a_long_cell_saves_and_exits_75(tmp_path: Path) -> None:
    proc = start_cli(
        "run",
        str(SHARED / "papermill/keyboard_interrupt.ipynb"),
        "o.ipynb",
        "--run-dir",
        "rd",
        "--grace",
        "0.5",
        cwd=tmp_path,
    )
    wait_for(lambda: (tmp_path / "rd" / "attempts" / "0001.json").exists(), what="start")
    wait_for(
        lambda: (
            "running" in (tmp_path / "rd" / "output.ipynb").read_text()
            if (tmp_path / "rd" / "output.ipynb").exists()
            else False
        ),
        what="cell running",
    )
    code, err = kill(proc, signal.SIGINT)
    assert code == 75, err
    assert "spotbook resume" in err
    doc = json.loads(cli("status", "rd", "--json", cwd=tmp_path).stdout)
    assert doc["status"] == "interrupted" and doc["attempts"][0]["outcome"] == "stopped"


@pytest.fixture
def slow_kernel(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An IPython profile that holds the kernel after the notebook's cell SB_HOLD_AT (0-based)
    has run, before its reply: the records of the cells before it commit, and a kill
    once they have lands while that cell is unfinished, on any machine, without changing
    the notebook. It lets go when its runner is gone."""
    ipdir = tmp_path_factory.mktemp("ipython")
    startup = ipdir / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-hold.py").write_text(
        "import os, time\n"
        "_seen = [0]\n"
        "_parent = os.getppid()\n"
        "def _hold(result):\n"
        "    if result.info is None or result.info.silent or not result.info.store_history:\n"
        "        return\n"
        "    _seen[0] += 1\n"
        "    if _seen[0] == int(os.environ.get('SB_HOLD_AT', '-1')) + 1:\n"
        "        while os.getppid() == _parent:\n"
        "            time.sleep(0.01)  # a poll: the runner's death is the event\n"
        "get_ipython().events.register('post_run_cell', _hold)\n"
    )
    return {"IPYTHONDIR": str(ipdir)}


RESUMABLE = sorted(n for n, (code, _) in EXPECTED.items() if code == OK)


@pytest.mark.parametrize("name", RESUMABLE)
def test_killed_at_a_random_cell_and_resumed_finishes_identically(
    tmp_path: Path, name: str, slow_kernel: dict[str, str]
) -> None:
    src = SHARED / name
    args = ["--cwd", str(src.parent)]
    ref = cli("run", str(src), "ref.ipynb", "--run-dir", "ref", *args, cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr
    total = json.loads(cli("status", "ref", "--json", cwd=tmp_path).stdout)["cells_done"]
    k = random.Random(f"{SEED}-{name}").randrange(total)  # cells committed before the kill
    rd = tmp_path / "rd"
    proc = start_cli(
        "run",
        str(src),
        "out.ipynb",
        "--run-dir",
        "rd",
        "--snapshot",
        "every-cell",
        *args,
        cwd=tmp_path,
        env={**slow_kernel, "SB_HOLD_AT": str(k)},
    )
    wait_for(
        lambda: (rd / "attempts" / "0001.json").exists() and cells_committed(rd) >= k,
        what=f"{k} cells committed",
    )
    kill(proc)
    assert proc.returncode == -signal.SIGKILL, f"run ended before the kill (k={k})"
    r = cli("resume", "rd", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(cli("status", "rd", "--json", cwd=tmp_path).stdout)
    assert [a["outcome"] for a in doc["attempts"]] == ["killed", "completed"]
    got, want = load(tmp_path / "out.ipynb"), load(tmp_path / "ref.ipynb")
    if name in NONDETERMINISTIC:  # clock readings, widget ids: the shape must match
        assert [len(c[2] or []) for c in comparable(got)] == [
            len(c[2] or []) for c in comparable(want)
        ]
    else:
        assert comparable(got) == comparable(want), f"killed after {k} cells"


def test_python_m_spotbook_and_entry_point_agree(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "spotbook"
    r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert r.stdout.startswith("spotbook ")


def test_output_widgets_do_not_stall_under_cpu_load(tmp_path: Path) -> None:
    """A missed ZeroMQ wake-up under load used to stall a cell until its timeout (raw
    nbclient: half of the runs of this notebook with two CPU hogs on 2 cores)."""
    src = SHARED / "nbclient" / "Output.ipynb"
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        for trial in range(3):
            r = cli(
                "run",
                str(src),
                "--run-dir",
                f"rd{trial}",
                "--cwd",
                str(src.parent),
                "--execution-timeout",
                "30",
                cwd=tmp_path,
                timeout=120,
            )
            assert r.returncode == 0, (trial, r.stderr[-2000:])
    finally:
        for h in hogs:
            h.kill()
            h.wait()
