"""Sweeps: the grid, a 12-point local sweep killed as a process group and resumed, a
failing point, the status and results tables, the Indexed Job (strictly validated), and
a submitted sweep on the fake API server with real workers as pods."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from kubernetes_validate import utils as kv

import spotbook
from spotbook._errors import ParameterError
from spotbook.kube.manifest import JobOptions, build_job
from spotbook.notebook.grid import expand, read_rows, typed_values, varying
from spotbook.store.runstore import RunStore

from .conftest import cli, kill, start_cli, wait_for
from .servers import FakeKube
from .test_cluster import disrupted, pod, terminated
from .test_job_manifest import SUPPORTED

GRID = "lr: [0.1, 0.2, 0.3]\nseed: [1, 2, 3, 4]\n"


def write_sweep_notebook(path: Path) -> None:
    """Four steps of a seeded random walk, an optional failure, two records."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("lr = 0.1\nseed = 0\nfail = False")
    params.metadata["tags"] = ["parameters"]
    # with SWEEP_GATE set, step 2 waits for that file: a test that kills the sweep finds
    # every started point part-way, on any machine, and releases it before the resume
    gate = (
        "while os.environ.get('SWEEP_GATE') and not os.path.exists(os.environ['SWEEP_GATE']):\n"
        "    time.sleep(0.01)\n"
    )
    steps = [
        nbformat.v4.new_code_cell(
            (gate if k == 2 else "") + f"acc += lr * rng.random()\nsteps.append({k})"
        )
        for k in range(4)
    ]
    nb.cells = [
        params,
        nbformat.v4.new_code_cell("import os, random, time, spotbook\nrng = random.Random(seed)\n"
                                  "acc = 0.0\nsteps = []"),
        *steps,
        nbformat.v4.new_code_cell("if fail:\n    raise ValueError('this point fails')"),
        nbformat.v4.new_code_cell("spotbook.record('acc', round(acc, 12))\n"
                                  "spotbook.record('steps', steps)"),
    ]  # fmt: skip
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)


def expected_acc(lr: float, seed: int) -> float:
    import random

    rng = random.Random(seed)
    acc = 0.0
    for _ in range(4):
        acc += lr * rng.random()
    return round(acc, 12)


# -- the grid -------------------------------------------------------------------------
def test_the_grid_is_a_product_with_zip_and_rows() -> None:
    assert typed_values("0.1,2,x,True") == [0.1, 2, "x", True] and typed_values("3") == 3
    points = expand({"lr": [0.1, 0.01], "seed": [1, 2], "epochs": 3})
    assert points == [
        {"epochs": 3, "lr": 0.1, "seed": 1},
        {"epochs": 3, "lr": 0.1, "seed": 2},
        {"epochs": 3, "lr": 0.01, "seed": 1},
        {"epochs": 3, "lr": 0.01, "seed": 2},
    ]
    assert varying(points) == ["lr", "seed"]
    zipped = expand({"zip": {"a": [1, 2], "b": ["x", "y"]}, "layers": [[64, 64], [8]]})
    assert zipped == [
        {"a": 1, "b": "x", "layers": [64, 64]},
        {"a": 1, "b": "x", "layers": [8]},
        {"a": 2, "b": "y", "layers": [64, 64]},
        {"a": 2, "b": "y", "layers": [8]},
    ]
    rows = read_rows("lr,name\n0.5,a\n1,b\n", "g.csv")
    assert rows == [{"lr": 0.5, "name": "a"}, {"lr": 1, "name": "b"}]
    assert read_rows('{"lr": 0.5}\n\n{"lr": [1]}\n', "g.jsonl") == [{"lr": 0.5}, {"lr": [1]}]
    assert expand({"seed": [1, 2]}, rows) == [
        {"lr": 0.5, "name": "a", "seed": 1},
        {"lr": 0.5, "name": "a", "seed": 2},
        {"lr": 1, "name": "b", "seed": 1},
        {"lr": 1, "name": "b", "seed": 2},
    ]
    for bad, match in (
        ({"zip": {"a": [1, 2], "b": [1]}}, "equal length: a has 2, b has 1"),
        ({"zip": {"a": 1}}, "a is not a list"),
        ({"lr": []}, "empty list"),
        ({"not a name": [1, 2]}, "not a name"),
    ):
        with pytest.raises(ParameterError, match=match):
            expand(bad)
    with pytest.raises(ParameterError, match="line 3 has not one value per column"):
        read_rows("a,b\n1,2\n3\n", "g.csv")
    with pytest.raises(ParameterError, match=r"\.csv or \.jsonl"):
        read_rows("a", "g.txt")


