"""gke/eks/aks plan|up|down: print or run the cluster setup commands."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from .._errors import (
    StorageError,
    UsageError,
)

log = logging.getLogger("spotbook")


def _cmd_cluster_plan(args: argparse.Namespace) -> int:
    from ..kube import plans as plans
    from ..kube.manifest import parse_gpu

    gpu, count = parse_gpu(args.gpu)
    zones = getattr(args, "node_locations", None) or ""
    opts = plans.PlanOptions(
        cluster=args.cluster,
        location=args.location or "",
        project=getattr(args, "project", None) or "",
        gpu=gpu or "",
        gpu_count=count or 1,
        node_locations=tuple(z.strip() for z in zones.split(",") if z.strip()),
        registry=args.registry or "",
        machine_type=args.machine_type,
        system_machine_type=args.system_machine_type,
        max_nodes=args.max_nodes,
        bucket=args.bucket or "",
        namespace=args.namespace,
        service_account=args.service_account,
    )
    provider = args.command
    if args.verb == "down":
        steps = plans.gke_down(opts, delete_bucket=args.delete_bucket)
    else:
        steps = {"gke": plans.gke_plan, "eks": plans.eks_plan, "aks": plans.aks_plan}[provider](
            opts
        )
    hint = None if args.verb == "down" else plans.submit_hint(opts, provider)
    image = [] if args.verb == "down" else plans.image_hint(opts, provider)
    if args.output_format == "json":
        print(plans.to_json(steps))
    else:
        print(plans.render(steps, hint, checks=provider == "gke", image=image), end="")
    if args.verb == "plan":
        return 0
    return _run_plan(steps, args)


def _run_plan(steps: list[Any], args: argparse.Namespace) -> int:
    import subprocess

    from ..kube import plans as plans

    todo = list(enumerate(steps, 1))[args.start - 1 :]
    if not todo:
        raise UsageError(f"--from {args.start}: the plan has {len(steps)} steps")
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError("not a terminal to confirm on: review the plan, then pass --yes")
        answer = input(f"Run steps {todo[0][0]}-{todo[-1][0]} above? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("spotbook: nothing was run", file=sys.stderr)
            return 0
    for n, step in todo:
        print(f"spotbook: step {n}/{len(steps)}: {step.what}", file=sys.stderr, flush=True)
        if step.done_if and _succeeds(step.done_if):
            print(
                f"spotbook: step {n}: already done (`{shlex.join(step.done_if)}` found it); "
                "skipped",
                file=sys.stderr,
                flush=True,
            )
            continue
        # a "$(...)" argument is a lookup the shell does, as in the printed plan
        lookup = any("$(" in a for a in step.argv)
        argv = ["bash", "-c", plans.shell_join(step.argv)] if lookup else list(step.argv)
        try:
            proc = subprocess.run(argv, input=step.stdin, text=True, check=False)
            code = proc.returncode
        except FileNotFoundError:
            code = 127
        if code != 0:
            raise _PlanStepError(
                f"step {n} failed (exit {code}): {shlex.join(step.argv)}; fix the cause and "
                f"continue with `spotbook {args.command} {args.verb} ... --from {n}`"
                + (f" (steps 1-{n - 1} are done)" if n > 1 else "")
            )
    print(f"spotbook: all {len(steps)} steps done", file=sys.stderr)
    return 0


def _succeeds(argv: Sequence[str]) -> bool:
    """Whether a read-only check command exits 0 (its output is not shown)."""
    import subprocess

    try:
        done = subprocess.run(list(argv), capture_output=True, check=False, timeout=120)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


class _PlanStepError(StorageError):
    """A cloud command of the plan failed (exit 3: fix and continue)."""
