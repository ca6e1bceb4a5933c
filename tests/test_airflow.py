"""A real pipeline tool driving spotbook's papermill engine end to end: Airflow's
``PapermillOperator`` in a DAG run with ``airflow dags test``, the DAG unchanged, spotbook
picked by ``SPOTBOOK_ENGINE_DEFAULT=1`` in Airflow's environment (the operator names no
engine). The task is killed part-way and the DAG run again, as a retry would: the notebook
continues after its last finished cell with its state.

Airflow has its own venv (``.cache/airflow-venv``, made by scripts/check.sh: its pins are
not the suite's). Airflow was picked over Ploomber and Prefect because its papermill
provider is the most used way to run notebooks in pipelines; it installs in about a
minute from the package index's wheels, and ``dags test`` needs no scheduler, only a
SQLite database.

Not on a wiped node: the run store is given (SPOTBOOK_ENGINE_RUN_DIR) outside the working
directory, as test_papermill_engine's wiped-node case does with papermill itself; what
Airflow adds here is only who calls papermill."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from .conftest import cells_committed, load, wait_for, write_notebook

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
AIRFLOW = ROOT / ".cache" / "airflow-venv" / "bin" / "airflow"

DAG = """
import pendulum
from airflow import DAG
from airflow.providers.papermill.operators.papermill import PapermillOperator

with DAG("nb", start_date=pendulum.datetime(2026, 1, 1), schedule=None, catchup=False):
    PapermillOperator(task_id="run", input_nb={input!r}, output_nb={output!r},
                      parameters={{"lr": 0.7}}, kernel_name="python3")
"""


@pytest.fixture
def airflow_env(tmp_path: Path) -> dict[str, str]:
    if not AIRFLOW.exists():
        pytest.skip("scripts/check.sh installs Airflow in .cache/airflow-venv")
    (tmp_path / "dags").mkdir()
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "SPOTBOOK_ENGINE_DEFAULT": "1",
        "SPOTBOOK_ENGINE_RUN_DIR": str(tmp_path / "rd"),
    }
    env.pop("PYTHONPATH", None)
    r = subprocess.run(
        [str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return env


def test_airflows_papermill_operator_runs_through_spotbook_and_a_rerun_continues(
    tmp_path: Path, airflow_env: dict[str, str]
) -> None:
    log, gate = tmp_path / "log", tmp_path / "gate"
    write_notebook(
        tmp_path / "gated.ipynb",
        "lr = 0.1",
        "import random\ntoken = random.random()\n"
        f"open({str(log)!r}, 'a').write(f'cell0 {{token}}\\n')",
        "import os, time\n"
        f"open({str(tmp_path / 'started')!r}, 'w').close()\n"
        f"while not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)",
        "print('token', token, 'lr', lr)",
        parameters=True,
    )
    out = tmp_path / "out.ipynb"
    dag = DAG.format(input=str(tmp_path / "gated.ipynb"), output=str(out))
    (tmp_path / "dags" / "nb.py").write_text(dag)
    argv = [str(AIRFLOW), "dags", "test", "nb"]
    # its own process group: Airflow runs the task in a child process of its own
    first = subprocess.Popen(
        argv, env=airflow_env, cwd=tmp_path, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: (tmp_path / "started").exists(), 300, "cell 2 to start", first)
        wait_for(lambda: cells_committed(tmp_path / "rd") >= 2, 60, "cells 0 and 1", first)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate(timeout=60)
    gate.touch()
    again = subprocess.run(
        argv, env=airflow_env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    drawn = log.read_text().split()
    assert drawn[0] == "cell0" and len(drawn) == 2, drawn  # cell 0 ran once
    result = load(out)
    printed = [c for c in result["cells"] if "print('token'" in "".join(c["source"])]
    assert "".join(printed[0]["outputs"][0]["text"]) == f"token {drawn[1]} lr 0.7\n"
    attempts = sorted(p.name for p in (tmp_path / "rd" / "attempts").iterdir())
    assert attempts == ["0001.json", "0002.json"]
    assert result["metadata"]["papermill"]["parameters"] == {"lr": 0.7}
