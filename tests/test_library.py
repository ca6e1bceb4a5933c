"""What the commands do, called from Python: typed results, the same answers as the CLI
(status with the cluster's view, submit, cancel, drill, running a plan)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

import spotbook
from spotbook._models import STATUS_ATTEMPT_FIELDS, AttemptRecord
from spotbook._status import describe
from spotbook.kube.manifest import JobOptions
from spotbook.kube.plans import Step
from spotbook.store.runstore import RunStore

from .conftest import cells_committed, cli, kill, start_cli, wait_for
from .servers import FakeKube

pytestmark = pytest.mark.slow


def test_submit_status_and_cancel_from_python(
    work: Path, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(work)
    for name, value in kube.env.items():
        monkeypatch.setenv(name, value)
    job = JobOptions(
        run_id="", run_dir=f"file://{work}/runs/lib", image="img:1", gpu_type="nvidia-l4",
        gpu_count=1, queue="team-a",
    )  # fmt: skip
    with pytest.raises(spotbook.UsageError, match="--run-dir URL"):
        spotbook.submit_notebook("sleepy.ipynb", JobOptions(run_id="", run_dir="rd", image="i"))
    dry = spotbook.job_manifest("sleepy.ipynb", job, parameters={"n": 3})
    assert dry["kind"] == "Job" and not (work / "runs").exists() and not kube.objects("jobs")
    # the same call as a submit, dry: the Job it would create, and what a reviewer should
    # hear (this job asks for no memory); nothing written, nothing sent, no cluster asked
    heard: list[str] = []
    asked = len(kube.state()["dry_runs"])
    request = spotbook.RunRequest("sleepy.ipynb", None, parameters={"n": 3})
    seen = spotbook.submit(request, job, dry_run=True, warn=heard.append)
    assert seen.manifest["kind"] == "Job" and seen.job == seen.manifest["metadata"]["name"]
    assert (seen.url, seen.context) == (job.run_dir, "") and len(heard) == 1, heard
    assert "--memory" in heard[0] and not (work / "runs").exists()
    assert not kube.objects("jobs") and len(kube.state()["dry_runs"]) == asked
    with pytest.raises(spotbook.SpotbookError, match=r"absent\.ipynb"):
        spotbook.submit(spotbook.RunRequest("absent.ipynb", None), job, dry_run=True)

    done = spotbook.submit_notebook("sleepy.ipynb", job, parameters={"n": 3})
    (created,) = kube.objects("jobs")
    assert created["metadata"]["name"] == done.job == done.manifest["metadata"]["name"]
    assert (done.namespace, done.context) == ("default", "fake")
    assert created["spec"]["template"] == done.manifest["spec"]["template"]
    assert RunStore(done.url).require_run()["spec"]["parameters"] == {"n": 3}

    # the store alone says pending; with the cluster's view the run is queued (Kueue),
    # from Python as from the command line, and by run id as by URL
    assert describe(RunStore(done.url))["status"] == "pending"
    report = spotbook.run_status(done.url)
    assert report["status"] == "queued" and report["cluster"]["state"] == "queued"
    shown = json.loads(cli("status", done.url, "--json", cwd=work, env=kube.env).stdout)
    assert {k: v for k, v in shown.items() if k != "cluster"} == {
        k: v for k, v in report.items() if k != "cluster"
    }
    assert spotbook.run_status(done.run_id)["run_dir"] == done.url

    cancelled = spotbook.cancel_run(done.run_id)
    assert (cancelled.run_id, cancelled.url) == (done.run_id, done.url)
    assert not kube.objects("jobs")
    assert spotbook.run_status(done.url)["status"] == spotbook.RunStatus.CANCELLED
    with pytest.raises(spotbook.SpotbookError, match="no Job"):
        spotbook.cancel_run(done.url)


def test_drill_from_python_reports_the_preemption_it_caused(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(work)
    rd = work / "rd"
    runner = start_cli("run", "sleepy.ipynb", "out.ipynb", "--run-dir", "rd", cwd=work)
    wait_for(lambda: cells_committed(rd) >= 3, what="3 cells")
    said: list[str] = []
    report = spotbook.drill("rd", say=said.append)
    code, err = kill(runner, signal.SIGKILL)  # already gone: collect its exit status
    assert code == 75, err
    assert report.how == "sigterm" and report.disrupted and not report.killed
    assert report.target == f"pid {runner.pid}" and report.stopped_in is not None
    assert report.resumed is not None and report.resumed.status is spotbook.RunStatus.SUCCEEDED
    assert report.resumed.notebook.endswith("out.ipynb")
    assert report.status == "succeeded"
    assert any("sent SIGTERM" in line for line in said)
    event = report.event
    assert event is not None and (event["attempt"], event["next_attempt"]) == (1, 2)
    assert event["how"] == spotbook.Outcome.PREEMPTED
    (measured,) = spotbook.run_status("rd")["downtime"]["preemptions"]
    assert measured == {k: v for k, v in event.items() if k != "sigterm_to_exit_seconds"}

    # every field a real attempt wrote is declared in the typed record, and status
    # shows only declared fields
    declared = set(AttemptRecord.__annotations__)
    assert set(STATUS_ATTEMPT_FIELDS) <= declared
    store = RunStore(str(rd))
    for rec in store.attempts():
        assert set(rec) - {"mac"} <= declared, set(rec) - declared  # mac: the store's seal
    for rec in store.cell_records().values():
        assert rec["status"] in set(spotbook.CellStatus)


def test_run_plan_runs_checks_skips_and_stops_at_a_failure(tmp_path: Path) -> None:
    def touch(name: str) -> tuple[str, ...]:
        return ("touch", str(tmp_path / name))

    steps = [
        Step("one", touch("1")),
        Step("two", touch("2"), done_if=("test", "-e", str(tmp_path / "1"))),
        Step("three", ("sh", "-c", "exit 4")),
        Step("four", touch("4")),
    ]
    with pytest.raises(spotbook.CommandFailedError, match=r"step 3 failed \(exit 4\)") as e:
        spotbook.run_plan(steps, again=lambda n: f"do it again --from {n}")
    assert "do it again --from 3" in str(e.value) and "steps 1-2 are done" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]  # two was found done
    done = spotbook.run_plan(steps, start=4)
    assert done == spotbook.PlanRun(total=4, ran=(4,), skipped=())
    assert (tmp_path / "4").exists()
    assert spotbook.run_plan(steps[:2]) == spotbook.PlanRun(total=2, ran=(1,), skipped=(2,))
    with pytest.raises(spotbook.UsageError, match="--from 5: the plan has 4 steps"):
        spotbook.run_plan(steps, start=5)


def test_trust_from_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `spotbook trust` as the call it makes (the legacy store it is for, trusted and
    # resumed, is tests/test_tamper.py's): a sealed store has nothing to trust, and taking
    # back a trust never given changes nothing
    from .conftest import write_notebook

    monkeypatch.chdir(tmp_path)
    write_notebook(tmp_path / "nb.ipynb", "x = 1")
    spotbook.prepare_run("nb.ipynb", run_dir="sealed")
    with pytest.raises(spotbook.UsageError, match="nothing to trust"):
        spotbook.trust_run("sealed")
    done = spotbook.trust_run("sealed", remove=True)
    assert (done.url, done.trusted, done.changed, done.entry) == (
        RunStore(str(tmp_path / "sealed")).url,
        False,
        False,
        None,
    )
