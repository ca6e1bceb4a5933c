"""Where runs stand: status (store and cluster) and the runs table."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
import time
from typing import Any

from .._errors import SpotbookError
from .._models import AttemptRecord, NoticeCell
from ..ops.runs import (
    gc_runs,
    list_runs,
    open_run,
    remove_run,
    run_seconds,
    run_status,
    started_at,
)

log = logging.getLogger("spotbook")


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _cmd_status(args: argparse.Namespace) -> int:
    doc = run_status(args.run, context=args.context, namespace=args.namespace)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(f"run      {doc['run_id']}  ({doc['run_dir']})")
    print(f"status   {doc['status']}" + (f": {doc['message']}" if doc["message"] else ""))
    print(f"cells    {doc['cells_done']}/{doc['cells_total']} done")
    if doc["failing_cell"]:
        f = doc["failing_cell"]
        print(f"failed   cell {f['index']}: {f.get('ename')}: {f.get('evalue')}")
    cluster = doc.get("cluster")
    if cluster and "error" in cluster:
        print(f"cluster  unknown: {cluster['error']}")
    elif cluster:
        where = (
            f"Job {cluster.get('job')} in {cluster.get('namespace')}"
            if "job" in cluster
            else ("its Job is gone (finished and cleaned up, or cancelled)")
        )
        print(
            f"cluster  {cluster['state']}: {where}, {cluster.get('preemptions', 0)} preempted pods"
        )
        if cluster.get("reason"):
            why = cluster["reason"] + (f": {cluster['message']}" if cluster.get("message") else "")
            print(f"  {why}")
        from ..kube.jobs import describe_pod

        for v in cluster["pods"]:
            print(f"  {describe_pod(v)}")
    if doc.get("fallback"):
        fb = doc["fallback"]
        print(f"capacity on-demand since {_when(fb.get('at'))}: {fb.get('reason')}")
    print(f"attempts {len(doc['attempts'])}, preemptions {doc['preemptions']}")
    _print_downtime(doc["downtime"])
    for a in doc["attempts"]:
        extra = ""
        if a.get("replayed") is not None:
            # cells as papermill numbers them (from 1), as everywhere a person reads
            again = [int(i) + 1 for i in a["replayed"] if isinstance(i, int)]
            what = f"replayed cells {', '.join(map(str, again))}" if again else "no cell replayed"
            extra = f", restored in {a.get('restore_seconds', 0):.2f} s, {what}"
        place = f"pod {a['pod']}" if a.get("pod") else f"pid {a.get('pid')}"
        start = a.get("resumed_from")
        inside = a.get("resumed_in_cell") or {}
        within = ""
        if isinstance(inside.get("iteration"), int):
            of = f" of {inside['total']}" if isinstance(inside.get("total"), int) else ""
            within = f", iteration {inside['iteration'] + 1}{of}"
        print(
            f"  #{a.get('attempt')} {a.get('outcome') or '?':<10} {_when(a.get('started'))} → "
            f"{_when(a.get('ended'))}  from cell {int(start or 0) + 1}{within} "
            f"on {a.get('node') or a.get('host')} {place}{extra}"
        )
        for line in _attempt_details(a):
            print(f"      {line}")
    return 0


def _clock(ts: float | None) -> str:
    if not ts:
        return "?"
    return datetime.datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-4]


def _print_downtime(report: dict[str, Any]) -> None:
    """The downtime report: what each preemption cost and the run's totals."""
    for e in report["preemptions"]:
        sp = e["split"]
        stop = (
            _clock(e["stopped_at"])
            if e["stopped_at"]
            else "at an unknown time (killed without notice)"
        )
        print(
            f"preemption attempt {e['attempt']} → {e['next_attempt']} ({e['how']} on "
            f"{e['node']}): last progress {_clock(e['last_progress_at'])}, stopped {stop}, "
            + (
                f"next pod on a node {_clock(e['next_scheduled_at'])}, "
                if e.get("next_scheduled_at")
                else ""
            )
            + f"next started {_clock(e['next_started_at'])}, new cells from "
            f"{_clock(e['running_new_cells_at'])}"
        )
        print(
            f"  gap {e['gap_seconds']:.2f} s = {sp['until_stopped']:.2f} s until stopped + "
            f"{sp['scheduling_and_node']:.2f} s scheduling/node + "
            f"{sp['image_and_kernel_start']:.2f} s image/kernel start + "
            f"{sp['state_restore']:.2f} s state restore; redone {e['redone_seconds']:.2f} s"
        )
        inside = e.get("resumed_inside")
        if inside:
            of = f" of {inside['total']}" if inside.get("total") is not None else ""
            bound = e.get("lost_at_most_seconds")
            print(
                f"  went on inside cell {int(inside['cell']) + 1} at iteration "
                f"{int(inside['iteration']) + 1}{of}"
                + (
                    f"; a kill without notice lost at most {float(bound):.1f} s of it (the "
                    "checkpoint interval) and the iteration it was in"
                    if isinstance(bound, int | float) and e["stopped_at"] is None
                    else ""
                )
            )
    t = report["totals"]
    if t["preemptions"] or t["gpu_seconds"]:
        print(
            f"totals   {t['attempt_seconds']:.1f} s in attempts, {t['gpu_seconds']:.1f} "
            f"GPU-seconds, {t['wasted_seconds']:.1f} s wasted, {t['downtime_seconds']:.1f} s "
            f"down over {t['preemptions']} preemptions"
        )


_NOTICE_CELL: dict[str, str] = {
    NoticeCell.NONE: "no cell was running",
    NoticeCell.STOPPED: (
        "the running cell stopped early (at its loop's checkpoint, or on spotbook.preempted())"
    ),
    NoticeCell.FINISHED: "the running cell finished within --grace",
    NoticeCell.INTERRUPTED: (
        "the running cell outlived --grace and was interrupted; it runs again on resume"
    ),
}


