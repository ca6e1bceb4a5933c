"""The run store: one layout on any fsspec URL. With ``backends.py``, the only module that
imports fsspec.

Layout under the run's URL::

    run.json                 spec + status, rewritten atomically on state changes; its
                             ``seal`` binds the spec, input.ipynb's hash and the key's id
    input.ipynb              the parameterised notebook, frozen at creation
    output.ipynb             assembled notebook, refreshed on a throttle and at the end
    cells/aMMMM.jsonl        records of finished cells, one line each, by attempt MMMM
                             (object stores: cells/NNNNN-aMMMM.json, one object each)
    attempts/MMMM.json       one record per attempt, created exclusively (the fence)
    state/blobs/SHA256       content-addressed pickles of kernel variables
    state/snap/NNNNN-aMMMM.json   snapshot manifest taken after cell NNNNN
    state/loop/NNNNN-aMMMM.json   the newest checkpoint attempt MMMM took inside cell
                             NNNNN (at a loop's iteration boundary: a snapshot manifest
                             with the loop's position and the cell's outputs so far)
    files/                   the notebook's checkpoint directory (local stores)
    files/aMMMM-SSSSSS.json  object stores: checkpoint-directory manifest number SSSSSS of
                             attempt MMMM (path -> blob in state/blobs), the newest wins

On object stores every request is retried on transient faults (5xx, throttling,
timeouts, resets) with backoff, and the fence is the store's own conditional write
(S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``).

Records are never edited in place: each is a new object whose name carries the
attempt that wrote it, and a record of attempt A counts only for cells before the point
where attempt A+1 took over (``attempts/A+1.json`` says where), so a stale attempt can
never change what a newer one sees. (run.json, whose spec is sealed, and output.ipynb
are rewritten whole; a resume continues from the records, not from them.)

Everything the runner trusts is sealed (``integrity``): cell records, attempt records,
snapshot and checkpoint manifests carry an HMAC bound to the run and their place, made
with a key the store never holds. A local store's files are 0600 and its directories
0700 whatever the umask; symbolic links inside it are refused.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from .._errors import (
    InputNotFoundError,
    RunNotFoundError,
    StorageError,
    StoreIntegrityError,
    UsageError,
)
from .._models import AttemptRecord, CellStatus
from .backends import atomic_write, backend_for, transient, with_retries
from .integrity import (
    SEAL_FORMAT,
    SEAL_FORMATS,
    Key,
    LegacySeal,
    Seal,
    copy_checked,
    is_trusted,
    load_key,
    safe_relpath,
    sha256_hex,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

LOCAL_RUNS = os.path.join(".spotbook", "runs")
JOB_RECORD = "job.json"  # which cluster, namespace and Job run it (written by submit)
SWEEP_FILE = "sweep.json"  # a sweep's points and options (at the sweep's root)
POINTS_DIR = "points"  # a sweep's points' run stores: <sweep>/points/<i>
_MAX_POINTS = 100_000
_SWEEP_MEND = (
    "it was not used. Inspect the store, or run the same `spotbook sweep` command with "
    "--restart to write it anew"
)
# What a reader takes of one document before refusing it (a writer of the store could make
# one of gigabytes): run.json, attempt and cell records, snapshot manifests are kilobytes
# to a few megabytes; an attempt's records file holds every cell's outputs (images too).
DOC_LIMIT = 64 << 20
RECORDS_LIMIT = 1 << 30
_TRANSFERS = 8  # object stores: concurrent blob transfers
CANCELLED = "cancelled.json"  # the user cancelled the run
_CELL_RE = re.compile(r"^(\d{5})-a(\d{4})\.json$")
_ATTEMPT_RE = re.compile(r"^(\d{4})\.json$")
_JSONL_RE = re.compile(r"^a(\d{4})\.jsonl$")
_FILES_RE = re.compile(r"^a(\d{4})-(\d{6})\.json$")
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
# what a local store must hold as plain files and directories (no symbolic links)
_TRUSTED = ("run.json", "input.ipynb", "cells", "attempts", "state", "files", "outputs")
_TRUSTED_DIRS = ("cells", "attempts", "state/snap", "state/blobs", "state")

LEGACY_ENV = "SPOTBOOK_TRUST_LEGACY_STORE"


def new_run_id(now: float | None = None) -> str:
    """A new run id: the UTC time to the second and 6 random hex digits (sortable)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    return f"{stamp}-{secrets.token_hex(3)}"


def is_url(text: str) -> bool:
    """Whether ``text`` is a URL with a scheme (not a local path)."""
    return "://" in text


CACHE_ENV = "SPOTBOOK_CACHE_DIR"


def library_runs_dir() -> str:
    """Where ``execute_notebook`` keeps run stores when given no ``run_dir``: the user's
    cache (``$SPOTBOOK_CACHE_DIR/runs``, else ``$XDG_CACHE_HOME/spotbook/runs``, else
    ``~/.cache/spotbook/runs``), so a papermill user who switches the import finds no
    new folder in the project."""
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spotbook"
    )
    return os.path.join(base, "runs")


# the Python types of an attempt record's fields (``AttemptRecord``): a field read from a
# store that is not of its type is refused by name, not met later as a traceback
def _attempt_types() -> dict[str, tuple[type, ...]]:
    """Each field's types; ``type(None)`` among them where the field may be null."""
    import types
    import typing

    out: dict[str, tuple[type, ...]] = {}
    for name, hint in typing.get_type_hints(AttemptRecord).items():
        origin = typing.get_origin(hint) or hint
        nullable = False
        if origin in (typing.Union, types.UnionType):
            nullable = type(None) in typing.get_args(hint)
            args = [typing.get_origin(a) or a for a in typing.get_args(hint) if a is not type(None)]
        else:
            args = [origin]
        # a TypedDict is a dict as read from JSON
        kinds = tuple(dict if issubclass(a, dict) else a for a in args if isinstance(a, type))
        if float in kinds:
            kinds = (*kinds, int)  # a whole number of seconds is a number of seconds
        if kinds:
            out[name] = (*kinds, type(None)) if nullable else kinds
    return out


