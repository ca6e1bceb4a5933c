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

Compute choices (``SpotbookScheduler.compute``, shown in the job form with
``SpotbookEnvironmentManager``) submit a job as a Kubernetes Job on spot GPUs instead:
each maps to ``spotbook submit``'s options (``image``, ``run_dir``: the bucket under which
each job's run goes, ``gpu``, ``spot``, ``cpu``, ``memory``, ``namespace``, ``context``,
``provider``, ``service_account``). The runner follows the Job (and is resumed, without
submitting again, if it is killed); stopping the job deletes the Kubernetes Job.

Imported only by a Jupyter server configured to use it: it imports jupyter-scheduler.
"""

from __future__ import annotations

import ast
import contextlib
import json
import multiprocessing as mp
import os
from typing import Any

import psutil
from jupyter_scheduler.environments import EnvironmentManager
from jupyter_scheduler.executors import DefaultExecutionManager
from jupyter_scheduler.models import DescribeJob, ListJobsQuery, RuntimeEnvironment, Status
from jupyter_scheduler.orm import Job
from jupyter_scheduler.scheduler import Scheduler
from traitlets import Dict as TDict
from traitlets import Type as TType

# the compute choices, from the scheduler (in the server) to the runners it spawns
ENV_COMPUTE = "SPOTBOOK_SCHEDULER_COMPUTE"
LOCAL = "local"
_OPTIONS = frozenset(
    {"image", "run_dir", "gpu", "spot", "cpu", "memory", "namespace", "context", "provider",
     "service_account"}
)  # fmt: skip


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
        parameters = {k: typed(v) for k, v in (job.parameters or {}).items()}
        failed: Exception | None = None
        if job.compute_type and job.compute_type != LOCAL:
            run_dir = cluster_run_dir(job.compute_type, job.job_id)
            failed = self._on_cluster(job.compute_type, staged, run_dir, parameters)
        else:
            run_dir = run_store_of(staged)
            try:
                execute_notebook(
                    staged,
                    None,  # the outputs are written from the run's notebook below
                    parameters=parameters,
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

    def _on_cluster(
        self, choice: str, staged: str, run_dir: str, parameters: dict[str, Any]
    ) -> Exception | None:
        """Submit the job as a Kubernetes Job (once: a runner started again follows the
        Job already there) and follow it to its end; the error to mark the job with."""
        from ..kube.manifest import JobOptions, parse_gpu
        from ..ops.runs import wait_for_job
        from ..ops.submit import Submitted, submit_notebook
        from ..store.runstore import RunStore

        o = compute_choices()[choice]
        store = RunStore(run_dir)
        record = store.job_record() if store.exists("job.json") else None
        if record is None:
            gpu_type, gpu_count = parse_gpu(o.get("gpu"))
            submitted = submit_notebook(
                staged,
                JobOptions(
                    run_dir=run_dir,
                    image=str(o["image"]),
                    spot=bool(o.get("spot", True)),
                    gpu_type=gpu_type,
                    gpu_count=gpu_count,
                    cpu=o.get("cpu"),
                    memory=o.get("memory"),
                    provider=str(o.get("provider", "gke")),
                    service_account=o.get("service_account"),
                ),
                parameters=parameters,
                context=o.get("context"),
                namespace=o.get("namespace"),
            )
        else:
            submitted = Submitted(
                run_id=store.require_run()["spec"]["run_id"],
                url=store.url,
                job=str(record.get("job") or ""),
                namespace=str(record.get("namespace") or ""),
                context=str(record.get("context") or ""),
                manifest={},
            )
        code = wait_for_job(submitted)
        if code:
            return RuntimeError(
                f"the run on the cluster ended with exit {code}; see `spotbook status {run_dir}`"
            )
        return None


class SpotbookScheduler(Scheduler):
    """jupyter-scheduler's local scheduler, running jobs with
    :class:`SpotbookExecutionManager`, and continuing a job whose runner is gone."""

    execution_manager_class = TType(
        klass="jupyter_scheduler.executors.ExecutionManager",
        default_value="spotbook.integrations.jupyter_scheduler.SpotbookExecutionManager",
        config=True,
        help="The execution manager class to use.",
    )

    compute = TDict(
        config=True,
        help="Compute choices that submit a job as a Kubernetes Job: name -> spotbook "
        "submit's options (image, run_dir, gpu, spot, cpu, memory, namespace, context, "
        "provider, service_account). 'local' runs on this server.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, options in self.compute.items():
            unknown = set(options) - _OPTIONS
            if name == LOCAL or unknown or "image" not in options or "run_dir" not in options:
                raise ValueError(
                    f"SpotbookScheduler.compute[{name!r}]: give image and run_dir, and only "
                    f"{', '.join(sorted(_OPTIONS))} ({LOCAL!r} is the server itself)"
                )
        os.environ[ENV_COMPUTE] = json.dumps(self.compute)  # for the runners it spawns
        self.resume_interrupted()  # what a restarted server finds

    def stop_job(self, job_id: str) -> None:
        """Stop the runner, as jupyter-scheduler does; a job on the cluster also has its
        Kubernetes Job deleted (its progress is kept in its run store)."""
        from ..ops.runs import cancel_run

        job = self.get_job(job_id, False)
        super().stop_job(job_id)
        if job.compute_type and job.compute_type != LOCAL and job.status == Status.IN_PROGRESS:
            cancel_run(cluster_run_dir(job.compute_type, job_id))

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


def compute_choices() -> dict[str, dict[str, Any]]:
    """The compute choices the scheduler was configured with (in its runners too)."""
    found: dict[str, dict[str, Any]] = json.loads(os.environ.get(ENV_COMPUTE) or "{}")
    return found


def cluster_run_dir(choice: str, job_id: str) -> str:
    """The run store of a job submitted with compute choice ``choice``."""
    options = compute_choices().get(choice)
    if options is None:
        raise ValueError(
            f"compute type {choice!r} is not one of this server's "
            f"({', '.join([LOCAL, *compute_choices()])}); see SpotbookScheduler.compute"
        )
    return f"{str(options['run_dir']).rstrip('/')}/{job_id}"


class SpotbookEnvironmentManager(EnvironmentManager):
    """One environment, this server's Python, whose compute types are ``local`` and the
    scheduler's compute choices: the job form's "Compute type" list."""

    def list_environments(self) -> list[RuntimeEnvironment]:
        return [
            RuntimeEnvironment(
                name="spotbook",
                label="spotbook",
                description="this server's Python, run by spotbook (resumable)",
                file_extensions=["ipynb"],
                output_formats=["ipynb", "html"],
                metadata={},
                compute_types=[LOCAL, *compute_choices()],
                default_compute_type=LOCAL,
                utc_only=False,
            )
        ]

    def manage_environments_command(self) -> str:
        return ""

    def output_formats_mapping(self) -> dict[str, str]:
        return {"ipynb": "Notebook", "html": "HTML"}