# -- local sweeps ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> spotbook.SweepTable:
    """The 12-point sweep run once, uninterrupted, through the Python API."""
    where = tmp_path_factory.mktemp("sweep-ref")
    write_sweep_notebook(where / "sweep.ipynb")
    table = spotbook.sweep(
        str(where / "sweep.ipynb"),
        str(where / "ref"),
        {"lr": [0.1, 0.2, 0.3], "seed": [1, 2, 3, 4]},
        parallel=3,
    )
    return table


@pytest.mark.slow
def test_the_python_api_runs_every_point_and_returns_the_table(
    reference: spotbook.SweepTable,
) -> None:
    assert len(reference.rows) == 12 and reference.exit_code() == 0
    assert reference.varying == ["lr", "seed"]
    for r in reference.rows:
        assert (
            r.status == "succeeded" and r.cells_done == r.cells_total == 9
        )  # with the injected parameters
        assert r.results == {
            "acc": expected_acc(r.parameters["lr"], r.parameters["seed"]),
            "steps": [0, 1, 2, 3],
        }
        assert r.url.endswith(f"/points/{r.index}") and r.attempts == 1
    first = reference.records()[0]
    assert list(first)[:4] == ["point", "lr", "seed", "status"] and first["acc"] is not None


@pytest.mark.slow
def test_cost_of_a_sweep_is_every_points_bill_and_their_sum(
    tmp_path: Path, reference: spotbook.SweepTable
) -> None:
    doc = json.loads(cli("cost", reference.url, "--json", cwd=tmp_path).stdout)
    points, totals = doc["points"], doc["totals"]
    assert [p["url"] for p in points] == [r.url for r in reference.rows]
    assert totals["attempts"] == 12 and totals["preemptions"] == 0
    assert totals["node_hours"] == pytest.approx(
        sum(p["totals"]["node_hours"] for p in points), abs=1e-5
    )
    text = cli("cost", reference.url, cwd=tmp_path)
    assert text.returncode == 0 and "sweep    12 points:" in text.stdout, text.stderr


@pytest.mark.parametrize(
    ("points", "said"),
    [
        ({"points": [{"index": "0", "parameters": {}}]}, "its index is not a whole number"),
        ({"points": [{"index": 0}]}, "its parameters are not a JSON object"),
        ({"points": [{"index": -1, "parameters": {}}]}, "its index -1 is out of range"),
        ({"points": [7]}, "a JSON int, not an object"),
        ({"points": [{"index": 0, "parameters": {}}] * 2}, "lists a point twice"),
        ({"points": {"0": {}}}, "holds no list of points"),
        ([], "holds no list of points"),
    ],
)
def test_a_sweep_json_changed_in_the_store_is_refused_not_a_crash(
    tmp_path: Path, points: Any, said: str
) -> None:
    """Each point's store is named from sweep.json, which is not sealed: what spotbook
    sweep never writes is refused (exit 2) by every command that reads it."""
    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / "sweep.json").write_text(json.dumps(points))
    for argv in (["cost", "sw"], ["sweep", "status", "sw"], ["sweep", "results", "sw"]):
        r = cli(*argv, cwd=tmp_path)
        assert r.returncode == 2, (argv, r.stderr)
        assert said in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)


