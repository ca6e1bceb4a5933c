"""Commands for submitted runs: submit, logs, cancel, recover."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from .._errors import UsageError
from ..kube.manifest import JobOptions
from ..ops.fallback import FallbackPolicy
from ..ops.runs import cancel_run, recover_run, stream_logs
from .run import _check_engine, _limits, run_request

log = logging.getLogger("spotbook")


def job_options(args: argparse.Namespace) -> JobOptions:
    """The Job's options from submit's flags (the run id is filled in by the call)."""
    from ..kube.manifest import (
        DEFAULT_KEY_SECRET,
        DEFAULT_MAX_PREEMPTIONS,
        JobOptions,
        parse_duration,
        parse_env,
        parse_gpu,
        parse_secret_env,
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
    if args.backoff_limit < 0:
        raise UsageError("--backoff-limit must be zero or more")
    gpu_type, gpu_count = parse_gpu(args.gpu)
    names: set[str] = set()  # the variables --env and --secret-env give the pod
    if args.max_preemptions is None:
        args.max_preemptions = DEFAULT_MAX_PREEMPTIONS
    return JobOptions(
        namespace=args.namespace or "default",
        run_dir=(args.run_dir or "").rstrip("/"),
        image=args.image,
        provider=args.provider,
        spot=args.spot,
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        cpu=args.cpu,
        memory=args.memory,
        work_storage=getattr(args, "work_storage", None) or "20Gi",
        service_account=args.service_account,
        env=parse_env(args.env, names),
        secret_env=parse_secret_env(args.secret_env, names),
        env_from_secrets=tuple(args.env_from_secret),
        key_secret=args.key_secret or DEFAULT_KEY_SECRET,
        queue=args.queue,
        ttl_seconds=parse_duration(args.ttl, "--ttl"),
        deadline_seconds=parse_duration(args.deadline, "--deadline") if args.deadline else None,
        backoff_limit=args.backoff_limit,
        grace=_limits(args).grace,
        source=args.input,
    )


def fallback_policy(args: argparse.Namespace) -> FallbackPolicy:
    """The capacity fallback the ``--fallback-after-*`` flags ask for."""
    from ..kube.manifest import parse_duration

    pending = args.fallback_after_pending
    policy = FallbackPolicy(
        after_preemptions=args.fallback_after_preemptions,
        after_pending=None
        if pending is None
        else float(parse_duration(pending, "--fallback-after-pending")),
    )
    if policy.active and not args.spot:
        raise UsageError(
            "--fallback-after-* moves a spot run to on-demand nodes; this run is --on-demand"
        )
    return policy


def _cmd_wait(args: argparse.Namespace) -> int:
    from ..ops.runs import wait_run

    return wait_run(
        args.run,
        context=args.context,
        namespace=args.namespace,
        say=lambda line: print(f"spotbook: {line}", file=sys.stderr, flush=True),
    )


def _cmd_submit(args: argparse.Namespace) -> int:
    from ..ops.runs import wait_for_job
    from ..ops.submit import check_locations, submit

    check_locations(args.run_dir, args.output)  # before the other flags: the first need
    job = job_options(args)
    _check_engine(args)
    submitted = submit(
        run_request(args),
        job,
        context=args.context,
        namespace=args.namespace,
        fallback=fallback_policy(args),
        dry_run=args.dry_run,
        warn=_warn,
    )
    if args.dry_run:
        _print_manifest(submitted.manifest, args.output_format)
        return 0
    url = submitted.url
    print(
        f"spotbook: submitted run {submitted.run_id} as Job {submitted.job} in namespace "
        f"{submitted.namespace} (context {submitted.context}); store {url}\n"
        f"  spotbook status {url}\n  spotbook logs -f {url}\n"
        f"  spotbook cancel {url}",
        file=sys.stderr,
    )
    if not args.wait:
        return 0
    return wait_for_job(
        submitted, say=lambda line: print(f"spotbook: {line}", file=sys.stderr, flush=True)
    )


def _warn(line: str) -> None:
    print(f"spotbook: warning: {line}", file=sys.stderr)


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


def _cmd_logs(args: argparse.Namespace) -> int:
    for event in stream_logs(
        args.run,
        context=args.context,
        namespace=args.namespace,
        follow=args.follow,
        all_pods=args.all,
    ):
        if event.kind == "line":
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif event.kind == "pod":
            print(f"==> pod {event.text} <==", flush=True)
        elif event.kind == "waiting":
            print("spotbook: waiting for the run's pod to start", file=sys.stderr)
        else:
            print(f"spotbook: {event.text}", file=sys.stderr)
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    done = cancel_run(args.run, context=args.context, namespace=args.namespace)
    if done.job is not None:
        print(
            f"spotbook: cancelled run {done.run_id}: deleted its Job; the pod saves progress "
            f"on its way out, and {done.url} keeps everything done so far",
            file=sys.stderr,
        )
        return 0
    print(
        f"spotbook: stopped run {done.run_id} (pid {done.pid}) as Ctrl-C would: "
        f"{done.cells_done} of {done.cells_total} cells saved; `spotbook resume "
        f"{done.url}` continues it",
        file=sys.stderr,
    )
    return 0


def _cmd_recover(args: argparse.Namespace) -> int:
    found = recover_run(args.run, context=args.context, namespace=args.namespace)
    if not found.deleted:
        states = "; ".join(found.others) or "no pods"
        print(
            f"spotbook: run {found.run_id} has no stuck pod ({states}); nothing done",
            file=sys.stderr,
        )
        return 0
    for v in found.deleted:
        print(
            f"spotbook: deleted pod {v['name']} (Terminating past its grace on {v['node']}) "
            "with grace 0; the Job starts a replacement, which resumes the run",
            file=sys.stderr,
        )
    return 0
