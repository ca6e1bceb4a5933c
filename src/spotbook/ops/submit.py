"""Submit a notebook as a Kubernetes Job and follow it (``spotbook submit [--wait]``).

The notebook is frozen with its parameters into a run store in a bucket, sealed with
the run key kept in a Kubernetes Secret (the pod checks the store with it), and the Job
(``kube.manifest.build_job``) runs ``spotbook worker`` on that store.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import UsageError
from .._models import Limits, RunRequest, SnapshotPolicy
from ..kube.manifest import (
    DEFAULT_KEY_SECRET,
    DEFAULT_MAX_PREEMPTIONS,
    JobOptions,
    build_job,
    secret_looking,
)
from ..store.runstore import is_url
from .fallback import FallbackPolicy
from .jobs import cluster_for, new_job_record

if TYPE_CHECKING:
    from ..kube.cluster import Cluster
    from ..store.integrity import Key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submitted:
    """A run created on the cluster: its store, and the Job that runs it."""

    run_id: str
    url: str  # the run store
    job: str  # the Job's name
    namespace: str
    context: str
    manifest: dict[str, Any]


def submit_warnings(job: JobOptions, max_preemptions: int | None) -> list[str]:
    """What a reviewer of this Job should hear before it runs: secrets in plain ``env``,
    no memory request."""
    out = [
        f"--env {name}=... puts its value in the Job spec in plain text (anyone who can "
        "read Jobs, and the cluster's audit log, sees it); keep it in a Kubernetes Secret "
        f"and pass --secret-env {name}=SECRET:KEY or --env-from-secret SECRET"
        for name in secret_looking([n for n, _ in job.env])
    ]
    if not job.memory:
        out.append(
            "no --memory: a notebook that runs out of its node's memory is evicted, which "
            "counts as a preemption, and runs again on a fresh node (up to --max-preemptions, "
            f"{max_preemptions} times); give --memory, e.g. 16Gi"
        )
    return out


def check_locations(run_dir: str | None, output: str | None) -> None:
    """The run store and OUTPUT must be URLs the pod can reach."""
    if not run_dir or not is_url(run_dir):
        raise UsageError(
            "spotbook submit needs --run-dir URL in a bucket the pods can reach "
            "(gs://BUCKET/runs/NAME, s3://..., az://...): a pod cannot see this machine's disk"
        )
    if output and not is_url(output):
        raise UsageError(
            f"OUTPUT {output!r} is a local path, which the pod cannot write; give a "
            "bucket URL, or leave it out and download RUN_DIR/output.ipynb"
        )


def job_manifest(
    notebook: str | bytes | Mapping[str, Any],
    job: JobOptions,
    *,
    parameters: Mapping[str, Any] | None = None,
    kernel_name: str | None = None,
    language: str | None = None,
) -> dict[str, Any]:
    """The Job ``submit_notebook`` would create (``--dry-run``), after checking that the
    notebook takes the parameters; nothing is written, nothing sent."""
    if isinstance(notebook, bytes):
        try:
            notebook = json.loads(notebook)
        except ValueError as exc:
            raise UsageError(f"the notebook given is not JSON ({exc})") from None
    return submit_notebook(
        notebook,
        job,
        parameters=parameters,
        kernel_name=kernel_name,
        language=language,
        dry_run=True,
    ).manifest


def check_submit(request: RunRequest, job: JobOptions, warn: Callable[[str], None] | None) -> None:
    """What a submit must refuse before the cluster is asked, and what it warns of."""
    check_locations(job.run_dir, None if request.output is None else str(request.output))
    limit = request.limits.max_preemptions
    for warning in submit_warnings(job, DEFAULT_MAX_PREEMPTIONS if limit is None else limit):
        (warn or log.warning)(warning)


def would_submit(request: RunRequest, job: JobOptions) -> Submitted:
    """The Job a submit would create, as kubectl's ``--dry-run=client`` shows one: the
    notebook is read and takes its parameters; nothing is written, nothing sent (no
    cluster is asked, so ``context`` is empty)."""
    from .._api import parameterized_notebook
    from ..store.runstore import new_run_id

    parameterized_notebook(request)
    job = dataclasses.replace(job, run_id=new_run_id())
    manifest = build_job(job)
    return Submitted(
        run_id=job.run_id,
        url=job.run_dir,
        job=manifest["metadata"]["name"],
        namespace=job.namespace,
        context="",
        manifest=manifest,
    )


def for_cluster(
    cluster: Cluster, job: JobOptions, limits: Limits, notebook: Any
) -> tuple[JobOptions, Key]:
    """The Job's options for this cluster (its namespace, the run's grace, the source),
    checked before anything is written (by the API server too, in a dry run); and the
    run key from the cluster's Secret, which the pod checks the store with, so the run
    is sealed with it."""
    from ..store.integrity import load_key

    job = dataclasses.replace(
        job,
        run_id="check",
        namespace=cluster.namespace,
        grace=limits.grace,
        source=notebook if isinstance(notebook, str) else "-",
        key_secret=job.key_secret or DEFAULT_KEY_SECRET,
    )
    assert job.key_secret is not None
    # the API server's own validation and admission (quotas, policies, webhooks) on the
    # Job as it will be, under a provisional name: nothing is written, here or there,
    # for a Job the server would refuse
    from ..store.runstore import new_run_id

    cluster.create_job(build_job(dataclasses.replace(job, run_id=new_run_id())), dry_run=True)
    return job, cluster.run_key(job.key_secret, load_key())


def submit_notebook(
    notebook: Any,
    job: JobOptions,
    *,
    output: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    kernel_name: str | None = None,
    language: str | None = None,
    report_mode: bool = False,
    limits: Limits | None = None,
    snapshot: SnapshotPolicy | None = None,
    restart: bool = False,
    strict_resume: bool = False,
    allow_errors: bool = False,
    context: str | None = None,
    namespace: str | None = None,
    fallback: FallbackPolicy | None = None,
    dry_run: bool = False,
) -> Submitted:
    """``submit`` of a ``RunRequest`` made of these arguments (``job.run_dir`` is the
    run store)."""
    request = RunRequest(
        notebook,
        output,
        parameters=dict(parameters or {}),
        kernel_name=kernel_name,
        language=language,
        report_mode=report_mode,
        limits=limits or Limits(),
        snapshot=snapshot or SnapshotPolicy(),
        restart=restart,
        strict_resume=strict_resume,
        allow_errors=allow_errors,
    )
    return submit(
        request, job, context=context, namespace=namespace, fallback=fallback, dry_run=dry_run
    )


def submit(
    request: RunRequest,
    job: JobOptions,
    *,
    context: str | None = None,
    namespace: str | None = None,
    fallback: FallbackPolicy | None = None,
    dry_run: bool = False,
    warn: Callable[[str], None] | None = None,
) -> Submitted:
    """Freeze ``request``'s notebook into the run store ``job.run_dir`` (a bucket URL) and
    create its Job in ``namespace`` (default: the context's). ``job`` says what the pod
    gets (image, GPU, spot, resources, secrets); its ``run_id``, ``namespace``, ``grace``
    and ``source`` are filled in here. The cluster is asked before anything is written,
    so a bad context or namespace leaves no run behind. ``warn`` hears what a reviewer
    of the Job should (default: logged); ``dry_run``: only the Job it would create
    (``Submitted.manifest``), nothing written or sent."""
    from .._api import prepare

    check_submit(request, job, warn)
    if dry_run:
        return would_submit(request, job)
    with cluster_for(context, namespace) as cluster:
        job, key = for_cluster(cluster, job, request.limits, request.notebook)
        request = dataclasses.replace(request, run_dir=job.run_dir)
        store = prepare(request, key=key, here=False)
        run_id = store.require_run()["spec"]["run_id"]
        job = dataclasses.replace(job, run_id=run_id)
        manifest = build_job(job)
        name = manifest["metadata"]["name"]
        store.write_job_record(new_job_record(cluster, job, name, fallback))
        cluster.create_job(manifest)
    return Submitted(
        run_id=run_id,
        url=store.url,
        job=name,
        namespace=cluster.namespace,
        context=cluster.context_name,
        manifest=manifest,
    )