@pytest.mark.slow
def test_a_killed_sweep_resumes_every_point_to_the_same_results(
    tmp_path: Path, reference: spotbook.SweepTable
) -> None:
    write_sweep_notebook(tmp_path / "sweep.ipynb")
    (tmp_path / "grid.yaml").write_text(GRID)
    url = str(tmp_path / "sw")
    argv = [sys.executable, "-m", "spotbook", "sweep", "sweep.ipynb", "--run-dir", "sw"]
    argv += ["-f", "grid.yaml", "--parallel", "3", "--snapshot", "every-cell"]
    gate = tmp_path / "gate"
    proc = subprocess.Popen(
        argv, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "SWEEP_GATE": str(gate)},
    )  # fmt: skip

    def committed() -> dict[int, int]:
        out = {}
        for i in range(12):
            store = RunStore(f"{url}/points/{i}")
            if store.exists("run.json"):
                out[i] = len(store.cell_records())
        return out

    # several points part-way (held at the gate): the kill lands in the middle of the sweep
    wait_for(lambda: sum(committed().values()) >= 12, timeout=180, what="12 cells")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    gate.touch()
    before = committed()
    assert 0 < sum(before.values()) < 12 * 9, before
    table = spotbook.sweep_status(url)
    unfinished = [r.index for r in table.rows if r.status != "succeeded"]
    assert unfinished and table.exit_code() == 75
    assert any(0 < before.get(i, 0) < 9 for i in unfinished), before

    r = cli("sweep", "resume", "sw", "--parallel", "3", "--json", cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)["points"]
    assert [p["status"] for p in shown] == ["succeeded"] * 12
    after = spotbook.sweep_status(url)
    assert [(r.parameters, r.results) for r in after.rows] == [
        (r.parameters, r.results) for r in reference.rows
    ]
    for i in unfinished:
        store = RunStore(f"{url}/points/{i}")
        records = store.cell_records()
        attempts = store.attempts()
        if before.get(i, 0):
            # resumed, not restarted: what attempt 1 committed is attempt 1's still, and
            # attempt 2 began after it with the kernel's state restored, no cell replayed
            assert sum(1 for rec in records.values() if rec["attempt"] == 1) == before[i]
            assert attempts[-1]["resumed_from"] > 0 and attempts[-1].get("replayed") == []
    # sweep status: the table, as text, JSON and CSV
    text = cli("sweep", "status", "sw", cwd=tmp_path)
    assert text.returncode == 0 and "12 points: 12 succeeded" in text.stdout
    assert text.stdout.splitlines()[0].split()[:4] == ["POINT", "LR", "SEED", "STATUS"]
    rows = list(
        csv.DictReader(io.StringIO(cli("sweep", "status", "sw", "--csv", cwd=tmp_path).stdout))
    )
    assert [float(r["acc"]) for r in rows] == [r.results["acc"] for r in reference.rows]
    assert sum(int(r["preemptions"]) for r in rows) >= 1
    out = cli("sweep", "results", "sw", "-o", "results.jsonl", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [x["steps"] for x in lines] == [[0, 1, 2, 3]] * 12
    import pandas as pd

    assert cli("sweep", "results", "sw", "-o", "r.parquet", cwd=tmp_path).returncode == 0
    frame = pd.read_parquet(tmp_path / "r.parquet")
    assert list(frame["acc"]) == [r.results["acc"] for r in reference.rows]
    assert list(frame.columns[:4]) == ["point", "lr", "seed", "status"]


@pytest.mark.slow
def test_a_failing_point_fails_alone_and_the_sweep_says_so(tmp_path: Path) -> None:
    write_sweep_notebook(tmp_path / "sweep.ipynb")
    r = cli("sweep", "sweep.ipynb", "out_{fail}.ipynb", "--run-dir", "sw", "-p", "fail",
            "False,True", "-p", "seed", "7", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "2 points: 1 failed, 1 succeeded" in r.stdout
    table = spotbook.sweep_status(str(tmp_path / "sw"))
    ok, bad = table.rows
    assert ok.status == "succeeded" and ok.results["acc"] == expected_acc(0.1, 7)
    assert bad.status == "failed" and bad.results == {} and "this point fails" in bad.message
    assert (tmp_path / "out_False.ipynb").exists() and (tmp_path / "out_True.ipynb").exists()
    # the output notebook carries the records as outputs, as scrapbook keeps its scraps
    cells = nbformat.read(tmp_path / "out_False.ipynb", as_version=4).cells
    recorded = [o for o in cells[-1].outputs if o.get("output_type") == "display_data"]
    assert recorded[0]["data"]["application/vnd.spotbook.record+json"]["name"] == "acc"
    # the same command again leaves finished points alone; another grid is refused
    again = cli("sweep", "resume", "sw", cwd=tmp_path)
    assert again.returncode == 1 and "0 of 2 points to run" in again.stderr
    other = cli("sweep", "sweep.ipynb", "--run-dir", "sw", "-p", "fail", "True", cwd=tmp_path)
    assert other.returncode == 2 and "other points" in other.stderr
    (tmp_path / "g.txt").write_text("lr\n1\n")
    bad_rows = cli("sweep", "sweep.ipynb", "--run-dir", "x", "--rows", "g.txt", cwd=tmp_path)
    assert bad_rows.returncode == 2 and ".csv or .jsonl" in bad_rows.stderr
    missing = cli("sweep", "status", "nowhere", cwd=tmp_path)
    assert missing.returncode == 2 and "no sweep in" in missing.stderr
    # a writer of the store forges a point's result: its record fails its check, as it
    # would on resume; the results leave it out, name it, and exit 2
    records = next((tmp_path / "sw" / "points" / "0" / "cells").glob("*.jsonl"))
    value = json.dumps(expected_acc(0.1, 7))
    assert value in records.read_text()
    records.write_text(records.read_text().replace(value, "0.999"))
    forged = cli("sweep", "results", "sw", cwd=tmp_path)
    assert forged.returncode == 2, forged.stderr
    assert "point 0: results refused" in forged.stderr and "0.999" not in forged.stdout


def test_prepare_only_help_notebook_and_cwd_reach_every_point(tmp_path: Path) -> None:
    # run's flags mean the same in a sweep: they were parsed, and ignored, before the
    # sweep's points were made from one RunRequest
    write_sweep_notebook(tmp_path / "sweep.ipynb")
    (tmp_path / "data").mkdir()
    shown = cli("sweep", "sweep.ipynb", "--help-notebook", cwd=tmp_path)
    assert shown.returncode == 0 and "lr: float (default 0.1)" in shown.stdout, shown.stderr
    assert not (tmp_path / "sw").exists()
    r = cli("sweep", "sweep.ipynb", "out_{seed}.ipynb", "--run-dir", "sw", "-p", "seed", "1,2",
            "--cwd", "data", "--prepare-only", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "2 points prepared" in r.stderr and "sweep resume sw" in r.stderr
    for i, seed in enumerate((1, 2)):
        point = RunStore(str(tmp_path / "sw" / "points" / str(i)))
        spec = point.require_run()["spec"]
        assert spec["parameters"] == {"seed": seed} and spec["cwd"] == str(tmp_path / "data")
        assert point.attempts() == [] and point.cell_records() == {}  # none ran
        written = nbformat.read(tmp_path / f"out_{seed}.ipynb", as_version=4)
        assert f"seed = {seed}" in written.cells[1].source  # the injected parameters
    ran = cli("sweep", "resume", "sw", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert [row.status for row in spotbook.sweep_status(str(tmp_path / "sw")).rows] == [
        "succeeded",
        "succeeded",
    ]


def test_record_refuses_what_json_cannot_hold() -> None:
    # IPython imported, as another test in this process may have done, but no shell:
    # outside a kernel the value is checked only (no shell made to publish it)
    import IPython.core.display_functions  # noqa: F401
    from IPython.core.interactiveshell import InteractiveShell

    spotbook.record("fine", {"a": [1, 2.5, None]})
    assert not InteractiveShell.initialized()
    with pytest.raises(ValueError, match="JSON-serialisable"):
        spotbook.record("x", {1, 2})
    with pytest.raises(ValueError, match="JSON-serialisable"):
        spotbook.record("x", float("nan"))


# -- on Kubernetes --------------------------------------------------------------------
def sweep_job(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"run_id": "sw1", "run_dir": "gs://b/sweeps/s", "image": "img:1"}
    return build_job(JobOptions(**{**base, "points": 12, "parallelism": 3, **kw}))


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_indexed_job_validates_strictly(version: str) -> None:
    kv.validate(sweep_job(gpu_type="nvidia-l4", gpu_count=1, queue="q"), version, strict=True)


def test_the_indexed_job_fails_points_not_the_sweep() -> None:
    spec = sweep_job(max_failed_points=2)["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == 12
    assert spec["parallelism"] == 3 and spec["maxFailedIndexes"] == 2
    assert spec["backoffLimitPerIndex"] == JobOptions(run_dir="x", image="i").backoff_limit
    assert "backoffLimit" not in spec
    ignore, fail = spec["podFailurePolicy"]["rules"]
    assert ignore["action"] == "Ignore" and fail["action"] == "FailIndex"
    env = {e["name"]: e.get("value") for e in spec["template"]["spec"]["containers"][0]["env"]}
    assert env["SPOTBOOK_SWEEP_POINTS"] == "1" and env["SPOTBOOK_RUN_DIR"] == "gs://b/sweeps/s"
    assert sweep_job()["spec"]["maxFailedIndexes"] == 12  # by default every point runs
    for bad in ({"points": 0}, {"parallelism": 0}, {"max_failed_points": 13}):
        with pytest.raises(spotbook.UsageError):
            sweep_job(**bad)


@pytest.mark.slow
def test_a_submitted_sweep_replaces_a_preempted_index_and_fails_one_point(
    tmp_path: Path, kube: FakeKube
) -> None:
    """The test plays the Job controller: one pod per index, real workers. Index 1 is
    preempted and replaced (it resumes); index 2 fails; the Job fails with
    FailedIndexes and `sweep --submit --wait` exits 1."""
    write_sweep_notebook(tmp_path / "sweep.ipynb")
    rd = f"file://{tmp_path}/sw"
    waiter = start_cli(
        "sweep", "sweep.ipynb", "--run-dir", rd, "--submit", "--wait", "--image", "img:1",
        "--gpu", "nvidia-l4", "--grace", "0.5", "--memory", "1Gi", "-p", "seed", "1,2",
        "-p", "fail", "False,True", "--parallel", "2",
        cwd=tmp_path, env=kube.env,
    )  # fmt: skip
    (job,) = wait_for(lambda: kube.objects("jobs"), timeout=60, what="the Job")
    assert job["spec"]["completions"] == 4 and job["spec"]["parallelism"] == 2
    sweep_id = job["metadata"]["labels"]["spotbook.dev/run-id"]
    name = job["metadata"]["name"]

    gate = tmp_path / "gate"  # point 0's first pod is held part-way until its SIGTERM

    def worker(index: int, pod_name: str) -> subprocess.Popen[str]:
        return start_cli(
            "worker",
            cwd=tmp_path,
            env={
                **kube.env,
                "SPOTBOOK_RUN_DIR": rd,
                "SPOTBOOK_SWEEP_POINTS": "1",
                "JOB_COMPLETION_INDEX": str(index),
                "POD_NAME": pod_name,
                "NODE_NAME": "gke-spot-1",
                "POD_NAMESPACE": "default",
                "SWEEP_GATE": str(gate),
            },
        )

    # points: 0 seed 1 ok, 1 seed 1 fail, 2 seed 2 ok, 3 seed 2 fail
    first = worker(0, "p0")
    kube.put("pods", pod("p0", sweep_id, "Running", node="gke-spot-1"))
    wait_for(lambda: len(RunStore(f"{rd}/points/0").cell_records()) >= 3, what="3 cells")
    code, err = kill(first, signal.SIGTERM)
    assert code == 75, err
    gate.touch()
    kube.put("pods", disrupted("p0", sweep_id, "gke-spot-1", "TerminationByKubelet"))
    table = spotbook.sweep_status(rd)
    assert table.rows[0].status == "interrupted" and table.rows[0].preemptions == 1
    replacement = worker(0, "p0b")
    for i in (1, 2, 3):
        w = worker(i, f"p{i}")
        w.communicate(timeout=180)
        assert w.returncode == (1 if i % 2 else 0)
    replacement.communicate(timeout=180)
    assert replacement.returncode == 0
    kube.put("pods", pod("p0b", sweep_id, "Succeeded", node="n", containerStatuses=terminated(0)))
    kube.set_status(
        "jobs",
        "default",
        name,
        {
            "failed": 2,
            "succeeded": 2,
            "failedIndexes": "1,3",
            "conditions": [{"type": "Failed", "status": "True", "reason": "FailedIndexes"}],
        },
    )
    _, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 1, err
    assert "2 failed, 2 succeeded" in err
    table = spotbook.sweep_status(rd)
    assert [r.status for r in table.rows] == ["succeeded", "failed", "succeeded", "failed"]
    assert table.rows[0].attempts == 2 and table.rows[0].preemptions == 1
    assert table.rows[0].results["acc"] == expected_acc(0.1, 1)
    assert table.rows[2].results["acc"] == expected_acc(0.1, 2)
    shown = cli("sweep", "status", rd, cwd=tmp_path)
    assert "4 points: 2 failed, 2 succeeded" in shown.stdout
    # the sweep's job.json is sealed too: `wait` read it above; a changed one is refused
    record = tmp_path / "sw" / "job.json"
    doc = json.loads(record.read_text())
    record.write_text(json.dumps({**doc, "namespace": "kube-system"}))
    again = cli("wait", rd, cwd=tmp_path, env=kube.env)
    assert again.returncode == 2 and "job.json failed its integrity check" in again.stderr


@pytest.mark.slow
def test_ctrl_c_stops_every_point_with_exit_75(tmp_path: Path) -> None:
    """SIGINT to the sweep process alone (as `kill -INT` would send it): it stops every
    point it started, each saving its progress, starts no more, and exits 75."""
    write_sweep_notebook(tmp_path / "sweep.ipynb")
    url = tmp_path / "sw"
    proc = start_cli(
        "sweep", "sweep.ipynb", "--run-dir", "sw", "-p", "seed", "1,2,3,4", "--parallel", "2",
        cwd=tmp_path, env={"SWEEP_GATE": str(tmp_path / "gate")},  # never released
    )  # fmt: skip
    wait_for(
        lambda: sum(len(RunStore(f"{url}/points/{i}").cell_records()) for i in (0, 1)) >= 4,
        timeout=120,
        what="4 cells",
    )
    code, err = kill(proc, signal.SIGINT)
    assert code == 75, err
    assert "SIGINT: stopping every point" in err
    table = spotbook.sweep_status(str(url))
    statuses = [r.status for r in table.rows]
    assert "running" not in statuses and statuses[2:] == ["pending", "pending"], statuses
    assert table.exit_code() == 75
