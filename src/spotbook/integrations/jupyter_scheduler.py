"""spotbook as jupyter-scheduler's backend: a job made with JupyterLab's "Create a
notebook job" (or jupyter-scheduler's REST API) runs under spotbook — every cell's
progress in a run store, kernel-state snapshots — and a job whose runner was killed (the
Jupyter server restarted, the process killed, the machine rebooted) continues after its
last finished cell, with its variables, the next time the scheduler is asked about it.
The scheduler's own UI and API keep working: the job list and its status, stopping and
deleting a job, downloading its outputs.

    jupyter lab --SchedulerApp.scheduler_class=SCHEDULER

with SCHEDULER ``spotbook.integrations.jupyter_scheduler.SpotbookScheduler``.

A job's run store is beside its staging folder (``STAGING/.spotbook-runs/JOB_ID``), not in
it: the staging folder's files are what the job gives back. ``spotbook status``,
``spotbook report`` and ``spotbook runs`` take it as any run.

Imported only by a Jupyter server configured to use it: it imports jupyter-scheduler.
"""

from __future__ import annotations

import ast
import contextlib
import multiprocessing as mp
import os
from typing import Any

import psutil
from jupyter_scheduler.executors import DefaultExecutionManager
from jupyter_scheduler.models import DescribeJob, ListJobsQuery, Status
from jupyter_scheduler.orm import Job
from jupyter_scheduler.scheduler import Scheduler
from traitlets import Type as TType


def run_store_of(staging_input: str) -> str:
    """The run store of the job whose staged notebook is ``staging_input``."""
    folder = os.path.dirname(os.path.abspath(staging_input))
    return os.path.join(os.path.dirname(folder), ".spotbook-runs", os.path.basename(folder))


def typed(value: str) -> Any:
    """A parameter as jupyter-scheduler's form gives it (Python source: ``0.1``,
    ``'text'``, ``[1, 2]``) as its value; anything else is taken as text."""
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


class SpotbookExecutionManager(DefaultExecutionManager):
    """Runs one job's notebook through spotbook in the process the scheduler started
    for it; run again on the same job, it continues the job's unfinished run."""

    def execute(self) -> None:
        import nbformat

        from .._api import execute_notebook
        from .._errors import CellExecutionError
        from ..store.runstore import RunStore

        job = self.model
        staged = self.staging_paths["input"]
        run_dir = run_store_of(staged)
        failed: CellExecutionError | None = None
        try:
            execute_notebook(
                staged,
                None,  # the outputs are written from the run's notebook below
                parameters={k: typed(v) for k, v in (job.parameters or {}).items()},
                cwd=os.path.dirname(staged),
                run_dir=run_dir,
                progress_bar=False,
            )
        except CellExecutionError as exc:  # the outputs still show the failed cell
            failed = exc
        data = RunStore(run_dir).read("output.ipynb")
        if data is not None:
            self.add_side_effects_files(os.path.dirname(staged))
            self.create_output_files(job, nbformat.reads(data, as_version=4))
        if failed is not None:
            raise failed


class SpotbookScheduler(Scheduler):
    """jupyter-scheduler's local scheduler, running jobs with
    :class:`SpotbookExecutionManager`, and continuing a job whose runner is gone."""

    execution_manager_class = TType(
        klass="jupyter_scheduler.executors.ExecutionManager",
        default_value="spotbook.integrations.jupyter_scheduler.SpotbookExecutionManager",
        config=True,
        help="The execution manager class to use.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resume_interrupted()  # what a restarted server finds

    def resume_interrupted(self) -> list[str]:
        """Start the runner again for every job in progress whose runner process is gone;
        the ids of those jobs. A stopped job stays stopped."""
        resumed = []
        with self.db_session() as session:
            for job in session.query(Job).filter(Job.status == Status.IN_PROGRESS).all():
                if _alive(job.pid):
                    continue
                staging = self.get_staging_paths(DescribeJob.from_orm(job))
                # spawned, as jupyter-scheduler starts its runners (not forked)
                process = mp.get_context("spawn").Process(
                    target=self.execution_manager_class(
                        job_id=job.job_id,
                        staging_paths=staging,
                        root_dir=self.root_dir,
                        db_url=self.db_url,
                    ).process
                )
                process.start()
                job.pid = process.pid
                session.commit()
                self.log.info("spotbook: job %s's runner was gone; resuming it", job.job_id)
                resumed.append(job.job_id)
        return resumed

    def get_job(self, job_id: str, job_files: bool | None = True) -> DescribeJob:
        self.resume_interrupted()
        return super().get_job(job_id, job_files)

    def list_jobs(self, query: ListJobsQuery) -> Any:
        self.resume_interrupted()
        return super().list_jobs(query)


def _alive(pid: int | None) -> bool:
    """Whether the runner process ``pid`` still runs (a killed child of this server that
    nobody has waited for is a zombie: gone, and reaped here)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() != psutil.STATUS_ZOMBIE:
            return True
    except psutil.NoSuchProcess:
        return False
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return False
