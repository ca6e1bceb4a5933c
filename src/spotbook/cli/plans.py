"""gke/eks/aks plan|up|down: print or run the cluster setup commands."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from .._errors import UsageError

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
    from ..ops.plans import run_plan, steps_from

    todo = steps_from(steps, args.start)  # a bad --from fails before the question
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError("not a terminal to confirm on: review the plan, then pass --yes")
        answer = input(f"Run steps {todo[0][0]}-{todo[-1][0]} above? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("spotbook: nothing was run", file=sys.stderr)
            return 0
    run_plan(
        steps,
        start=args.start,
        again=lambda n: f"spotbook {args.command} {args.verb} ... --from {n}",
        say=lambda line: print(f"spotbook: {line}", file=sys.stderr, flush=True),
    )
    return 0
