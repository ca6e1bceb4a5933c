"""Submit a notebook as a Kubernetes Job and follow it (``spotbook submit [--wait]``).

The notebook is frozen with its parameters into a run store in a bucket, sealed with
the run key kept in a Kubernetes Secret (the pod checks the store with it), and the Job
(``kube.manifest.build_job``) runs ``spotbook worker`` on that store.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import UsageError
from .._models import Limits, SnapshotPolicy
from ..kube.jobs import JOB_RECORD
from ..kube.manifest import DEFAULT_KEY_SECRET, JobOptions, build_job, secret_looking
from ..store.runstore import RunStore, is_url
from .fallback import FallbackPolicy, fall_back, options_to_json
from .runs import cluster_for

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
    notebook: str | bytes,
    job: JobOptions,
    *,
    parameters: Mapping[str, Any] | None = None,
    kernel_name: str | None = None,
    language: str | None = None,
) -> dict[str, Any]:
    """The Job ``submit_notebook`` would create (``--dry-run``), after checking that the
    notebook takes the parameters; nothing is written, nothing sent."""
    from ..notebook import document as nbs
    from ..store.runstore import new_run_id, read_url

    check_locations(job.run_dir, None)
    data, name = (
        (notebook, "stdin") if isinstance(notebook, bytes) else (read_url(notebook), notebook)
    )
    nb = nbs.parse(data, repr(name))
    nbs.inject_parameters(nb, dict(parameters or {}), kernel_name, language)
    return build_job(dataclasses.replace(job, run_id=new_run_id()))


def for_cluster(
    cluster: Cluster, job: JobOptions, limits: Limits, notebook: Any
) -> tuple[JobOptions, Key]:
    """The Job's options for this cluster (its namespace, the run's grace, the source),
    checked before anything is written; and the run key from the cluster's Secret, which
    the pod checks the store with, so the run is sealed with it."""
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
) -> Submitted:
    """Freeze ``notebook`` into the run store ``job.run_dir`` (a bucket URL) and create
    its Job in ``namespace`` (default: the context's). ``job`` says what the pod gets
    (image, GPU, spot, resources, secrets); its ``run_id``, ``namespace``, ``grace`` and
    ``source`` are filled in here. The cluster is asked before anything is written, so
    a bad context or namespace leaves no run behind."""
    from .._api import prepare_run

    check_locations(job.run_dir, output)
    limits = limits or Limits()
    with cluster_for(context, namespace) as cluster:
        job, key = for_cluster(cluster, job, limits, notebook)
        store = prepare_run(
            notebook,
            output,
            parameters=parameters,
            report_mode=report_mode,
            language=language,
            kernel_name=kernel_name,
            limits=limits,
            snapshot=snapshot,
            run_dir=job.run_dir,
            restart=restart,
            strict_resume=strict_resume,
            allow_errors=allow_errors,
            key=key,
            here=False,
        )
        run_id = store.require_run()["spec"]["run_id"]
        job = dataclasses.replace(job, run_id=run_id)
        manifest = build_job(job)
        name = manifest["metadata"]["name"]
        store.write_json(JOB_RECORD, job_record(cluster, job, name, fallback))
        cluster.create_job(manifest)
    return Submitted(
        run_id=run_id,
        url=store.url,
        job=name,
        namespace=cluster.namespace,
        context=cluster.context_name,
        manifest=manifest,
    )


def job_record(
    cluster: Cluster, job: JobOptions, name: str, fallback: FallbackPolicy | None
) -> dict[str, Any]:
    """What the run store keeps about its Job: where it is, what it asked for (to make
    it again on on-demand nodes), and the fallback policy."""
    return {
        "context": cluster.context_name,
        "server": cluster.server,
        "namespace": cluster.namespace,
        "job": name,
        "provider": job.provider,
        "image": job.image,
        "gpu_count": job.gpu_count,
        "points": job.points,
        "submitted": time.time(),
        "options": options_to_json(job),
        "fallback_policy": dataclasses.asdict(fallback or FallbackPolicy()),
    }


def wait_for_job(
    submitted: Submitted,
    *,
    say: Callable[[str], None] | None = None,
    cluster: Cluster | None = None,
) -> int:
    """Follow the Job until it ends, saying what happens (pods scheduled, preempted,
    replaced); returns the run's exit code as ``spotbook run`` would have it."""
    from .._status import describe
    from ..kube.jobs import follow, job_view

    tell = say or log.info
    client = cluster or cluster_for(submitted.context, submitted.namespace)
    run_id = submitted.run_id
    store = RunStore(submitted.url)
    record = store.read_json(JOB_RECORD) or {}
    policy = FallbackPolicy(**(record.get("fallback_policy") or {}))
    done = bool(record.get("fallback"))

    def view() -> dict[str, Any]:
        nonlocal done
        current = job_view(client.get_job(run_id), client.pods(run_id), client.node_ready)
        why = None if done or not policy.active else policy.reason(current, time.time())
        if why is not None and current.get("state") not in ("succeeded", "failed", "gone"):
            done = True
            tell(f"falling back to on-demand nodes: {why}")
            name = fall_back(client, store, why)
            tell(f"Job {name} recreated on on-demand nodes; the run resumes there")
            current = job_view(client.get_job(run_id), client.pods(run_id), client.node_ready)
        return current

    try:
        code = follow(view, lambda: client.watch_job(run_id), tell)
    finally:
        if cluster is None:
            client.close()
    if store.exists("run.json"):
        doc = describe(store)
        tell(f"run {run_id} {doc['status']}: {doc['cells_done']}/{doc['cells_total']} cells")
    else:  # a sweep
        from .sweep import sweep_status

        counts = sweep_status(submitted.url).counts()
        tell(f"sweep {run_id}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return int(code)
