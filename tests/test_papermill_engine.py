"""papermill with ``--engine spotbook``: papermill's own command line and API, with
spotbook's engine found through the ``papermill.engine`` entry point — the same notebook
papermill's engine gives, papermill's error on a failed cell, and the same command run
again after a kill continuing the run (on the same node, and on a wiped one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import (
    NOTEBOOKS,
    cells_committed,
    comparable,
    kill,
    load,
    node_lost,
    wait_for,
    write_notebook,
)

pytestmark = pytest.mark.slow


def papermill(*args: str, cwd: Path, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "papermill", *args, "--no-progress-bar"],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


def start_papermill(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "papermill", *args, "--no-progress-bar"],
        cwd=cwd,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


PARAMS = ["-p", "alpha", "2.5", "-p", "name", "x y", "-y", "items: [1, {a: 2}]"]


def test_papermills_command_line_runs_through_spotbook(tmp_path: Path) -> None:
    """One word changed: the notebook papermill's own engine gives, and a run store
    beside it with every cell's record."""
    nb = str(NOTEBOOKS / "params.ipynb")
    own = papermill(nb, "pm.ipynb", *PARAMS, "-k", "python3", cwd=tmp_path)
    assert own.returncode == 0, own.stderr
    env = {"SPOTBOOK_ENGINE_RUN_DIR": str(tmp_path / "rd")}
    ours = papermill(nb, "sb.ipynb", *PARAMS, "-k", "python3", "--engine", "spotbook",
                     cwd=tmp_path, env=env)  # fmt: skip
    assert ours.returncode == 0, ours.stderr
    pm, sb = load(tmp_path / "pm.ipynb"), load(tmp_path / "sb.ipynb")
    assert comparable(sb) == comparable(pm)
    assert sb["metadata"]["papermill"]["parameters"] == pm["metadata"]["papermill"]["parameters"]
    run = json.loads((tmp_path / "rd" / "run.json").read_text())
    assert run["status"] == "succeeded"
    code = [c for c in sb["cells"] if c["cell_type"] == "code"]
    assert cells_committed(tmp_path / "rd") == len(code)


def test_a_failed_cell_is_papermills_error_on_papermills_notebook(tmp_path: Path) -> None:
    nb = str(NOTEBOOKS / "error.ipynb")
    own = papermill(nb, "pm.ipynb", cwd=tmp_path)
    ours = papermill(nb, "sb.ipynb", "--engine", "spotbook", cwd=tmp_path)
    assert own.returncode == ours.returncode == 1, ours.stderr
    assert "PapermillExecutionError" in ours.stderr, ours.stderr[-2000:]

    def marked(path: Path) -> list[tuple[str, list[str]]]:
        return [(c["cell_type"], c["metadata"].get("tags", [])) for c in load(path)["cells"]]

    # papermill's banner and anchor, once each (not spotbook's as well)
    assert marked(tmp_path / "sb.ipynb") == marked(tmp_path / "pm.ipynb")
    assert load(tmp_path / "sb.ipynb")["metadata"]["papermill"]["exception"] is True


def test_papermills_api_with_engine_name(tmp_path: Path) -> None:
    """``execute_notebook(..., engine_name="spotbook")`` with the engine's own options;
    a failed cell raises papermill's class."""
    code = f"""
import papermill as pm, json, sys
nb = pm.execute_notebook({str(NOTEBOOKS / "params.ipynb")!r}, "out.ipynb",
    parameters={{"alpha": 0.5}}, engine_name="spotbook", kernel_name="python3",
    progress_bar=False, run_dir="rd", snapshot="every-cell")
print(json.dumps(nb.metadata.papermill.parameters))
try:
    pm.execute_notebook({str(NOTEBOOKS / "error.ipynb")!r}, "err.ipynb",
        engine_name="spotbook", progress_bar=False)
except pm.PapermillExecutionError as exc:
    print(exc.ename, exc.evalue)
"""
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    params, error = r.stdout.splitlines()[-2:]
    assert json.loads(params) == {"alpha": 0.5}
    assert error.split()[0] in ("ZeroDivisionError", "ValueError", "Exception"), error
    snaps = list((tmp_path / "rd" / "state" / "snap").iterdir())
    assert snaps, "snapshot='every-cell' reached the run"


@pytest.mark.parametrize("wiped", [False, True], ids=["same node", "wiped node"])
def test_the_same_papermill_command_after_a_kill_continues(tmp_path: Path, wiped: bool) -> None:
    """A papermill habit: run the command again. Cell 0 (its random draw) is not run again,
    the kernel's state comes back, and the run goes on from the cell that was killed. On a
    wiped node (working directory, home and temp emptied) the run store is one that
    outlives the node (SPOTBOOK_ENGINE_RUN_DIR), and so is the run key (in a pod: a Secret);
    on the same node the store is the default one, found by the command's identity."""
    node, outside = tmp_path / "node", tmp_path / "outside"
    outside.mkdir()
    log, gate = outside / "log", outside / "gate"
    source = tmp_path / "gated.ipynb"
    write_notebook(
        source,
        "import random\ntoken = random.random()\n"
        f"open({str(log)!r}, 'a').write(f'cell0 {{token}}\\n')",
        "import os, time\nopen('started', 'w').close()\n"
        f"while not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)",
        "print('token', token)",
    )

    def make_node() -> None:
        for name in ("work", "home", "tmp"):
            (node / name).mkdir(parents=True, exist_ok=True)
        shutil.copy(source, node / "work" / "gated.ipynb")

    make_node()
    env = {
        "HOME": str(node / "home"),
        "TMPDIR": str(node / "tmp"),
        "SPOTBOOK_CACHE_DIR": str(node / "home" / "cache"),  # the default store's place
    }
    rd = outside / "rd" if wiped else None
    if wiped:
        env |= {"SPOTBOOK_ENGINE_RUN_DIR": str(rd), "SPOTBOOK_CONFIG_DIR": str(outside / "cfg")}
    argv = ("gated.ipynb", "out.ipynb", "--engine", "spotbook", "--log-output")
    proc = start_papermill(*argv, cwd=node / "work", env=env)
    try:
        wait_for(lambda: (node / "work" / "started").exists(), 120, "cell 1 to start", proc)
        runs = node / "home" / "cache" / "runs"
        store = rd or next(runs.iterdir())  # the default store, one run in the cache
        wait_for(lambda: cells_committed(store) >= 1, 60, "cell 0's record", proc)
    finally:
        kill(proc)
    if wiped:
        node_lost(node / "tmp")
        shutil.rmtree(node)
        make_node()
    gate.touch()
    again = papermill(*argv, cwd=node / "work", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    drawn = log.read_text().split()
    assert drawn[0] == "cell0" and len(drawn) == 2, drawn  # cell 0 ran once
    out = load(node / "work" / "out.ipynb")
    assert "".join(out["cells"][2]["outputs"][0]["text"]) == f"token {drawn[1]}\n"
    assert "attempt 2 starting at cell 2 of 3" in again.stderr, again.stderr[-2000:]
    assert (
        out["metadata"]["papermill"]["exception"] is None
        or not out["metadata"]["papermill"]["exception"]
    )
