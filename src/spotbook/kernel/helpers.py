"""Helpers for the notebook itself, used inside a kernel that spotbook runs."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from typing import Any


def preempted() -> bool:
    """True once the runner has received a termination notice (SIGTERM).

    A long training loop polls this, saves its state into :func:`checkpoint_dir`
    and returns (or raises). A cell that saw True is not recorded as finished: the
    runner saves the checkpoint directory, exits with code 75, and the resumed run
    executes the cell again, which then picks up from its checkpoint files.
    Outside spotbook it is always False.
    """
    path = os.environ.get("SPOTBOOK_NOTICE_FILE")
    if not path or not os.path.exists(path):
        return False
    with contextlib.suppress(OSError), open(path + ".seen", "w"):
        pass  # tells the runner this cell stopped because of the notice
    return True


def checkpoint_dir() -> str:
    """A directory for the notebook's own checkpoints during this run.

    It holds what the run's earlier attempts saved there. On an object-store run it
    is a local directory that the runner syncs to the store every
    ``--checkpoint-interval`` seconds and after a termination notice. Replace files
    atomically (write a temporary name, then ``os.replace``) so a sync never sees
    half a file. Outside spotbook, a fresh temporary directory.
    """
    path = os.environ.get("SPOTBOOK_CHECKPOINT_DIR")
    if not path:
        path = os.environ.setdefault("SPOTBOOK_CHECKPOINT_DIR", tempfile.mkdtemp(prefix="ckpt-"))
    os.makedirs(path, exist_ok=True)
    return path


# the output type of a recorded result, in the cell's outputs (as scrapbook's glue
# keeps a scrap): committed with the cell, in the output notebook, read by `sweep results`
RECORD_MIME = "application/vnd.spotbook.record+json"
# scrapbook's output type of a JSON scrap (its schema, version 1): a record carries one
# too, so `scrapbook.read_notebook(OUTPUT).scraps` finds what spotbook.record kept; and
# `sweep results` gathers scrapbook's glue of JSON values and text (and papermill's
# older record) as records; scraps of other encoders (pandas, arrow) hold no plain value
SCRAP_PREFIX = "application/scrapbook.scrap."
SCRAP_JSON_MIME = SCRAP_PREFIX + "json+json"
PAPERMILL_RECORD_MIME = "application/papermill.record+json"


def record(name: str, value: Any) -> None:
    """Keep a result of the run under ``name`` (``value`` must be JSON-serialisable).

    It becomes an output of the running cell, so it is saved with the cell in the run
    store and shown in the output notebook; ``spotbook sweep results`` gathers each
    point's records into one table. Recording a name again replaces its value (a cell
    run again on resume records again). Outside a kernel it only checks the value.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("spotbook.record: the name must be a non-empty string")
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"spotbook.record({name!r}, ...): the value must be JSON-serialisable "
            f"(numbers, strings, lists, dicts; convert arrays with .tolist(), numpy scalars "
            f"with float()): {exc}"
        ) from exc
    display = sys.modules.get("IPython.core.display_functions") or sys.modules.get(
        "IPython.core.display"
    )
    publish = getattr(display, "publish_display_data", None)
    # a kernel's shell, if this process has one: publishing without one would make one
    # (and IPython's virtualenv warning with it) in a process that only imported IPython
    shells = sys.modules.get("IPython.core.interactiveshell")
    shell = getattr(shells, "InteractiveShell", None)
    if publish is None or shell is None or not shell.initialized():
        return
    value = json.loads(text)
    data: dict[str, Any] = {RECORD_MIME: {"name": name, "value": value}}
    metadata: dict[str, Any] = {RECORD_MIME: {"name": name}}
    if value is not None:  # a scrap's data may not be null (scrapbook's schema)
        data[SCRAP_JSON_MIME] = {"name": name, "data": value, "encoder": "json", "version": 1}
        metadata["scrapbook"] = {"name": name, "data": True, "display": False}
    publish(data=data, metadata=metadata)


def recorded(output: Any) -> tuple[str, Any] | None:
    """(name, value) of a record in one cell output: spotbook's, a JSON scrap of
    scrapbook's glue, or papermill's older ``pm.record``; None for any other output."""
    data = output.get("data") if isinstance(output, dict) else None
    if not isinstance(data, dict):
        return None
    ours = data.get(RECORD_MIME)
    if isinstance(ours, dict) and isinstance(ours.get("name"), str):
        return ours["name"], ours.get("value")
    for kind in ("json", "text"):  # the encoders whose data is the value itself
        scrap = data.get(f"{SCRAP_PREFIX}{kind}+json")
        if isinstance(scrap, dict) and isinstance(scrap.get("name"), str) and "data" in scrap:
            return scrap["name"], scrap["data"]
    old = data.get(PAPERMILL_RECORD_MIME)
    if isinstance(old, dict) and len(old) == 1:
        ((name, value),) = old.items()
        if isinstance(name, str):
            return name, value
    return None
