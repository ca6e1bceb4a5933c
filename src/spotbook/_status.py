"""Where a run stands, derived from its store alone (no process needs to be alive)."""

from __future__ import annotations

import os
import socket
from typing import Any

from . import _notebook as nbs
from ._models import Outcome, RunSpec, RunStatus
from ._store import LOCAL_RUNS, RunStore


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _attempt_outcomes(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Attempts with 'running' resolved: a later attempt or a dead local pid means killed."""
    out = []
    here = socket.gethostname()
    real = [a for a in attempts if a.get("outcome") != "restart"]
    for i, rec in enumerate(real):
        rec = dict(rec)
        if rec.get("outcome") == Outcome.RUNNING.value:
            later = i < len(real) - 1
            dead = rec.get("host") == here and rec.get("pid") and not _alive(int(rec["pid"]))
            if later or dead:
                rec["outcome"] = Outcome.KILLED.value
        out.append(rec)
    return out


def describe(store: RunStore) -> dict[str, Any]:
    """The status document behind ``spotbook status --json``."""
    run = store.require_run()
    spec = RunSpec.from_json(run["spec"])
    raw = store.read("input.ipynb")
    cells = nbs.load_frozen(raw).cells if raw else []
    executable = [i for i, c in enumerate(cells) if nbs.executable(c)]
    records = store.cell_records()
    done = [i for i in executable if records.get(i, {}).get("status") in ("completed", "exited")]
    failing = next((r for r in records.values() if r.get("status") == "failed"), None)
    attempts = _attempt_outcomes(store.attempts())
    status = RunStatus(run.get("status", RunStatus.PENDING.value))
    if status is RunStatus.RUNNING and attempts and attempts[-1]["outcome"] == "killed":
        status = RunStatus.INTERRUPTED
    cancelled = status is not RunStatus.SUCCEEDED and store.exists("cancelled.json")
    doc: dict[str, Any] = {
        "run_id": spec.run_id,
        "run_dir": store.url,
        "status": "cancelled" if cancelled else status.value,
        "message": run.get("message", ""),
        "source": spec.source,
        "output": spec.output,
        "parameters": spec.parameters,
        "kernel": spec.kernel_name,
        "cells_done": len(done),
        "cells_total": len(executable),
        "failing_cell": None,
        "attempts": [
            {
                k: a.get(k)
                for k in (
                    "attempt",
                    "host",
                    "pid",
                    "pod",
                    "namespace",
                    "node",
                    "image",
                    "gpus",
                    "frameworks",
                    "started",
                    "ended",
                    "outcome",
                    "resumed_from",
                    "stopped_at",
                    "restored_snapshot",
                    "replayed",
                    "unrestored",
                    "kernel_start_seconds",
                    "restore_seconds",
                    "redone_seconds",
                    "checkpoint_restored_bytes",
                    "checkpoint_uploaded_bytes",
                    "checkpoint_files",
                    "error",
                )
                if a.get(k) is not None
            }
            for a in attempts
        ],
        "preemptions": sum(1 for a in attempts if a.get("outcome") in ("preempted", "killed")),
    }
    if failing is not None:
        doc["failing_cell"] = {
            "index": failing["index"],
            "execution_count": failing.get("execution_count"),
            **(failing.get("error") or {}),
        }
    return doc


def local_runs(base: str = ".") -> list[dict[str, Any]]:
    """Status of every run under ``base/.spotbook/runs``, newest first."""
    root = os.path.join(base, LOCAL_RUNS)
    try:
        names = sorted(os.listdir(root), reverse=True)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        store = RunStore(os.path.join(root, name))
        if store.exists("run.json"):
            out.append(describe(store))
    return out