def parse_json(data: bytes) -> Any:
    """A JSON document read from a store; ValueError for anything that is not one, or
    that spotbook could not have written: nested too deeply for the parser's stack, or
    holding a lone surrogate escape (no text: spotbook's writes encode UTF-8, and the
    seal's canonical form cannot hold one)."""
    try:
        doc = json.loads(data)
        if b"\\ud" in data or b"\\uD" in data:
            json.dumps(doc, ensure_ascii=False).encode()
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except UnicodeError as exc:  # a ValueError, but say which
        raise ValueError(f"not text: {exc}") from None
    return doc


_RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")


def named_id(run: str) -> str | None:
    """The run id ``run`` names, where it is one (not a path, URL or name)."""
    return run if _RUN_ID.fullmatch(run) else None


def resolve_run(run: str, base: str = ".") -> str:
    """A run id or URL/path to the run store's URL: an id is looked for under
    ``base/.spotbook/runs``, then in the user's index of runs (any folder, any bucket)."""
    if is_url(run):
        return run
    if os.sep in run or os.path.isdir(run):
        return os.path.abspath(run)
    here = os.path.abspath(os.path.join(base, LOCAL_RUNS, run))
    if os.path.isdir(here):
        return here
    from .index import find_indexed

    return find_indexed(run) or here


def _fs(url: str) -> tuple[Any, str]:
    try:
        options: dict[str, Any] = {}
        if is_url(url) and not url.startswith(("file://", "local://")):
            # Another attempt may write at any time: a cached listing would hide its
            # records and its fence, so object stores are always asked afresh.
            options["use_listings_cache"] = False
            if url.startswith(("s3://", "s3a://")):
                options["config_kwargs"] = {"retries": {"max_attempts": 1, "mode": "standard"}}
        fs, path = fsspec.core.url_to_fs(url, **options)
        _one_request_per_try(fs)
        return fs, str(path)
    except (ImportError, ValueError) as exc:
        raise UsageError(
            f"cannot open {url!r}: {exc}; install the fsspec backend for that scheme "
            "(e.g. gcsfs for gs://, s3fs for s3://)"
        ) from exc


def listing_fs(base: str) -> tuple[Any, str]:
    """The filesystem and path of a folder or URL to look for runs under (``runs DIR``,
    the dashboard): its client's own retries kept, its listings asked afresh."""
    fresh = is_url(base) and not base.startswith(("file://", "local://"))
    fs, path = fsspec.core.url_to_fs(base, **({"use_listings_cache": False} if fresh else {}))
    return fs, str(path)


def _one_request_per_try(fs: Any) -> None:
    """Make ``with_retries`` the only retry layer: one try, one request.

    The client libraries retry on their own (s3fs 5 times, each with botocore's attempts;
    gcsfs 6 times, sleeping up to 32 s): under spotbook's retries an outage then costs
    minutes per operation, and no deadline can cut a sleep inside the client. Azure's SDK
    keeps its own policy (adlfs offers no switch for it); the runner's exit watchdog
    bounds the time to exit there.
    """
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("s3", "s3a"):
        fs.retries = 1
    elif protocol in ("gs", "gcs"):
        raw = getattr(type(fs)._request, "__wrapped__", None)  # without @retry_request
        if raw is not None:
            fs._request = functools.partial(raw, fs)


def read_url(url: str) -> bytes:
    """Bytes of an input path or URL."""
    fs, path = _fs(url)
    try:
        if isinstance(fs, LocalFileSystem):
            with fs.open(path, "rb") as fh:
                data: bytes = fh.read()
                return data
        return with_retries(lambda: bytes(fs.cat_file(path)), f"read {url}")
    except FileNotFoundError as exc:
        raise InputNotFoundError(f"{url!r} does not exist; check the path or URL") from exc
    except IsADirectoryError as exc:
        raise InputNotFoundError(f"{url!r} is a directory, not a notebook file") from exc
    except Exception as exc:
        if not (isinstance(exc, OSError) or transient(exc)):
            raise
        raise StorageError(f"cannot read {url!r}: {exc}") from exc


def write_url(url: str, data: bytes) -> None:
    """Write an output path or URL (atomically on local disks)."""
    fs, path = _fs(url)
    try:
        if isinstance(fs, LocalFileSystem):
            atomic_write(path, data)
        else:
            with_retries(lambda: fs.pipe_file(path, data), f"write {url}")
    except Exception as exc:
        if not (isinstance(exc, OSError) or transient(exc)):
            raise
        raise StorageError(
            f"cannot write {url!r}: {exc}; choose a writable output location"
        ) from exc


def check_writable(url: str) -> None:
    """Fail early (before any compute) when an output location cannot be written."""
    fs, path = _fs(url)
    if not isinstance(fs, LocalFileSystem):
        return  # object stores: the first write tells; nothing is lost (the store has it)
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        raise UsageError(f"output {url!r} is a directory; give a file name ending in .ipynb")
    if not os.path.isdir(parent):
        raise UsageError(f"output directory {parent!r} does not exist; create it first")
    try:  # a real probe: permission bits say nothing for root or read-only mounts
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".spotbook-probe-"):
            pass
    except OSError as exc:
        raise UsageError(
            f"output {url!r} is not writable ({exc.strerror}); choose another location"
        ) from exc


@dataclass(frozen=True)
class CellKey:
    """Which cell record: the cell's index and the attempt that wrote it."""

    index: int
    attempt: int

    @property
    def name(self) -> str:
        return f"{self.index:05d}-a{self.attempt:04d}.json"

    @classmethod
    def parse(cls, name: str) -> CellKey | None:
        m = _CELL_RE.match(name)
        return cls(int(m.group(1)), int(m.group(2))) if m else None


