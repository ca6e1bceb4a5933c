"""Commands for submitted runs: submit, logs, cancel, recover."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from .._errors import (
    RunNotFoundError,
    UsageError,
)
from .._status import ClusterView, describe
from ..kube.jobs import CANCELLED, JOB_RECORD
from ..kube.manifest import ANNOTATION_RUN_DIR
from ..store.runstore import RunStore, is_url, resolve_run
from .run import _limits, _parameters, _prepare

if TYPE_CHECKING:
    from ..kube.cluster import Cluster

log = logging.getLogger("spotbook")


def _cluster_for(args: argparse.Namespace, record: dict[str, Any] | None = None) -> Cluster:
    from ..kube.cluster import Cluster

    record = record or {}
    return Cluster(
        context=args.context or record.get("context"),
        namespace=args.namespace or record.get("namespace") or "",
    )


def _open_run(args: argparse.Namespace) -> RunStore:
    """The run store of RUN: a URL, a local run, or (by id) a Job on the cluster."""
    store = RunStore(resolve_run(args.run))
    if store.exists("run.json") or is_url(args.run) or os.sep in args.run:
        return store
    try:
        cluster = _cluster_for(args)
    except UsageError:
        return store  # no cluster configured: report the local lookup's failure
    job = cluster.get_job(args.run)
    url = ((job or {}).get("metadata", {}).get("annotations") or {}).get(ANNOTATION_RUN_DIR)
    if not url:
        raise RunNotFoundError(
            f"no run {args.run!r} under ./.spotbook/runs nor as a Job in namespace "
            f"{cluster.namespace!r}; give the run store URL, or --namespace/--context"
        )
    return RunStore(url)


def _job_record(store: RunStore) -> dict[str, Any]:
    record = store.read_json(JOB_RECORD)
    if record is None:
        raise UsageError(
            f"the run in {store.url} was not submitted to a cluster; its notebook is in "
            f"{store.url}/output.ipynb (`spotbook status {store.url}`)"
        )
    assert isinstance(record, dict)
    return record


def _cmd_submit(args: argparse.Namespace) -> int:
    from ..kube.manifest import (
        DEFAULT_KEY_SECRET,
        DEFAULT_MAX_PREEMPTIONS,
        JobOptions,
        build_job,
        parse_duration,
        parse_env,
        parse_gpu,
        parse_secret_env,
        secret_looking,
    )
    from ..store.integrity import load_key

    if not args.run_dir or not is_url(args.run_dir):
        raise UsageError(
            "spotbook submit needs --run-dir URL in a bucket the pods can reach "
            "(gs://BUCKET/runs/NAME, s3://..., az://...): a pod cannot see this machine's disk"
        )
    if args.output and not is_url(args.output):
        raise UsageError(
            f"OUTPUT {args.output!r} is a local path, which the pod cannot write; give a "
            "bucket URL, or leave it out and download RUN_DIR/output.ipynb"
        )
    if args.cwd:
        raise UsageError("--cwd is a path on this machine; it has no meaning in the pod")
    if args.prepare_only:
        raise UsageError("--prepare-only does not apply to submit; use --dry-run to see the Job")
    if args.stdout_file or args.stderr_file:
        raise UsageError(
            "--stdout-file/--stderr-file are files on this machine; a submitted run's output "
            "is in its pod's log (`spotbook logs -f RUN`)"
        )
    gpu_type, gpu_count = parse_gpu(args.gpu)
    if args.max_preemptions is None:
        args.max_preemptions = DEFAULT_MAX_PREEMPTIONS
    job_kwargs: dict[str, Any] = {
        "run_dir": args.run_dir.rstrip("/"),
        "image": args.image,
        "provider": args.provider,
        "spot": args.spot,
        "gpu_type": gpu_type,
        "gpu_count": gpu_count,
        "cpu": args.cpu,
        "memory": args.memory,
        "service_account": args.service_account,
        "env": parse_env(args.env),
        "secret_env": parse_secret_env(args.secret_env),
        "env_from_secrets": tuple(args.env_from_secret),
        "key_secret": args.key_secret or DEFAULT_KEY_SECRET,
        "queue": args.queue,
        "ttl_seconds": parse_duration(args.ttl, "--ttl"),
        "deadline_seconds": parse_duration(args.deadline, "--deadline") if args.deadline else None,
        "backoff_limit": args.backoff_limit,
        "grace": _limits(args).grace,
        "source": args.input,
    }
    if args.backoff_limit < 0:
        raise UsageError("--backoff-limit must be zero or more")
    for name in secret_looking([n for n, _ in job_kwargs["env"]]):
        print(
            f"spotbook: warning: --env {name}=... puts its value in the Job spec in plain "
            "text (anyone who can read Jobs, and the cluster's audit log, sees it); keep it "
            "in a Kubernetes Secret and pass --secret-env "
            f"{name}=SECRET:KEY or --env-from-secret SECRET",
            file=sys.stderr,
        )
    if not args.memory:
        print(
            "spotbook: warning: no --memory: a notebook that runs out of its node's memory "
            "is evicted, which counts as a preemption, and runs again on a fresh node (up "
            f"to --max-preemptions, {args.max_preemptions} times); give --memory, e.g. 16Gi",
            file=sys.stderr,
        )
    if args.dry_run:
        from ..notebook import document as nbs
        from ..store.runstore import new_run_id, read_url

        nbs.inject_parameters(
            nbs.parse(read_url(args.input), repr(args.input)),
            _parameters(args),
            args.kernel,
            args.language,
        )
        _limits(args)
        manifest = build_job(
            JobOptions(run_id=new_run_id(), namespace=args.namespace or "default", **job_kwargs)
        )
        _print_manifest(manifest, args.output_format)
        return 0
    cluster = _cluster_for(args)  # before anything is written: fail early on bad config
    JobOptions(run_id="check", namespace=cluster.namespace, **job_kwargs)  # validate early
    # The pod checks the store with the key in the Secret: seal the run with that key.
    key = cluster.run_key(job_kwargs["key_secret"], load_key())
    store = _prepare(args, key, here=False)
    run_id = store.require_run()["spec"]["run_id"]
    manifest = build_job(JobOptions(run_id=run_id, namespace=cluster.namespace, **job_kwargs))
    name = manifest["metadata"]["name"]
    store.write_json(
        JOB_RECORD,
        {
            "context": cluster.context_name,
            "server": cluster.server,
            "namespace": cluster.namespace,
            "job": name,
            "provider": args.provider,
            "image": args.image,
            "gpu_count": gpu_count,
            "submitted": time.time(),
        },
    )
    cluster.create_job(manifest)
    print(
        f"spotbook: submitted run {run_id} as Job {name} in namespace {cluster.namespace} "
        f"(context {cluster.context_name}); store {store.url}\n"
        f"  spotbook status {store.url}\n  spotbook logs -f {store.url}\n"
        f"  spotbook cancel {store.url}",
        file=sys.stderr,
    )
    if not args.wait:
        return 0
    return _follow(cluster, store, run_id)


def _print_manifest(manifest: dict[str, Any], fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(manifest, indent=2))
    else:
        import yaml

        class _NoAliases(yaml.SafeDumper):
            # a reviewer reads each value where it applies, not an anchor (&id001)
            def ignore_aliases(self, data: Any) -> bool:
                return True

        print(yaml.dump(manifest, Dumper=_NoAliases, sort_keys=False), end="")


def _follow(cluster: Cluster, store: RunStore, run_id: str) -> int:
    from ..kube.jobs import follow, job_view

    def say(line: str) -> None:
        print(f"spotbook: {line}", file=sys.stderr, flush=True)

    code = follow(
        lambda: job_view(cluster.get_job(run_id), cluster.pods(run_id), cluster.node_ready),
        lambda: cluster.watch_job(run_id),
        say,
    )
    doc = describe(store)
    say(f"run {run_id} {doc['status']}: {doc['cells_done']}/{doc['cells_total']} cells")
    return int(code)


def _cluster_view(args: argparse.Namespace, cluster: Cluster | None = None) -> ClusterView:
    """``describe``'s window on the cluster: the Job and its pods, or the error that
    kept them from view; through ``cluster`` when the caller holds one."""
    from ..kube.cluster import ClusterError
    from ..kube.jobs import job_view

    def view(run_id: str, record: dict[str, Any]) -> dict[str, Any]:
        try:
            client = cluster or _cluster_for(args, record)
            return job_view(client.get_job(run_id), client.pods(run_id), client.node_ready)
        except (ClusterError, UsageError) as exc:
            return {"error": str(exc)}

    return view


def _cmd_logs(args: argparse.Namespace) -> int:
    store = _open_run(args)
    run_id = store.require_run()["spec"]["run_id"]
    cluster = _cluster_for(args, _job_record(store))
    pods = cluster.pods(run_id)
    if args.follow:
        deadline = time.monotonic() + 600
        told = False
        while (not pods or pods[-1].get("status", {}).get("phase") == "Pending") and (
            time.monotonic() < deadline
        ):
            if not told:
                print("spotbook: waiting for the run's pod to start", file=sys.stderr)
                told = True
            time.sleep(2.0)
            pods = cluster.pods(run_id)
    if not pods:
        print(
            f"spotbook: run {run_id} has no pods (not started yet, or removed after the Job "
            f"finished); its notebook is in {store.url}/output.ipynb",
            file=sys.stderr,
        )
        return 0
    targets = pods if args.all else pods[-1:]
    for pod in targets:
        name = pod["metadata"]["name"]
        if args.all:
            print(f"==> pod {name} <==", flush=True)
        for line in cluster.logs(name, follow=args.follow and pod is pods[-1]):
            sys.stdout.write(line if line.endswith("\n") else line + "\n")
            sys.stdout.flush()
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    from ..kube.cluster import ClusterError

    store = _open_run(args)
    run_id = store.require_run()["spec"]["run_id"]
    cluster = _cluster_for(args, _job_record(store))
    if cluster.get_job(run_id) is None:
        raise ClusterError(
            f"run {run_id} has no Job in namespace {cluster.namespace!r}: it has finished and "
            "been cleaned up, or was cancelled already"
        )
    store.write_json(CANCELLED, {"at": time.time(), "by": os.environ.get("USER", "")})
    cluster.delete_job(run_id)
    print(
        f"spotbook: cancelled run {run_id}: deleted its Job; the pod saves progress on its "
        f"way out, and {store.url} keeps everything done so far",
        file=sys.stderr,
    )
    return 0


def _cmd_recover(args: argparse.Namespace) -> int:
    from ..kube.jobs import describe_pod, pod_view

    store = _open_run(args)
    run_id = store.require_run()["spec"]["run_id"]
    cluster = _cluster_for(args, _job_record(store))
    views = [pod_view(p, cluster.node_ready) for p in cluster.pods(run_id)]
    # stuck on a node that is not Ready, or past its grace on one this account may not read
    stuck = [v for v in views if v.get("past_grace")]
    if not stuck:
        states = "; ".join(describe_pod(v) for v in views) or "no pods"
        print(f"spotbook: run {run_id} has no stuck pod ({states}); nothing done", file=sys.stderr)
        return 0
    for v in stuck:
        # The old attempt cannot write once a new one claims the run (the store's fence),
        # so forgetting a pod whose node died is safe even if that node comes back.
        cluster.force_delete_pod(v["name"])
        print(
            f"spotbook: deleted pod {v['name']} (Terminating past its grace on {v['node']}) "
            "with grace 0; the Job starts a replacement, which resumes the run",
            file=sys.stderr,
        )
    return 0
