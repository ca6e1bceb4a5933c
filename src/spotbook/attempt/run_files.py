"""The run's files: what its cells create or change on disk, saved with the snapshot that
covers them and put back before the kernel starts on a node that lacks them.

A preemption takes the node's disk. The next attempt may start on a machine that has
never seen the run, so the files a notebook writes and reads back later (``np.save`` /
``np.load``, a CSV, a checkpoint, ``%%writefile helper.py`` and ``import helper``, a
SQLite file, a log appended to) are part of its state, as its variables are.

What is captured: every file, directory and symbolic link under the directories the run
writes into — the kernel's working directory and the run's own temporary directory —
that a cell created or changed since the attempt began (size, ``mtime_ns`` and inode
against the last scan: that covers what subprocesses and ``!`` commands write), and the
files Python opened for writing anywhere else (the kernel's audit hook notes them; the
environment's own places, ``sys.prefix`` and IPython's, are not the run's files). Files
that were there when the attempt began and never changed are inputs: they come with the
image or the volume. Content goes into the run store's blob directory, named by its
hash like the kernel state's blobs (an unchanged file is stored once); the snapshot's
manifest lists each path with its kind, size, mode and ``mtime_ns``, and links as links
(never followed). What is excluded (``--files-exclude``) or over the budget
(``--files-budget``) is listed as skipped, so a resume can name it.

Restore: each listed file that is missing here, or differs in size or ``mtime_ns``, is
written from its blob (checked against its hash) beside its place and renamed over it,
never through a link; the same node with its files intact copies nothing.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import logging
import mmap
import os
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..kernel.pickling import Blobs, IntegrityError, digest_of
from ..store.integrity import make_private_dirs

if TYPE_CHECKING:
    from ..store.runstore import RunStore

log = logging.getLogger(__name__)

# directories never scanned: version control, caches of Python and Jupyter, spotbook's
# own run stores, virtual environments (the environment is rebuilt by its cells)
_SKIP_NAMES = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".ipynb_checkpoints", ".spotbook", ".ipython"}
)
# what marks a folder as not the run's: a virtual environment, a run store, a sweep's store
_NOT_RUN_DIRS = (("pyvenv.cfg",), ("run.json", "input.ipynb"), ("sweep.json", "points"))
_MAX_ENTRIES = 200_000  # a scan stops here (and the snapshot says so)
# files up to this size are copied at the cell boundary itself (milliseconds); larger ones
# beside the next cell, and kept only if they did not change meanwhile
SMALL = 16 << 20
_TRANSFERS = 8
Key = tuple[str, int, int, int]  # kind, size, mtime_ns, inode


class FilesIntegrityError(Exception):
    """A captured file's blob does not match its hash, or a path is not a plain one."""


@dataclass(frozen=True)
class FilesPolicy:
    """What of the run's files is captured: at most ``budget`` bytes, none matching
    ``exclude`` (globs on the path, its name, or its path under the working directory)."""

    budget: int = 20 << 30
    exclude: tuple[str, ...] = ()


@dataclass
class Restored:
    """What a restore put back."""

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    failed: dict[str, str] = field(default_factory=dict)


def _key(st: os.stat_result) -> Key:
    if stat.S_ISDIR(st.st_mode):
        return ("dir", 0, 0, 0)  # a directory changes when its entries do: those count
    kind = "link" if stat.S_ISLNK(st.st_mode) else "file"
    return (kind, st.st_size, st.st_mtime_ns, st.st_ino)


def checked_path(path: Any) -> str:
    """``path`` from a manifest as an absolute, normalised path, or refuse it."""
    ok = isinstance(path, str) and path.startswith("/") and "\x00" not in path
    if ok:
        ok = os.path.normpath(path) == path and not any(ord(c) < 32 for c in path)
    if not ok:
        raise FilesIntegrityError(f"the snapshot lists the file path {path!r}, not a plain one")
    assert isinstance(path, str)
    return path


