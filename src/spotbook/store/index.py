"""The user's index of runs: where each run store this user made on this machine lives.

``run``, ``sweep``, ``submit`` and the library's calls create run stores anywhere: under
``./.spotbook/runs`` of whichever folder the command ran in, in a ``--run-dir`` on disk or
in a bucket, in the user's cache. Each new run adds one small entry here (its id and its
store's URL), so ``spotbook runs`` lists them all and a run id works from any folder.

The index holds no state of a run: each entry only says where to look, and what is found
there is checked as every store is (its seal). It lives in the user's data directory
(``$SPOTBOOK_DATA_DIR``, else ``$XDG_DATA_HOME/spotbook``, else
``~/.local/share/spotbook``), one file per run, written atomically; an entry that cannot
be read (not a plain file, too large, not an entry) is skipped, never trusted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
import time
from typing import Any

log = logging.getLogger(__name__)

DATA_ENV = "SPOTBOOK_DATA_DIR"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MAX_ENTRY = 64 << 10


def valid_name(name: str) -> bool:
    """Whether ``name`` may name a run (``run --name``): it is a folder's name too."""
    return bool(_NAME.fullmatch(name)) and len(name) <= 64 and name not in (".", "..")


def index_dir() -> str:
    """The folder of the index's entries."""
    base = os.environ.get(DATA_ENV) or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "spotbook"
    )
    return os.path.join(base, "runs")


def note_run(url: str, run_id: str) -> None:
    """Add (or refresh) the entry of run ``run_id`` whose store is ``url``. Best effort:
    a run never fails because the index cannot be written (it is said at debug level)."""
    if not _NAME.fullmatch(run_id):
        return
    folder = index_dir()
    path = os.path.join(folder, f"{run_id}.json")
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"run_id": run_id, "url": url, "noted": time.time()}, fh)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("could not note run %s in %s: %s", run_id, folder, exc)
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def forget_run(run_id: str) -> None:
    """Drop the run from the index of runs (its store is not touched)."""
    if _NAME.fullmatch(run_id):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(index_dir(), f"{run_id}.json"))


def indexed_runs() -> list[dict[str, Any]]:
    """Every readable entry (``run_id``, ``url``, ``noted``), the newest run first."""
    folder = index_dir()
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        if not name.endswith(".json") or not _NAME.fullmatch(name[: -len(".json")]):
            continue
        entry = _read_entry(os.path.join(folder, name))
        if entry is not None and entry["run_id"] == name[: -len(".json")]:
            out.append(entry)
    return sorted(out, key=lambda e: (e["run_id"], e["noted"]), reverse=True)


def find_indexed(run: str) -> str | None:
    """The store URL of the run whose id, or else whose name (the store's folder name,
    as ``run --name`` gives it), is ``run``, as the index has it; the newest of the
    same name; None if no entry matches."""
    if not _NAME.fullmatch(run):
        return None
    entry = _read_entry(os.path.join(index_dir(), f"{run}.json"))
    if entry is not None:
        return str(entry["url"])
    for entry in indexed_runs():
        if name_of(str(entry["url"]), str(entry["run_id"])) == run:
            return str(entry["url"])
    return None


def name_of(url: str, run_id: str) -> str | None:
    """A run's name: its store's folder name where that is not its id (``run --name``,
    ``--run-dir``); None where the folder is named by the id."""
    name = url.rstrip("/").rsplit("/", 1)[-1]
    return None if name == run_id or not name else name


def _read_entry(path: str) -> dict[str, Any] | None:
    """One entry, read only if it is a plain file of bounded size holding an entry."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_ENTRY:
            return None
        data = os.read(fd, _MAX_ENTRY + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not (
        isinstance(doc, dict)
        and isinstance(doc.get("run_id"), str)
        and isinstance(doc.get("url"), str)
        and doc["url"]
        and isinstance(doc.get("noted"), int | float)
    ):
        return None
    return doc