def _attempt_details(a: AttemptRecord) -> list[str]:
    """Image, accelerators, the termination notice and checkpoint traffic of one
    attempt, when known."""
    out = []
    if a.get("image"):
        out.append(f"image {a['image']}")
    m = a.get("machine") or {}
    if m:
        where = " ".join(str(m[k]) for k in ("provider", "machine_type", "zone") if m.get(k))
        out.append(f"machine {where or 'unknown'} ({m.get('capacity', 'capacity unknown')})")
    gpus = a.get("gpus")
    if gpus:
        names = ", ".join(f"{g.get('name')} ({g.get('memory.total')} MiB)" for g in gpus)
        out.append(f"gpus {len(gpus)}: {names}")
    for name, info in sorted((a.get("frameworks") or {}).items()):
        seen = info.get("devices") or info.get("error") or "no GPU"
        out.append(f"{name} {info.get('version', '')} sees {seen}")
    notice = a.get("notice")
    if notice:
        cell = notice.get("cell", "")
        what = _NOTICE_CELL.get(cell, cell)
        out.append(
            f"{notice.get('signal')}: {what}; ended {notice.get('seconds_to_stop', 0):.2f} s "
            "after the notice"
        )
    if a.get("snapshots_off"):
        out.append(f"snapshots off: {a['snapshots_off']}; a resume replays instead")
    if a.get("loop_checkpoints"):
        out.append(f"checkpoints inside cells: {a['loop_checkpoints']}")
    for key, why in sorted((a.get("loops_not_resumable") or {}).items()):
        cell, _, loop = str(key).partition(":")
        if cell.isdigit() and loop.isdigit():
            out.append(f"loop {int(loop) + 1} of cell {int(cell) + 1} is not a resume point: {why}")
    if a.get("checkpoint_uploaded_bytes") or a.get("checkpoint_restored_bytes"):
        out.append(
            f"checkpoint files: {a.get('checkpoint_restored_bytes', 0)} bytes restored, "
            f"{a.get('checkpoint_uploaded_bytes', 0)} bytes saved"
        )
    if a.get("fidelity"):
        from ..attempt.fidelity import summary_lines

        out.extend(f"resume: {line}" for line in summary_lines(a["fidelity"]))
    return out


def _cmd_runs(args: argparse.Namespace) -> int:
    if args.cluster:
        return _cluster_runs(args)
    since = None
    if args.since is not None:
        from ..kube.manifest import parse_duration

        since = time.time() - parse_duration(args.since, "--since")
    listing = list_runs(status=args.status, since=since)
    for error in listing.errors:
        log.warning("cannot read %s", error)
    if args.json:
        print(json.dumps(listing.runs, indent=2, sort_keys=True))
        return 0
    if not listing.runs:
        which = " matching" if args.status or args.since else ""
        print(
            f"no{which} runs (in this folder's .spotbook/runs, nor any run this user started on "
            "this machine; start one with `spotbook run NOTEBOOK`)"
        )
        return 0
    print(
        f"{'RUN':<24} {'NAME':<16} {'STATUS':<12} {'CELLS':>7} {'STARTED':<19} {'TOOK':>8} "
        f"{'TRIES':>5} {'PREEMPT':>7}  {'PARAMETERS':<24}  STORE"
    )
    for r in listing.runs:
        cells = f"{r['cells_done']}/{r['cells_total']}"
        took = run_seconds(r)
        params = " ".join(f"{k}={v!r}" for k, v in r["parameters"].items())
        params = params if len(params) <= 24 else params[:23] + "…"
        print(
            f"{r['run_id']:<24} {r.get('name', '-'):<16} {r['status']:<12} {cells:>7} "
            f"{_when(started_at(r)):<19} "
            f"{_took(took):>8} {len(r['attempts']):>5} {r['preemptions']:>7}  "
            f"{params or '-':<24}  {r['run_dir']}"
        )
    return 0


def _cmd_runs_rm(args: argparse.Namespace) -> int:
    failed = 0
    for run in args.runs:
        try:
            gone = remove_run(open_run(run))
        except SpotbookError as exc:
            print(f"spotbook: error: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"spotbook: removed run {gone.run_id} ({gone.url})", file=sys.stderr)
    return 2 if failed else 0


def _cmd_runs_gc(args: argparse.Namespace) -> int:
    from ..kube.manifest import parse_duration

    older = None if args.older_than is None else parse_duration(args.older_than, "--older-than")
    gone, skipped = gc_runs(keep=args.keep, older_than=older, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for r in gone:
        print(f"spotbook: {verb} run {r.run_id} ({r.url})", file=sys.stderr)
    for why in skipped:
        print(f"spotbook: kept {why}", file=sys.stderr)
    print(f"spotbook: {verb} {len(gone)} run(s)", file=sys.stderr)
    return 0


def _took(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _cluster_runs(args: argparse.Namespace) -> int:
    from ..ops.runs import cluster_jobs

    found = cluster_jobs(args.context, args.namespace, all_namespaces=args.all_namespaces)
    if args.json:
        print(json.dumps([j.to_json() for j in found.jobs], indent=2, sort_keys=True))
        return 0
    if not found.jobs:
        where = "any namespace" if found.all_namespaces else f"namespace {found.namespace!r}"
        print(f"no spotbook Jobs in {where} (context {found.context})")
        return 0
    print(f"{'RUN':<24} {'NAMESPACE':<12} {'STATE':<10} {'FAILED PODS':>11}  RUN DIR")
    for j in found.jobs:
        print(f"{j.run:<24} {j.namespace:<12} {j.state:<10} {j.failed_pods:>11}  {j.run_dir}")
    return 0