class RunFiles:
    """One attempt's view of the run's files: what it has captured, and what it has seen."""

    def __init__(
        self,
        roots: Iterable[str],
        *,
        skip: Iterable[str] = (),
        policy: FilesPolicy | None = None,
    ) -> None:
        self.roots = sorted({os.path.abspath(r) for r in roots if r})
        self.skip = frozenset(os.path.abspath(p) for p in skip if p)
        self.policy = policy or FilesPolicy()
        self.entries: dict[str, dict[str, Any]] = {}  # path -> entry, as in the manifest
        self.skipped: dict[str, dict[str, Any]] = {}  # path -> {size, why}
        self.seen: dict[str, Key] = {}
        self.noted: set[str] = set()  # written outside the roots, since the last capture
        self.truncated = False
        self._inputs: set[str] = set()  # there when the attempt began, and not the run's

    # -- scanning ----------------------------------------------------------------------
    def _skipped_dir(self, path: str, name: str) -> bool:
        if name in _SKIP_NAMES or path in self.skip:
            return True
        # a virtual environment (the environment's, rebuilt by the cells that made it), a
        # run store or a sweep's (another run's own, e.g. the other points of a sweep
        # sharing this working directory: never this run's files)
        return any(
            all(os.path.exists(os.path.join(path, m)) for m in markers) for markers in _NOT_RUN_DIRS
        )

    def scan(self) -> dict[str, Key]:
        """Every entry under the roots (never through a link), and the noted paths."""
        found: dict[str, Key] = {}
        self.truncated = False
        for root in self.roots:
            stack = [root]
            while stack:
                top = stack.pop()
                try:
                    with os.scandir(top) as it:
                        items = list(it)
                except OSError:
                    continue
                for entry in items:
                    path = entry.path
                    if path in self.skip:
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        if self._skipped_dir(path, entry.name):
                            continue
                        stack.append(path)
                    elif not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                        continue  # FIFOs, sockets, devices are not files to keep
                    found[path] = _key(st)
                    if len(found) >= _MAX_ENTRIES:
                        self.truncated = True
                        return found
        for path in self.noted | set(self.entries):
            if path in found or path in self.skip or self._under_root(path):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                found[path] = _key(st)
        return found

    def covers(self, path: str) -> bool:
        """Whether ``path`` lies in a directory every capture scans."""
        return self._under_root(path) and path not in self.skip

    def _under_root(self, path: str) -> bool:
        return any(path.startswith(os.path.join(r, "")) for r in self.roots)

    def begin(self, files: Mapping[str, Any] | None) -> None:
        """The attempt's starting point: what the restored snapshot listed, and what is
        on disk now (the rest of it is input)."""
        self.entries = {p: dict(e) for p, e in ((files or {}).get("entries") or {}).items()}
        self.skipped = {p: dict(e) for p, e in ((files or {}).get("skipped") or {}).items()}
        self.seen = self.scan()
        self._inputs = set(self.seen) - set(self.entries)

    def remove_created(self) -> list[str]:
        """Before the notebook runs again from its first cell (the state could not be
        rebuilt): remove what the run created, so it starts from its inputs as a fresh
        run does. Files it changed that were there before it are left as they are."""
        removed = []
        created = [p for p, e in self.entries.items() if e.get("created")]
        for path in sorted(created, key=len, reverse=True):  # children before parents
            try:
                if self.entries[path].get("kind") == "dir":
                    os.rmdir(path)
                else:
                    os.unlink(path)
                removed.append(path)
            except OSError:
                continue
        self.begin(None)
        return removed

    def note(self, written: Iterable[str]) -> None:
        """Paths a cell opened for writing (from the kernel's note)."""
        for path in written:
            if isinstance(path, str) and path.startswith("/"):
                self.noted.add(os.path.normpath(path))

    # -- capturing ----------------------------------------------------------------------
    def _excluded(self, path: str) -> str | None:
        rels = [path, os.path.basename(path)]
        rels += [os.path.relpath(path, r) for r in self.roots if self._under(path, r)]
        for pattern in self.policy.exclude:
            if any(fnmatch.fnmatch(rel, pattern) for rel in rels):
                return pattern
        return None

    @staticmethod
    def _under(path: str, root: str) -> bool:
        return path.startswith(os.path.join(root, ""))

    def capture(self, blob_dir: str) -> tuple[dict[str, Any], int]:
        """Save what changed since the last capture into ``blob_dir``, all of it now;
        return the files' part of the snapshot manifest and the bytes newly written."""
        return self.stage(blob_dir)()

    def stage(self, blob_dir: str) -> Callable[[], tuple[dict[str, Any], int]]:
        """At a cell boundary: scan, and save the changed small files, links and
        directories now (before the next cell can change them); return the rest of the
        work — the changed large files — to run beside the next cell. Its result is the
        files' part of the snapshot manifest and the bytes written. A large file that
        changed between the boundary and its copy (size, ``mtime_ns`` or inode) is not
        kept: it is listed as skipped, so a resume that lacks it names it."""
        now = self.scan()
        blobs = Blobs(blob_dir)
        for path in [p for p in self.entries if p not in now]:
            del self.entries[path]  # deleted since
        for path in [p for p in self.skipped if p not in now]:
            del self.skipped[path]
        changed = sorted(p for p, k in now.items() if self.seen.get(p) != k)
        total = sum(int(e.get("size") or 0) for e in self.entries.values())
        later: list[tuple[str, bool]] = []
        for path in changed:
            kind = now[path][0]
            old = self.entries.pop(path, None)
            created = bool(old.get("created")) if old is not None else path not in self._inputs
            self.skipped.pop(path, None)
            if old is not None and old.get("kind") == "file":
                total -= int(old.get("size") or 0)
            try:
                st = os.lstat(path)
                if kind == "dir":
                    self.entries[path] = {"kind": "dir", "mode": stat.S_IMODE(st.st_mode)}
                    self.entries[path]["created"] = created
                    continue
                if kind == "link":
                    self.entries[path] = {"kind": "link", "target": os.readlink(path)}
                    self.entries[path]["created"] = created
                    continue
                why = self._excluded(path)
                if why is not None:
                    self.skipped[path] = {"size": st.st_size, "why": f"--files-exclude {why}"}
                    continue
                if total + st.st_size > self.policy.budget:
                    self.skipped[path] = {
                        "size": st.st_size,
                        "why": f"over --files-budget ({self.policy.budget} bytes)",
                    }
                    continue
                total += st.st_size
                if st.st_size > SMALL:
                    later.append((path, created))
                    continue
                entry = _put(blobs, path)
                entry["created"] = created
            except FileNotFoundError:
                now.pop(path, None)  # gone between the scan and now
                continue
            except OSError as exc:
                self.skipped[path] = {"size": 0, "why": f"unreadable ({exc.strerror})"}
                continue
            self.entries[path] = entry
            now[path] = (kind, entry["size"], entry["mtime_ns"], now[path][3])
        self.seen = now
        self.noted.clear()
        truncated = self.truncated

        def rest() -> tuple[dict[str, Any], int]:
            for path, created in later:
                boundary = now[path]
                try:
                    entry = _put(blobs, path)
                    after = _key(os.lstat(path))
                except FileNotFoundError:
                    after = None
                    entry = {}
                if after != boundary or (entry.get("size"), entry.get("mtime_ns")) != (
                    boundary[1],
                    boundary[2],
                ):
                    self.skipped[path] = {
                        "size": boundary[1],
                        "why": "changed by the next cell before it was saved",
                    }
                    continue
                entry["created"] = created
                self.entries[path] = entry
            doc: dict[str, Any] = {"entries": dict(self.entries), "skipped": dict(self.skipped)}
            if truncated:
                doc["truncated"] = _MAX_ENTRIES
            return doc, blobs.written

        return rest

    def digests(self) -> list[str]:
        """The blobs the captured files need."""
        return sorted({e["sha256"] for e in self.entries.values() if e.get("kind") == "file"})


