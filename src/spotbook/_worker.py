"""``spotbook worker``: the command a container image runs.

Configured by environment variables (the Job sets them) or arguments:

``SPOTBOOK_RUN_DIR``
    The run store that ``spotbook submit`` froze the notebook into. Every start of
    the container is one attempt: it runs the run, or resumes it after the last
    committed cell, and exits with the codes of DESIGN.md.

``BUCKET_NAME``, ``DOWNLOAD_FILE_PATH``, ``UPLOAD_FILE_PATH``
    The classic recipe's variables: fetch the notebook at that path of the bucket,
    run it, upload the executed notebook to that path. ``BUCKET_NAME`` is a bucket
    name (``gs://`` unless ``SPOTBOOK_STORAGE_SCHEME`` says ``s3``/``az``) or a URL.
    The run store is ``SPOTBOOK_RUN_DIR`` if set, else
    ``<bucket>/.spotbook/runs/<SPOTBOOK_RUN_ID or a name derived from the paths>``,
    so a restarted pod finds the same run and resumes it. A different notebook at
    the download path starts the run over.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from ._api import OnStart, prepare_run, run_attempt
from ._errors import InputChangedError, UsageError
from .attempt.context import RunnerOptions
from .attempt.runner import RunResult
from .store.runstore import CANCELLED, LEGACY_ENV, RunStore

log = logging.getLogger(__name__)

CLASSIC_VARS = ("BUCKET_NAME", "DOWNLOAD_FILE_PATH", "UPLOAD_FILE_PATH")


@dataclass(frozen=True)
class WorkerTarget:
    run_dir: str
    input_url: str | None = None  # classic mode: the notebook in the bucket
    output_url: str | None = None
    # the run the pod's Job was submitted for (SPOTBOOK_RUN_ID): the store must hold it
    run_id: str | None = None


def resolve_target(run_dir: str | None, env: Mapping[str, str]) -> WorkerTarget:
    """Where the worker's run is, from its arguments and environment."""
    run_dir = run_dir or env.get("SPOTBOOK_RUN_DIR") or None
    bucket = env.get("BUCKET_NAME")
    download = env.get("DOWNLOAD_FILE_PATH")
    if not bucket and not download:
        if not run_dir:
            raise UsageError(
                "spotbook worker needs SPOTBOOK_RUN_DIR (or --run-dir): the run store "
                "`spotbook submit` created; or BUCKET_NAME and DOWNLOAD_FILE_PATH (and "
                "UPLOAD_FILE_PATH) to run a notebook from a bucket"
            )
        if env.get("SPOTBOOK_SWEEP_POINTS"):
            index = env.get("JOB_COMPLETION_INDEX", "")
            if not index.isdigit():
                raise UsageError(
                    "a sweep's worker runs point $JOB_COMPLETION_INDEX, which is not set: "
                    "it is set in the pods of an Indexed Job (`spotbook sweep --submit`)"
                )
            return WorkerTarget(run_dir=f"{run_dir.rstrip('/')}/points/{int(index)}")
        return WorkerTarget(run_dir=run_dir, run_id=env.get("SPOTBOOK_RUN_ID") or None)
    if not bucket or not download:
        missing = "BUCKET_NAME" if not bucket else "DOWNLOAD_FILE_PATH"
        raise UsageError(f"{missing} is not set; the classic variables need both")
    if "://" in bucket:
        base = bucket.rstrip("/")
    else:
        scheme = env.get("SPOTBOOK_STORAGE_SCHEME", "gs")
        base = f"{scheme}://{bucket.strip('/')}"
    input_url = f"{base}/{download.lstrip('/')}"
    upload = env.get("UPLOAD_FILE_PATH")
    output_url = f"{base}/{upload.lstrip('/')}" if upload else None
    if not run_dir:
        run_id = env.get("SPOTBOOK_RUN_ID") or (
            "job-" + hashlib.sha256(f"{input_url}\0{output_url}".encode()).hexdigest()[:12]
        )
        run_dir = f"{base}/.spotbook/runs/{run_id}"
    return WorkerTarget(run_dir=run_dir, input_url=input_url, output_url=output_url)


def open_target(target: WorkerTarget) -> tuple[RunStore, dict[str, Any] | None]:
    """The run store to run, created from the bucket's notebook in classic mode; with
    run.json as read to check it is the run the pod is for (None: prepared here)."""
    if target.input_url is None:
        store = RunStore(target.run_dir)
        return store, store.require_run_of(target.run_id)
    try:
        return prepare_run(target.input_url, target.output_url, run_dir=target.run_dir), None
    except InputChangedError:
        log.info("a different notebook is at %s: starting its run over", target.input_url)
        store = prepare_run(
            target.input_url, target.output_url, run_dir=target.run_dir, restart=True
        )
        return store, None


def run_worker(
    run_dir: str | None,
    env: MutableMapping[str, str],
    options: RunnerOptions | None = None,
    *,
    on_start: OnStart | None = None,
) -> RunResult:
    """``spotbook worker``: one attempt at the run its arguments and environment name
    (see the module's docstring), in the process's environment ``env`` (a pod's)."""
    if env.get("KUBERNETES_SERVICE_HOST") and not (
        env.get("SPOTBOOK_SNAPSHOT_KEY") or env.get("SPOTBOOK_SNAPSHOT_KEY_FILE")
    ):
        # a key made in this pod's home would die with the pod: the next pod could not
        # check the store, and every preemption would end the run
        raise UsageError(
            "spotbook worker in a pod needs the run key from a Kubernetes Secret: create "
            "one (`kubectl create secret generic spotbook-run-key --from-literal=key=$(openssl "
            "rand -hex 32)`), mount it and set SPOTBOOK_SNAPSHOT_KEY_FILE to the file "
            "(`spotbook submit` does this itself; see docs/kubernetes.md)"
        )
    if env.pop(LEGACY_ENV, None) is not None:
        # it may reach a pod through envFrom: a worker resumes only what is sealed
        log.warning("%s is ignored by spotbook worker: it resumes sealed stores only", LEGACY_ENV)
    for var in ("HOME", "TMPDIR"):
        # in the pod these lie in the working directory's emptyDir, new on every node
        where = env.get(var)
        if where and not os.path.isdir(where):
            os.makedirs(where, mode=0o700, exist_ok=True)
    store, run = open_target(resolve_target(run_dir, env))
    if store.exists(CANCELLED):
        raise UsageError(f"run in {store.url} was cancelled (`spotbook cancel`); not starting it")
    return run_attempt(store, options, run, on_start=on_start)
