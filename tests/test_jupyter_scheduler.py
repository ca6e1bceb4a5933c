"""jupyter-scheduler with spotbook's backend, through its REST API on a real Jupyter
server on loopback: create a job, watch it run, kill its runner, see it resume (cell 0
not run again, its random draw kept), download its outputs; a stopped job stays stopped;
and JupyterLab's "Notebook Jobs" page in Chromium listing a job spotbook ran.

Not on a wiped node: the job's run store is in the scheduler's staging area, on the
Jupyter server's own disk; a job whose server's disk is gone is gone from the
scheduler's database too (a submitted run, which outlives nodes, is test_cluster's)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotbook.store.runstore import RunStore

from .conftest import cells_committed, wait_for, write_notebook
from .servers import _wait_port, free_port

pytestmark = pytest.mark.slow
pytest.importorskip("jupyter_scheduler", reason="scripts/check.sh installs jupyter-scheduler")

TOKEN = "spotbook-test-token-0123456789abcdef"


class Server:
    def __init__(
        self,
        root: Path,
        state: Path,
        env: dict[str, str] | None = None,
        compute: dict[str, Any] | None = None,
    ) -> None:
        self.root, self.state = root, state
        self.port = free_port()
        env = {
            **os.environ,
            **(env or {}),
            "JUPYTER_DATA_DIR": str(state / "data"),
            "JUPYTER_RUNTIME_DIR": str(state / "runtime"),
            "JUPYTER_CONFIG_DIR": str(state / "config"),
        }
        (state / "config").mkdir(parents=True, exist_ok=True)
        (state / "config" / "jupyter_server_config.py").write_text(
            f"c.SpotbookScheduler.compute = {compute or {}!r}\n"
        )
        cmd = [
            sys.executable, "-m", "jupyter_server", f"--port={self.port}", "--ip=127.0.0.1",
            "--no-browser", "--allow-root", f"--ServerApp.root_dir={root}",
            f"--IdentityProvider.token={TOKEN}",
            "--ServerApp.jpserver_extensions={'jupyter_scheduler': True, 'jupyterlab': True}",
            "--LabApp.expose_app_in_browser=True",  # the page's app, for the browser test
            "--SchedulerApp.scheduler_class="
            "spotbook.integrations.jupyter_scheduler.SpotbookScheduler",
            f"--SchedulerApp.db_url=sqlite:///{state}/scheduler.sqlite",
            "--SchedulerApp.environment_manager_class="
            "spotbook.integrations.jupyter_scheduler.SpotbookEnvironmentManager",
            f"--Scheduler.staging_path={state / 'staging'}",
        ]  # fmt: skip
        # started in its root, as `jupyter lab` is: the scheduler downloads a job's
        # files to a path relative to the server's working directory
        with open(state / "server.log", "wb") as fh:
            self.proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=fh, stderr=fh)
        _wait_port(self.port, self.proc, "jupyter server")

    def call(self, method: str, path: str, body: Any = None) -> Any:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read()
        return json.loads(text) if text else None

    def job(self, job_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = self.call("GET", f"scheduler/jobs/{job_id}")
        return doc

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def serving(tmp_path: Path, **kw: Any) -> Iterator[Server]:
    root, state = tmp_path / "root", tmp_path / "state"
    root.mkdir()
    state.mkdir()
    s = Server(root, state, **kw)
    try:
        wait_for(lambda: _answers(s), 60, "the scheduler's API", s.proc)
        yield s
    finally:
        s.stop()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with serving(tmp_path) as s:
        yield s


def _answers(s: Server) -> bool:
    try:
        s.call("GET", "scheduler/jobs")
        return True
    except OSError:
        return False


def test_a_job_killed_part_way_resumes_and_its_outputs_download(
    server: Server, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    log, gate = outside / "log", outside / "gate"
    write_notebook(
        server.root / "gated.ipynb",
        "lr = 0.1",
        "import random\ntoken = random.random()\n"
        f"open({str(log)!r}, 'a').write(f'cell0 {{token}}\\n')",
        "import os, time\nopen('started', 'w').close()\n"
        f"while not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)",
        "print('token', token, 'lr', lr)",
        parameters=True,
    )
    created = server.call(
        "POST",
        "scheduler/jobs",
        {
            "input_uri": "gated.ipynb",
            "name": "gated",
            "runtime_environment_name": "python3",
            "output_formats": ["ipynb", "html"],
            "parameters": {"lr": "0.5"},
        },
    )
    job_id = created["job_id"]
    staging = server.state / "staging" / job_id
    store = server.state / "staging" / ".spotbook-runs" / job_id
    wait_for(lambda: (staging / "started").exists(), 120, "cell 2 to start")
    wait_for(lambda: cells_committed(store) >= 2, 60, "cells 0 and 1's records")
    assert server.job(job_id)["status"] == "IN_PROGRESS"
    # the runner, killed as a crash or the OOM killer would (its pid is in its attempt)
    runner = json.loads((store / "attempts" / "0001.json").read_text())["pid"]
    os.kill(runner, signal.SIGKILL)
    wait_for(lambda: not _running(runner), 60, "the runner to die")
    gate.touch()
    # asking the scheduler about the job finds its runner gone and starts it again
    done = wait_for(
        lambda: (j := server.job(job_id))["status"] in ("COMPLETED", "FAILED") and j,
        180,
        "the job to finish",
    )
    assert done["status"] == "COMPLETED", done
    drawn = log.read_text().split()
    assert drawn[0] == "cell0" and len(drawn) == 2, drawn  # cell 0 ran once
    attempts = sorted(p.name for p in (store / "attempts").iterdir())
    assert attempts == ["0001.json", "0002.json"]
    # the outputs, through the scheduler's own download
    server.call("GET", f"scheduler/jobs/{job_id}/download_files")  # copies, in a process

    def downloaded() -> dict[str, str] | None:
        found = {f["file_format"]: f["file_path"] for f in server.job(job_id)["job_files"]}
        return found if all(found.values()) else None

    files = wait_for(downloaded, 60, "the job's files to download")
    assert {"input", "ipynb", "html"} <= set(files), files
    out = json.loads((server.root / files["ipynb"]).read_text())
    printed = [c for c in out["cells"] if "print('token'" in "".join(c["source"])]
    assert "".join(printed[0]["outputs"][0]["text"]) == f"token {drawn[1]} lr 0.5\n"
    assert f"token {drawn[1]}" in (server.root / files["html"]).read_text()


def test_a_stopped_job_stays_stopped(server: Server, tmp_path: Path) -> None:
    write_notebook(
        server.root / "forever.ipynb",
        "import time\nopen('started', 'w').close()\nwhile True:\n    time.sleep(0.05)",
    )
    job_id = server.call(
        "POST",
        "scheduler/jobs",
        {"input_uri": "forever.ipynb", "name": "f", "runtime_environment_name": "python3",
         "output_formats": ["ipynb"]},
    )["job_id"]  # fmt: skip
    staging = server.state / "staging" / job_id
    wait_for(lambda: (staging / "started").exists(), 120, "the cell to start")
    server.call("PATCH", f"scheduler/jobs/{job_id}", {"status": "STOPPED"})
    wait_for(lambda: server.job(job_id)["status"] == "STOPPED", 60, "the job to stop")
    jobs = server.call("GET", "scheduler/jobs")["jobs"]  # a listing resumes nothing stopped
    assert [j["status"] for j in jobs if j["job_id"] == job_id] == ["STOPPED"]
    store = server.state / "staging" / ".spotbook-runs" / job_id
    assert sorted(p.name for p in (store / "attempts").iterdir()) == ["0001.json"]


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_jupyterlabs_job_list_shows_the_job(server: Server, browser: Any, tmp_path: Path) -> None:
    write_notebook(server.root / "quick.ipynb", "x = 1", "print(x + 1)")
    job_id = server.call(
        "POST",
        "scheduler/jobs",
        {"input_uri": "quick.ipynb", "name": "spotbook-quick", "output_formats": ["ipynb"],
         "runtime_environment_name": "python3"},
    )["job_id"]  # fmt: skip
    wait_for(lambda: server.job(job_id)["status"] == "COMPLETED", 120, "the job to finish")
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.goto(f"http://127.0.0.1:{server.port}/lab?token={TOKEN}")
    page.wait_for_function(
        "window.jupyterapp && window.jupyterapp.commands.hasCommand("
        "'scheduling:list-jobs-from-launcher')",
        timeout=120_000,
    )
    page.evaluate("window.jupyterapp.commands.execute('scheduling:list-jobs-from-launcher')")
    row = page.locator("tr", has_text="spotbook-quick")
    row.wait_for(timeout=60_000)
    assert "Completed" in row.inner_text()
    page.screenshot(path=str(tmp_path / "jobs.png"))
    assert (tmp_path / "jobs.png").stat().st_size > 10_000


def test_a_job_with_a_cluster_compute_type_runs_as_a_kubernetes_job(
    tmp_path: Path, kube: Any
) -> None:
    """A compute choice maps to submit's options: the job is submitted to the (fake) API
    server, followed while its pod runs the notebook, and its outputs come back; a
    stopped job's Kubernetes Job is deleted."""
    from .test_cluster import pod, terminated, worker

    bucket = f"file://{tmp_path}/bucket"
    choice = {"image": "img:1", "run_dir": bucket, "gpu": "nvidia-l4", "memory": "8Gi"}
    with serving(tmp_path, env=kube.env, compute={"spot-l4": choice}) as server:
        (env,) = server.call("GET", "scheduler/runtime_environments")
        assert env["compute_types"] == ["local", "spot-l4"]
        write_notebook(server.root / "p.ipynb", "lr = 0.1", "print('lr', lr)", parameters=True)
        body = {
            "input_uri": "p.ipynb",
            "name": "on-spot",
            "runtime_environment_name": "spotbook",
            "output_formats": ["ipynb"],
            "compute_type": "spot-l4",
            "parameters": {"lr": "0.5"},
        }
        job_id = server.call("POST", "scheduler/jobs", body)["job_id"]
        rd = f"{bucket}/{job_id}"
        (kjob,) = wait_for(lambda: kube.objects("jobs"), 120, "the Kubernetes Job")
        run_id = RunStore(rd).require_run()["spec"]["run_id"]
        assert kjob["metadata"]["name"] == f"sb-{run_id}"
        limits = kjob["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1" and limits["memory"] == "8Gi"
        # the runner following the Job is killed: the next question resumes it, and it
        # follows the Job already there (never a second submit)
        (runner,) = _runners(server)
        runner.kill()
        wait_for(lambda: not _running(runner.pid), 60, "the runner to die")

        def resumed() -> list[Any]:
            server.job(job_id)  # the question that finds the runner gone
            return [p for p in _runners(server) if p.pid != runner.pid]

        wait_for(resumed, 60, "a new runner")
        assert len(kube.objects("jobs")) == 1
        # the pod: scheduled on a spot node, the worker runs the notebook from the store
        kube.put("pods", pod("p1", run_id, "Running", node="gke-spot-1"))
        kube.set_status("jobs", "default", f"sb-{run_id}", {"active": 1})
        w = worker(tmp_path, rd, "p1", "gke-spot-1", kube)
        _, err = w.communicate(timeout=180)
        assert w.returncode == 0, err
        kube.put("pods", pod("p1", run_id, "Succeeded", node="gke-spot-1",
                             containerStatuses=terminated(0)))  # fmt: skip
        done = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
        kube.set_status("jobs", "default", f"sb-{run_id}", done)
        wait_for(lambda: server.job(job_id)["status"] == "COMPLETED", 120, "the job to finish")
        staged = server.state / "staging" / job_id
        (out,) = [p for p in staged.iterdir() if p.suffix == ".ipynb" and p.name != "p.ipynb"]
        assert "lr 0.5" in out.read_text()

        # another, stopped while its pod waits for a node: its Kubernetes Job goes too
        body["name"] = "stopped"
        second = server.call("POST", "scheduler/jobs", body)["job_id"]
        wait_for(lambda: len(kube.objects("jobs")) == 2, 120, "the second Kubernetes Job")
        wait_for(lambda: server.job(second)["status"] == "IN_PROGRESS", 60, "its runner")
        server.call("PATCH", f"scheduler/jobs/{second}", {"status": "STOPPED"})
        wait_for(lambda: server.job(second)["status"] == "STOPPED", 60, "the job to stop")
        assert [j["metadata"]["name"] for j in kube.objects("jobs")] == [f"sb-{run_id}"]
        assert RunStore(f"{bucket}/{second}").exists("cancelled.json")


def _runners(server: Server) -> list[Any]:
    """The job runners the server spawned (multiprocessing's spawned children)."""
    import psutil

    found = []
    for p in psutil.Process(server.proc.pid).children():
        try:
            if "multiprocessing.spawn" in " ".join(p.cmdline()) and _running(p.pid):
                found.append(p)
        except psutil.Error:  # gone, or a zombie: no runner
            continue
    return found