def _put(blobs: Blobs, path: str) -> dict[str, Any]:
    """One file into the blob directory, read through a descriptor opened without
    following a link; its entry."""
    # O_NONBLOCK: a FIFO put here since the folder was listed is refused, not waited on
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
        os.set_blocking(fd, True)
        if st.st_size == 0:
            digest = blobs.put(b"")
        else:
            with mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ) as mapped:
                view = memoryview(mapped)
                try:
                    digest = blobs.put(view)
                finally:
                    view.release()
    finally:
        os.close(fd)
    return {
        "kind": "file",
        "sha256": digest,
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime_ns": st.st_mtime_ns,
    }


def _digest_of_fd(fd: int) -> str:
    """The blob name of an open file's content (mapped, pieces hashed on every core)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return digest_of(memoryview(b""))
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
        view = memoryview(mapped)
        try:
            return digest_of(view)
        finally:
            view.release()


def _same(path: str, entry: Mapping[str, Any]) -> bool:
    """Whether what is at ``path`` is already what the entry describes."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind = entry.get("kind")
    if kind == "dir":
        return stat.S_ISDIR(st.st_mode)
    if kind == "link":
        return stat.S_ISLNK(st.st_mode) and os.readlink(path) == entry.get("target")
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_size == entry.get("size")
        and st.st_mtime_ns == entry.get("mtime_ns")
    )