def point_url(url: str, index: int) -> str:
    """The run store of point ``index`` of the sweep at ``url``."""
    return f"{url.rstrip('/')}/{POINTS_DIR}/{index}"


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep, as its ``sweep.json`` lists it."""

    index: int
    parameters: dict[str, Any]


def _sweep_point(where: str, n: int, item: Any) -> SweepPoint:
    """Entry ``n`` of a sweep's points, checked: the point's store is named by its index."""
    why = ""
    if not isinstance(item, dict):
        why = f"a JSON {type(item).__name__}, not an object"
    elif not isinstance(item.get("index"), int) or isinstance(item.get("index"), bool):
        why = "its index is not a whole number"
    elif not 0 <= item["index"] < _MAX_POINTS:
        why = f"its index {item['index']} is out of range"
    elif not isinstance(item.get("parameters"), dict):
        why = "its parameters are not a JSON object"
    if why:
        raise StoreIntegrityError(f"{where}: point {n} is malformed ({why}); {_SWEEP_MEND}")
    return SweepPoint(item["index"], item["parameters"])


class RunStore:
    """Reads and writes one run's store. Safe to use from the runner and the kernel."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, self.root = _fs(url)
        self.backend = backend_for(url, self.fs, self.root)
        self.bytes_written = 0
        # Set once run.json's seal is checked (``unseal``) or made (``seal_run``): from
        # then on what the runner trusts is signed on write and checked on read.
        self.seal: Seal | None = None
        # run.json's generation: one more each time a new command re-seals it; every
        # attempt record carries the one it ran under, so an older run.json put back in
        # place of a newer one (an earlier command's limits or flags) is refused
        self.run_generation = 0
        # run.json as the command that sealed it wrote it (``write_run``): the runner
        # that follows in the same process takes it instead of reading and checking it
        # again (once: what an attempt writes after it changes run.json's status)
        self.checked_run: dict[str, Any] | None = None
        self._seq: dict[int, int] = {}  # attempt -> records it wrote (a record's ``seq``)

    def __repr__(self) -> str:
        return f"RunStore({self.url!r})"

    @property
    def local(self) -> bool:
        """Whether the store is a directory on this machine's disk (the checkpoint
        directory and the snapshot blobs then live in it, not in a synced copy)."""
        return self.backend.local

    @property
    def deadline(self) -> float | None:
        """After a termination notice: retries stop where the time to exit runs out."""
        return self.backend.deadline

    @deadline.setter
    def deadline(self, value: float | None) -> None:
        self.backend.deadline = value

    # -- primitives (the backend does each its own way) -------------------------------
    def path(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}"

    def write(self, rel: str, data: bytes) -> None:
        """Atomically replace ``rel`` (new object, then rename where that exists)."""
        self.backend.write(self.path(rel), data, f"write {rel}")
        self.bytes_written += len(data)

    def create(self, rel: str, data: bytes) -> bool:
        """Write ``rel`` only if it does not exist; False if it did (the fence).

        Object stores use their conditional write, so two writers racing for the same
        name cannot both win. A retried request whose first try did land finds its own
        bytes there, which counts as created; so ``data`` must be unique to the caller.
        """
        created = self.backend.create(self.path(rel), data, f"create {rel}")
        if created:
            self.bytes_written += len(data)
        return created

    def read(self, rel: str, limit: int = RECORDS_LIMIT) -> bytes | None:
        """Bytes of ``rel``, or None if it does not exist; more than ``limit`` bytes are
        refused (StoreIntegrityError) without being read. Every read has a limit: a
        writer of the store can make an object of any size."""
        try:
            return self.backend.read(self.path(rel), f"read {rel}", limit)
        except FileNotFoundError:
            return None

    def exists(self, rel: str) -> bool:
        return self.backend.exists(self.path(rel), f"look up {rel}")

    def names(self, rel_dir: str) -> list[str]:
        """File names directly under ``rel_dir`` (empty if it does not exist)."""
        try:
            return self.backend.names(self.path(rel_dir), f"list {rel_dir}")
        except FileNotFoundError:
            return []

    def put_file(self, local: str, rel: str) -> int:
        """Upload a local file to ``rel`` (streamed); returns its size."""
        size = os.path.getsize(local)
        self.backend.put_file(local, self.path(rel), f"upload {rel}")
        self.bytes_written += size
        return size

    def get_file(self, rel: str, local: str) -> None:
        """Download ``rel`` to a local file (streamed)."""
        self.backend.get_file(self.path(rel), local, f"download {rel}")

    def get_blob(self, digest: str, local: str, check: Callable[[int], None]) -> None:
        """Bring blob ``digest`` to the new file ``local``, ``check`` (given the blob open;
        it raises unless that holds ``digest``) passed first: a local store's blob is
        checked where it is and copied by the kernel in one pass, an object store's is
        downloaded, then checked."""
        if self.local:
            copy_checked(self.path(self.blob_path(digest)), local, check)
            return
        self.get_file(self.blob_path(digest), local)
        fd = os.open(local, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            check(fd)
        finally:
            os.close(fd)

    # -- blobs the kernel reads and writes ----------------------------------------------
    def blob_dir(self, staging: str) -> str:
        """Where the kernel reads and writes blobs: a local store's own folder (nothing
        to send), else ``staging``, a private folder the runner sends from
        (:meth:`send_blobs`) and fetches into (:meth:`fetch_blobs`)."""
        if self.local:
            return self.path("state/blobs")
        os.makedirs(staging, mode=0o700, exist_ok=True)
        return staging

    def send_blobs(self, staging: str, digests: list[str], sent: set[str]) -> None:
        """Put the blobs the kernel wrote into ``staging`` that the store lacks (a local
        store's kernel wrote them in place); ``sent`` grows by each one the store holds."""
        if self.local:
            return
        todo = [d for d in dict.fromkeys(digests) if d not in sent]

        def one(digest: str) -> None:
            rel = self.blob_path(digest)
            if not self.exists(rel):
                self.put_file(os.path.join(staging, digest), rel)
            sent.add(digest)

        with ThreadPoolExecutor(_TRANSFERS) as pool:
            list(pool.map(one, todo))

    def fetch_blobs(self, staging: str, digests: list[str], got: set[str]) -> None:
        """Bring the blobs into ``staging`` for the kernel (a local store's are read in
        place); the kernel checks each against its sealed hash before it is used."""
        if self.local:
            return

        def one(digest: str) -> None:
            local = os.path.join(staging, digest)
            if not os.path.exists(local):
                self.get_file(self.blob_path(digest), local + ".part")
                os.replace(local + ".part", local)
            got.add(digest)

        with ThreadPoolExecutor(_TRANSFERS) as pool:
            list(pool.map(one, list(dict.fromkeys(digests))))

    def local_root(self) -> str | None:
        """The store's folder on this machine, or None for an object store: what the
        run's own files never include."""
        return self.path("") if self.local else None

    def write_json(self, rel: str, obj: Any) -> None:
        self.write(rel, json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode())

    def read_json(self, rel: str) -> Any:
        data = self.read(rel, DOC_LIMIT)
        if data is None:
            return None
        try:
            return parse_json(data)
        except ValueError as exc:
            # retrying cannot help; a torn object is an accident or tampering, and either
            # way nothing in it may be used
            raise StoreIntegrityError(
                f"{self.url}/{rel} is not valid JSON ({exc}); it was not used. Inspect the "
                "store, or start the run over with `spotbook run ... --restart`"
            ) from exc

    # -- run ---------------------------------------------------------------
    def require_run(self) -> dict[str, Any]:
        return self.valid_run(self.read_json("run.json"))

    def valid_run(self, data: Any) -> dict[str, Any]:
        """run.json as ``read_json`` gave it, refused unless it holds a run (exit 2; none
        at all: no run here), its fields outside the seal of their types."""
        if data is None:
            raise RunNotFoundError(f"no spotbook run at {self.url}; list runs with `spotbook runs`")
        if not isinstance(data, dict):
            raise StoreIntegrityError(
                f"{self.url}/run.json holds no run (a JSON {type(data).__name__}, not an "
                "object); it was not used. Inspect the store, or start the run over with "
                "`spotbook run ... --restart`"
            )
        for name, want in _RUN_TYPES.items():  # the fields outside the seal, by type
            value = data.get(name)
            if value is not None and (
                not isinstance(value, want) or (isinstance(value, bool) and bool not in want)
            ):
                raise StoreIntegrityError(
                    f"{self.url}/run.json: field {name!r} is {type(value).__name__}, not "
                    f"{' or '.join(t.__name__ for t in want)}; it was not used. Inspect the "
                    "store, or start the run over with `spotbook run ... --restart`"
                )
        if not isinstance(data.get("spec"), dict):
            raise StoreIntegrityError(
                f"{self.url}/run.json holds no run spec; it was not used. Inspect the store, "
                "or start the run over with `spotbook run ... --restart`"
            )
        return data

    def require_run_of(self, expected: str | None) -> dict[str, Any]:
        """``require_run``, and, where the caller knows which run it means (a run named
        by its id, a pod of the Job submitted for it), that this store holds that run:
        another run's store put in its place, sealed with the same key, is refused (its
        own seal is checked as every store's is when it is used)."""
        data = self.require_run()
        found = data["spec"].get("run_id")
        if expected and found != expected:
            raise StoreIntegrityError(
                f"{self.url} holds run {found!r}, not run {expected!r}, which was asked "
                "for: another run's store was put in its place. It was not used; inspect "
                "the store (the run asked for may be elsewhere: `spotbook runs`)"
            )
        return data

    # -- the seal ----------------------------------------------------------------
    def seal_run(
        self,
        key: Key,
        spec: dict[str, Any],
        input_bytes: bytes,
        generation: int = 0,
        fmt: int = SEAL_FORMAT,
    ) -> dict[str, Any]:
        """run.json's seal for a run created (``generation`` 0) or re-specified here (the
        checked one's plus one, in the format the run was made with); arms the store."""
        seal = Seal(key, str(spec["run_id"]), self.url, fmt)
        info: dict[str, Any] = {
            "format": fmt,
            "key_id": seal.key_id,
            "input_sha256": sha256_hex(input_bytes),
            **({"generation": generation} if generation else {}),
        }
        info["mac"] = seal.mac("run.json", {"spec": spec, **info})
        self.seal = seal
        self.run_generation = generation
        return info

    def unseal(self, strict: bool = False, run: dict[str, Any] | None = None) -> dict[str, Any]:
        """run.json (``run``: as ``require_run`` has just read it), checked with this
        machine's key; arms the store for the rest.

        Raises StoreIntegrityError (exit 2) naming what failed; nothing is used first.
        """
        run = self.require_run() if run is None else run
        spec = run.get("spec")
        info = run.get("seal")
        if not isinstance(spec, dict) or not isinstance(spec.get("run_id"), str):
            raise StoreIntegrityError(f"{self.url}/run.json holds no valid run spec")
        self.refuse_links()
        if info is None:
            self.seal = self._legacy_seal(spec["run_id"], strict)
            return run
        if not isinstance(info, dict):
            raise StoreIntegrityError(f"{self.url}/run.json has a malformed seal")
        fmt = info.get("format")
        if fmt not in SEAL_FORMATS or isinstance(fmt, bool):
            raise StoreIntegrityError(
                f"{self.url}/run.json is sealed in format {fmt!r}, which this spotbook does "
                f"not know (it knows {', '.join(map(str, SEAL_FORMATS))}); it was not used. "
                "A newer spotbook made it: resume it with that version"
            )
        key = load_key()
        if info.get("key_id") != key.id_for(fmt):
            raise StoreIntegrityError(
                f"run {spec['run_id']} in {self.url} was sealed with another key (id "
                f"{info.get('key_id')}), not the one here ({key.source}, id "
                f"{key.id_for(fmt)}); "
                "give this process the key the run was created with: SPOTBOOK_SNAPSHOT_KEY "
                "or SPOTBOOK_SNAPSHOT_KEY_FILE (a submitted run's key is in the Kubernetes "
                "Secret `spotbook submit` named, see docs/kubernetes.md)"
            )
        seal = Seal(key, spec["run_id"], self.url, fmt)
        seal.check("run.json", {"spec": spec, **info})
        generation = info.get("generation", 0)
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            raise seal.refuse("run.json", "has a malformed generation")
        self.seal = seal
        self.run_generation = generation
        return run

    def refuse_links(self) -> None:
        """Refuse a store whose trusted files or folders are symbolic links."""
        self.backend.refuse_links(_TRUSTED, _TRUSTED_DIRS)

    def write_run(self, doc: dict[str, Any]) -> None:
        """run.json, written whole by the command that sealed it (``seal_run``)."""
        self.write_json("run.json", doc)
        self.checked_run = doc

    # -- the Job's record ----------------------------------------------------------
    def write_job_record(
        self, doc: dict[str, Any], key: Key | None = None, sweep_id: str | None = None
    ) -> None:
        """job.json, sealed: what ``wait``, ``cancel``, ``logs`` and the fallback act on
        with the user's cluster credentials (its context, namespace, and the Job's own
        options, image and Secrets included). A run's is sealed like its run.json (the
        store must be armed: made here or unsealed); a sweep's, at the sweep's root,
        with ``key`` and bound to ``sweep_id``."""
        seal = self._job_seal(key, sweep_id)
        doc = doc if seal.legacy else {**doc, "key_id": seal.key_id}
        self.write_json(JOB_RECORD, seal.sign(JOB_RECORD, doc))

    def job_record(self) -> dict[str, Any] | None:
        """job.json with its seal checked (None: the run was not submitted). Raises
        StoreIntegrityError (exit 2) for a record changed, moved from another run, or
        sealed with a key not this machine's."""
        doc = self.read_json(JOB_RECORD)
        if doc is None:
            return None
        if not isinstance(doc, dict):
            raise StoreIntegrityError(f"{self.url}/{JOB_RECORD} holds no Job record")
        if self.exists("run.json"):
            if self.seal is None:
                self.unseal()
            assert self.seal is not None
            if self.seal.legacy:  # the user trusts this older store's every writer
                return doc
            return self.seal.check(JOB_RECORD, doc)
        sweep_id = self._sweep_id()
        key = load_key(create=False)
        # a sweep's record says its format by the key id it carries (format 1's: a
        # sweep submitted by a spotbook before the derived key)
        fmt = next((f for f in SEAL_FORMATS if doc.get("key_id") == key.id_for(f)), None)
        if fmt is None:
            raise StoreIntegrityError(
                f"{self.url}/{JOB_RECORD} was sealed with another key (id "
                f"{doc.get('key_id')}), not the one here ({key.source}, id {key.id}); it was "
                "not used. Give this process the cluster's run key: SPOTBOOK_SNAPSHOT_KEY "
                "or SPOTBOOK_SNAPSHOT_KEY_FILE (see docs/kubernetes.md)"
            )
        return Seal(key, sweep_id, self.url, fmt).check(JOB_RECORD, doc)

    def sweep_points(self) -> list[SweepPoint] | None:
        """The points of the sweep whose root this store is, checked (None: it holds no
        sweep). A ``sweep.json`` that is not what ``spotbook sweep`` writes is refused
        (StoreIntegrityError, exit 2) before any point is named from it."""
        doc = self.read_json(SWEEP_FILE)
        if doc is None:
            return None
        where = f"{self.url}/{SWEEP_FILE}"
        points = doc.get("points") if isinstance(doc, dict) else None
        if not isinstance(points, list) or len(points) > _MAX_POINTS:
            raise StoreIntegrityError(f"{where} holds no list of points; {_SWEEP_MEND}")
        checked = [_sweep_point(where, n, item) for n, item in enumerate(points)]
        if len({p.index for p in checked}) != len(checked):
            raise StoreIntegrityError(f"{where} lists a point twice; {_SWEEP_MEND}")
        return checked

    def _sweep_id(self) -> str:
        sweep = self.read_json(SWEEP_FILE)
        sweep_id = sweep.get("sweep_id") if isinstance(sweep, dict) else None
        if not isinstance(sweep_id, str):
            raise StoreIntegrityError(
                f"{self.url}/{JOB_RECORD} belongs to no run nor sweep there; it was not used"
            )
        return sweep_id

    def _job_seal(self, key: Key | None, sweep_id: str | None) -> Seal:
        if sweep_id is None and not self.exists("run.json"):
            sweep_id = self._sweep_id()
        if sweep_id is not None:
            return Seal(key or load_key(), sweep_id, self.url)
        if self.seal is None:
            self.unseal()
        assert self.seal is not None
        return self.seal

    def input_matches(self, run: dict[str, Any], data: bytes) -> bool:
        """Whether ``data`` is the input.ipynb sealed in ``run`` (checked by ``unseal``)."""
        assert self.seal is not None
        if self.seal.legacy:
            return True
        return bool(sha256_hex(data) == run["seal"]["input_sha256"])

    def _legacy_seal(self, run_id: str, strict: bool) -> Seal:
        """A store from before the seal (its key, if any, is an object in the store)."""
        env = os.environ.get("SPOTBOOK_SNAPSHOT_KEY", "").strip().encode()
        key = env or (self.read("key") or b"").strip()
        why = (
            f"run store {self.url} was made by an older spotbook: nothing in it is sealed "
            "with a key kept outside the store, so whoever can write the store could change "
            "what this resume runs"
        )
        if strict or not key or not is_trusted(self.url):
            was = (
                f" ({LEGACY_ENV} no longer trusts every such store: name this one)"
                if os.environ.get(LEGACY_ENV)
                else ""
            )
            raise StoreIntegrityError(
                f"{why}. Resume it only if you trust every writer of that location: "
                f"`spotbook trust {self.url}` trusts this store, on this machine{was} (not "
                "with --strict-resume); or start it over with `spotbook run NOTEBOOK "
                "--run-dir ... --restart`"
            )
        log.warning("%s; resuming it because you trusted it (`spotbook trust`)", why)
        return LegacySeal(key, run_id, self.url)

    def delete(self) -> None:
        """Delete the run store and everything in it."""
        self.backend.delete_all()

    def discard_checkpoint_files(self) -> None:
        """After --restart: the checkpoint manifests go (``files_manifest`` would ignore
        the old run's anyway), and with them anything else left under ``files/``, which
        ``files_manifest`` refuses."""
        self.backend.discard_dir(self.path("files"))

    def remove_partials(self) -> int:
        """Delete the half-written temporaries (``*.tmp-*``) a killed writer left on a
        local store; called by a new attempt once it holds the fence. Returns how many.
        (Object stores write whole objects: nothing is left half-made.)"""
        return self.backend.remove_partials(
            ("", "cells", "attempts", "state/blobs", "state/snap", "outputs")
        )

    def _sign(self, place: str, doc: dict[str, Any]) -> dict[str, Any]:
        return doc if self.seal is None else self.seal.sign(place, doc)

    def _check(self, place: str, doc: Any) -> Any:
        return doc if self.seal is None else self.seal.check(place, doc)

    # -- attempts ------------------------------------------------------------
    def attempt_numbers(self) -> list[int]:
        out = []
        for name in self.names("attempts"):
            m = _ATTEMPT_RE.match(name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def attempts(self) -> list[dict[str, Any]]:
        """The attempt records; once sealed, checked, and only since the last --restart
        (what came before it is discarded, and may not hold this run's seal). Each
        field is of its type (``AttemptRecord``), else StoreIntegrityError names it."""
        return [self._typed_attempt(n, doc) for n, doc in self._attempts()]

    def _typed_attempt(self, n: int, doc: Any) -> dict[str, Any]:
        rel = f"{self.url}/attempts/{n:04d}.json"
        if not isinstance(doc, dict):
            raise StoreIntegrityError(f"{rel} is not an attempt record (not a JSON object)")
        for name in ("attempt",):  # what every attempt record holds from its claim
            if doc.get(name) is None:
                raise StoreIntegrityError(
                    f"{rel} is not an attempt record (it has no {name!r}); it was not used. "
                    "Inspect the store, or start the run over with `spotbook run ... --restart`"
                )
        for name, value in doc.items():
            want = _ATTEMPT_TYPES.get(name)
            if want is None:
                continue
            # (null only where the field may be null: a field outside the seal is data)
            ok = isinstance(value, want) and not (isinstance(value, bool) and bool not in want)
            if not ok:
                raise StoreIntegrityError(
                    f"{rel}: field {name!r} is {'null' if value is None else type(value).__name__}"
                    f", not {' or '.join(t.__name__ for t in want if t is not type(None))}; it "
                    "was not used. Inspect the "
                    "store, or start the run over with `spotbook run ... --restart`"
                )
        return doc

    def _attempts(self) -> list[tuple[int, dict[str, Any]]]:
        if self.seal is None:
            found = ((n, self.read_json(f"attempts/{n:04d}.json")) for n in self.attempt_numbers())
            return [(n, doc) for n, doc in found if doc is not None]  # None: removed since
        out: list[tuple[int, dict[str, Any]]] = []
        for n in reversed(self.attempt_numbers()):
            rel = f"attempts/{n:04d}.json"
            doc = self._check(rel, self.read_json(rel))
            if doc.get("attempt") != n:
                raise self.seal.refuse(rel, f"says it is attempt {doc.get('attempt')}")
            ran_under = doc.get("run_generation", 0)
            if isinstance(ran_under, int) and ran_under > self.run_generation:
                raise self.seal.refuse(
                    "run.json",
                    f"is older than {rel}, which ran under a later version of it: an "
                    "earlier run.json was put back",
                )
            out.append((n, doc))
            if doc.get("restart"):
                break
        return out[::-1]

    def restart_point(self) -> int:
        """The attempt of the last --restart (0: none); earlier attempts are discarded."""
        return max((int(a["attempt"]) for a in self.attempts() if a.get("restart")), default=0)

    def claim_attempt(self, record: Mapping[str, Any]) -> int:
        """Create the next attempt record exclusively; returns its number."""
        claim = secrets.token_hex(8)  # makes the record unique to this caller (see create)
        while True:
            numbers = self.attempt_numbers()
            n = (numbers[-1] if numbers else 0) + 1
            rel = f"attempts/{n:04d}.json"
            signed = self._sign(rel, {**record, **self._ran_under(n), "claim": claim})
            if self.create(rel, json.dumps(signed).encode()):
                return n
            log.debug("attempt %d was claimed by another runner; trying the next", n)

    def _ran_under(self, n: int) -> dict[str, Any]:
        """Attempt ``n``'s number, and the run.json generation it runs under (past 0)."""
        return {
            "attempt": n,
            **({"run_generation": self.run_generation} if self.run_generation else {}),
        }

    def update_attempt(self, n: int, record: Mapping[str, Any]) -> None:
        rel = f"attempts/{n:04d}.json"
        self.write_json(rel, self._sign(rel, {**record, **self._ran_under(n)}))

    def superseded(self, n: int) -> bool:
        return self.exists(f"attempts/{n + 1:04d}.json")

    # -- cells -----------------------------------------------------------------
    def write_cell(self, index: int, attempt: int, record: dict[str, Any]) -> None:
        """Commit one cell's record (a later record of the same cell and attempt wins).

        Each record of an attempt carries ``seq``, counting the attempt's records from 1,
        inside its seal: the newest record of a cell is the one with the highest, and on
        a local store a line out of order, repeated or missing is refused.
        """
        seq = self._seq[attempt] = self._seq.get(attempt, 0) + 1
        place = f"cells/{CellKey(index, attempt).name[:-5]}"
        body = {**record, "index": index, "attempt": attempt, "seq": seq}
        if self.backend.appends:
            # one line per record, appended: a kill leaves whole lines and at most one
            # torn last line, which readers skip
            rel = f"cells/a{attempt:04d}.jsonl"
            line = None if self.seal is None else self.seal.signed_line(place, body)
            if line is None:
                signed = self._sign(place, body)
                line = json.dumps(signed, ensure_ascii=False, separators=(",", ":")) + "\n"
            data = line.encode()
            self.backend.append(self.path(rel), data, f"append to {rel}")
            self.bytes_written += len(data)
        else:
            record = self._sign(place, body)
            self.write_json(f"cells/{CellKey(index, attempt).name}", record)

    def close(self) -> None:
        self.backend.close()

    def _counts(self, index: int, attempt: int, takeover: dict[int, int]) -> bool:
        """A record counts unless a later attempt took over at or before its cell."""
        limit = takeover.get(attempt + 1)
        return limit is None or index < limit

    def valid_keys(self, names: list[str]) -> dict[int, CellKey]:
        """For each cell index, the newest per-object record that counts."""
        takeover = self._takeover_points()
        best: dict[int, CellKey] = {}
        for name in names:
            key = CellKey.parse(name)
            if key is None or not self._counts(key.index, key.attempt, takeover):
                continue
            if key.index not in best or key.attempt > best[key.index].attempt:
                best[key.index] = key
        return best

    def _takeover_points(self) -> dict[int, int]:
        points = {}
        for rec in self.attempts():
            if "attempt" in rec:
                points[int(rec["attempt"])] = int(rec.get("resumed_from", 0))
        # A later attempt's takeover also bounds every earlier attempt.
        bound: dict[int, int] = {}
        running_min: int | None = None
        for n in sorted(points, reverse=True):
            running_min = points[n] if running_min is None else min(running_min, points[n])
            bound[n] = running_min
        # Attempts before the first record read (a sealed store reads from the last
        # --restart on) are bounded the same way.
        if bound:
            first = min(bound)
            for n in range(1, first):
                bound[n] = bound[first]
        return bound

    def spilled_text(self, record: dict[str, Any]) -> str | None:
        """The whole text a cell printed past --max-output-bytes (its record keeps the
        head and tail), checked against the hash its sealed record holds; None when
        nothing was cut."""
        spilled = record.get("spilled")
        if not spilled:
            return None
        index = record.get("index")
        rel = spilled.get("path") if isinstance(spilled, dict) else None
        digest = spilled.get("sha256") if isinstance(spilled, dict) else None
        place = f"cells/ (cell {index})"
        # where the runner puts a cell's cut output (by the attempt that cut it), whatever
        # else the record says: a path is data
        if not (
            isinstance(index, int)
            and isinstance(rel, str)
            and re.fullmatch(rf"outputs/{index:05d}-a\d{{4}}\.txt", rel)
            and isinstance(digest, str)
            and _DIGEST_RE.match(digest)
        ):
            raise StoreIntegrityError(
                f"{self.url}/{place} names its cut output as {rel!r}, not where the runner "
                "writes it; it was not read"
            )
        data = self.read(rel)
        if data is None or sha256_hex(data) != digest:
            why = "is missing" if data is None else "does not match the hash in its sealed record"
            if self.seal is not None:
                raise self.seal.refuse(rel, why)
            raise StoreIntegrityError(f"{self.url}/{rel} {why}; it was not used")
        return data.decode("utf-8", "replace")

    def cell_records(self) -> dict[int, dict[str, Any]]:
        """The record that counts for each finished cell."""
        return self.records_and_notes()[0]

    def records_and_notes(self) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
        """The record that counts for each finished cell, and the notes of cells that
        finished executing but whose record was never committed (``status: executed``:
        the files they wrote, to give back before they run again)."""
        takeover = self._takeover_points()
        restart = self.restart_point()
        best: dict[int, tuple[int, dict[str, Any]]] = {}
        names = self.names("cells")
        known = set(self.attempt_numbers())
        for name in names:
            m = _JSONL_RE.match(name) or _CELL_RE.match(name)
            if not m:
                continue
            attempt = int(m.groups()[-1])
            if self.seal is not None and attempt >= restart and attempt not in known:
                raise self.seal.refuse(
                    f"attempts/{attempt:04d}.json",
                    f"is missing while cells/{name} was written by that attempt",
                )
            if attempt < restart or not _JSONL_RE.match(name):
                continue
            for rec in self._read_lines(f"cells/{name}", attempt):
                index = int(rec["index"])
                if self._counts(index, attempt, takeover) and (
                    index not in best or attempt >= best[index][0]
                ):
                    best[index] = (attempt, rec)
        for index, key in self.valid_keys(names).items():
            if index not in best or key.attempt > best[index][0]:
                rel = f"cells/{key.name}"
                rec = self.read_json(rel)
                if rec is not None:
                    best[index] = (key.attempt, self._check_record(rel, rec, key))
        records: dict[int, dict[str, Any]] = {}
        notes: dict[int, dict[str, Any]] = {}
        for index, (_, rec) in best.items():
            (notes if rec.get("status") == CellStatus.EXECUTED else records)[index] = rec
        return records, notes

    def _read_lines(self, rel: str, attempt: int) -> list[dict[str, Any]]:
        data = self.read(rel, RECORDS_LIMIT) or b""
        lines = data.split(b"\n")
        out: list[dict[str, Any]] = []
        for i, line in enumerate(lines):
            try:
                rec = parse_json(line)
            except ValueError:
                if self.seal is not None and i < len(lines) - 1 and not self.seal.legacy:
                    # only the last line can be torn (a killed writer); the empty tail
                    # after the last newline is not a line
                    raise self.seal.refuse(f"{rel}, line {i + 1},", "is not a record") from None
                continue
            if self.seal is not None and not self.seal.legacy:
                index = rec.get("index") if isinstance(rec, dict) else None
                if not isinstance(index, int):
                    raise self.seal.refuse(f"{rel}, line {i + 1},", "is not a record")
                rec = self._check_record(f"{rel}, line {i + 1}", rec, CellKey(index, attempt))
                if rec.get("seq") != len(out) + 1:
                    raise self.seal.refuse(
                        f"{rel}, line {i + 1},",
                        f"is record {rec.get('seq')} where record {len(out) + 1} belongs "
                        "(a record was removed, repeated or moved)",
                    )
            elif not isinstance(rec, dict) or not isinstance(rec.get("index"), int):
                raise StoreIntegrityError(  # read before the seal is checked (status)
                    f"{self.url}/{rel}, line {i + 1}, is not a cell record; it was not used. "
                    "Inspect the store, or start the run over with `spotbook run ... --restart`"
                )
            out.append(rec)
        return out

    def _check_record(self, where: str, rec: Any, key: CellKey) -> dict[str, Any]:
        if self.seal is None:
            return dict(rec)
        place = f"cells/{key.name[:-5]}"
        try:
            checked = self.seal.check(place, rec)
        except StoreIntegrityError:
            raise self.seal.refuse(where, "failed its integrity check (HMAC)") from None
        if not self.seal.legacy and (
            checked.get("index") != key.index or checked.get("attempt") != key.attempt
        ):
            raise self.seal.refuse(where, "belongs to another cell or attempt")
        return checked

    # -- snapshots ---------------------------------------------------------------
    def blob_path(self, digest: str) -> str:
        return f"state/blobs/{digest}"

    def snapshot_keys(self) -> dict[int, CellKey]:
        return self.valid_keys(self.names("state/snap"))

    def write_snapshot(self, key: CellKey, doc: dict[str, Any]) -> None:
        rel = f"state/snap/{key.name}"
        self.write_json(rel, self._sign(rel, doc))

    def read_snapshot(self, key: CellKey) -> dict[str, Any] | None:
        """A snapshot manifest, checked (seal, run, cell, attempt), or None if gone."""
        rel = f"state/snap/{key.name}"
        doc = self.read_json(rel)
        if doc is None:
            return None
        checked: dict[str, Any] = self._check(rel, doc)
        expected: dict[str, Any] = {"after": key.index, "attempt": key.attempt}
        if self.seal is not None:
            expected["run_id"] = self.seal.run_id
            if any(checked.get(k) != v for k, v in expected.items()):
                raise self.seal.refuse(rel, "belongs to another run, cell or attempt")
        return checked

    # -- checkpoints inside a cell (a loop's iteration boundary) -------------------
    def write_loop_checkpoint(self, key: CellKey, doc: dict[str, Any]) -> None:
        """Commit the newest checkpoint attempt ``key.attempt`` took inside cell
        ``key.index`` (it replaces the one before: only the newest is ever resumed)."""
        rel = f"state/loop/{key.name}"
        self.write_json(rel, self._sign(rel, doc))

    def loop_checkpoint(self, index: int) -> dict[str, Any] | None:
        """The newest checkpoint taken inside cell ``index`` that a resume may go on from,
        checked, or None. One counts when no later attempt took over before that cell
        (those ran the cells before it again) and none was started over since."""
        takeover = self._takeover_points()
        restart = self.restart_point()
        best: CellKey | None = None
        for name in self.names("state/loop"):
            key = CellKey.parse(name)
            if key is None or key.index != index or key.attempt < restart:
                continue
            limit = takeover.get(key.attempt + 1)
            if limit is not None and limit < index:
                continue
            if best is None or key.attempt > best.attempt:
                best = key
        if best is None:
            return None
        rel = f"state/loop/{best.name}"
        doc = self.read_json(rel)
        if doc is None:
            return None
        checked: dict[str, Any] = self._check(rel, doc)
        in_cell = checked.get("in_cell")
        expected: dict[str, Any] = {"after": index - 1, "attempt": best.attempt}
        if self.seal is not None:
            expected["run_id"] = self.seal.run_id
            if any(checked.get(k) != v for k, v in expected.items()) or not (
                isinstance(in_cell, dict) and in_cell.get("cell") == index
            ):
                raise self.seal.refuse(rel, "belongs to another run, cell or attempt")
        checked["name"] = best.name
        return checked

    # -- checkpoint directory (object stores) --------------------------------------
    def files_manifest(self) -> dict[str, Any] | None:
        """The newest checkpoint-directory manifest (highest attempt, then sequence)."""
        best: tuple[int, int] | None = None
        restart = self.restart_point()
        for name in self.names("files"):
            m = _FILES_RE.match(name)
            if m is None:
                # the checkpoint directory is never kept as plain files in the store (the
                # runs of spotbook before issue 31 kept a local store's there, unsealed):
                # whatever is here unsealed is not used, and not silently left out
                raise StoreIntegrityError(
                    f"{self.url}/files/{name} is not a sealed checkpoint manifest; it was "
                    "not used. A run store keeps the checkpoint directory as sealed "
                    "manifests (files/aNNNN-NNNNNN.json) and blobs; a plain file here was "
                    "put by someone else, or by a spotbook older than this one. Inspect "
                    "it; to discard the run's progress and start over, run `spotbook run "
                    "NOTEBOOK --run-dir ... --restart`"
                )
            if int(m.group(1)) >= restart:
                key = (int(m.group(1)), int(m.group(2)))
                best = key if best is None or key > best else best
        if best is None:
            return None
        rel = f"files/a{best[0]:04d}-{best[1]:06d}.json"
        doc = self._check(rel, self.read_json(rel))
        if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
            raise StoreIntegrityError(f"{self.url}/{rel} is not a checkpoint manifest")
        if self.seal is not None and not self.seal.legacy and doc.get("attempt") != best[0]:
            raise self.seal.refuse(rel, "belongs to another attempt")
        # paths are data: each must stay inside the checkpoint directory
        files = {}
        for name, entry in doc["files"].items():
            digest = entry.get("sha256") if isinstance(entry, dict) else None
            if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
                raise StoreIntegrityError(f"{self.url}/{rel}: entry {name!r} names no blob")
            files[safe_relpath(name, f"{self.url}/{rel}")] = entry
        return {**doc, "files": files}

    def write_files_manifest(self, attempt: int, seq: int, doc: dict[str, Any]) -> None:
        rel = f"files/a{attempt:04d}-{seq:06d}.json"
        self.write_json(rel, self._sign(rel, doc))


_ATTEMPT_TYPES = _attempt_types()
# run.json's fields the seal does not hold (status and its message change as the run goes)
_RUN_TYPES: dict[str, tuple[type, ...]] = {
    "status": (str,),
    "message": (str,),
    "attempt": (int,),
    "updated": (int, float),
    "seal": (dict,),
}