def missing(files: Mapping[str, Any] | None) -> list[str]:
    """The listed paths that are not here as listed."""
    entries = (files or {}).get("entries") or {}
    return [p for p, e in sorted(entries.items()) if not _same(p, e)]


def restore(
    files: Mapping[str, Any] | None,
    fetch: Callable[[str, str], None],
) -> Restored:
    """Put back every listed entry that is not here as listed. ``fetch(digest, path)``
    writes a blob's bytes to a new file at ``path`` (checked against the digest)."""
    done = Restored()
    started = time.monotonic()
    entries = (files or {}).get("entries") or {}
    todo = [(checked_path(p), e) for p, e in sorted(entries.items()) if not _same(p, e)]
    # directories first (sorted: a parent before its children), then files and links
    for path, entry in todo:
        if entry.get("kind") == "dir":
            try:
                _make_dirs(path, int(entry.get("mode") or 0o700))
            except OSError as exc:
                done.failed[path] = exc.strerror or str(exc)

    def one(item: tuple[str, Mapping[str, Any]]) -> tuple[str, int, str | None]:
        path, entry = item
        try:
            _make_dirs(os.path.dirname(path), 0o700)
            tmp = os.path.join(
                os.path.dirname(path), f".{os.path.basename(path)}.spotbook-{uuid.uuid4().hex}"
            )
            try:
                if entry.get("kind") == "link":
                    os.symlink(str(entry.get("target")), tmp)
                    os.replace(tmp, path)
                    return path, 0, None
                fetch(str(entry["sha256"]), tmp)
                os.chmod(tmp, int(entry.get("mode") or 0o600) & 0o7777, follow_symlinks=False)
                os.utime(tmp, ns=(int(entry["mtime_ns"]), int(entry["mtime_ns"])))
                os.replace(tmp, path)  # replaces a link at ``path``, never writes through it
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            return path, int(entry.get("size") or 0), None
        except FilesIntegrityError:
            raise  # the store was changed: the resume is refused, by name
        except (OSError, KeyError, ValueError) as exc:
            return path, 0, getattr(exc, "strerror", None) or str(exc)

    work = [(p, e) for p, e in todo if e.get("kind") != "dir"]
    with ThreadPoolExecutor(_TRANSFERS) as pool:
        for path, size, error in pool.map(one, work):
            if error is None:
                done.files += 1
                done.bytes += size
            else:
                done.failed[path] = error
    done.seconds = time.monotonic() - started
    return done


def _make_dirs(path: str, mode: int) -> None:
    """``path`` and its missing parents (0700, as the store's), refusing to pass
    through a link."""
    existed = os.path.isdir(path)
    make_private_dirs(path)
    if os.path.islink(path) or not os.path.isdir(path):
        raise OSError(0, f"{path} is not a directory")
    if not existed and mode and mode & 0o7777 != 0o700:  # made now: given its own mode
        with contextlib.suppress(OSError):
            os.chmod(path, mode & 0o7777)


def check_blob(fd: int, digest: str, path: str) -> None:
    """Raise :class:`FilesIntegrityError` unless the open file ``fd`` (the blob of
    ``path``) is a plain file that hashes to ``digest`` (mapped, hashed in pieces on every
    core)."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise FilesIntegrityError(f"the blob of {path} is not a plain file")
    if _digest_of_fd(fd) != digest:
        raise FilesIntegrityError(f"the blob of {path} does not match its hash")


def fetch_blob(store: RunStore) -> Callable[[str, str], None]:
    """``fetch`` for :func:`restore`: the blob from ``store``, checked against its name."""

    def fetch(digest: str, path: str) -> None:
        store.get_blob(digest, path, functools.partial(check_blob, digest=digest, path=path))

    return fetch


def is_integrity(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed integrity check of the run's files or state."""
    return isinstance(exc, FilesIntegrityError | IntegrityError)
