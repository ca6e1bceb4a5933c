"""The storage-backend seam: what a run store asks of the place it lives, and the two
kinds of place there are.

- :class:`LocalBackend` — a directory on this machine: atomic renames, exclusive hard
  links, records appended as lines, private modes, no symbolic links.
- :class:`ObjectBackend` — any other fsspec filesystem (S3, GCS, Azure, memory): whole
  objects, the store's conditional write as the fence, every request retried on
  transient faults (the only retry layer: see ``runstore._one_request_per_try``).

:class:`~spotbook.store.runstore.RunStore` holds one and never asks which it is for
an operation; ``tests/test_store_contract.py`` runs one suite of store behaviour against
every backend (local, memory, S3, GCS and Azure emulators).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .._errors import StorageError, StoreIntegrityError, UsageError
from .integrity import make_private_dirs

log = logging.getLogger(__name__)
T = TypeVar("T")

# Transient faults on object stores: how often and how long to retry a request.
RETRY_TRIES = 8
RETRY_FIRST = 0.2  # seconds before the first retry; doubles, with jitter
RETRY_MAX_SLEEP = 5.0
# the retries' own generator: never the global one a notebook may have seeded
_jitter = random.SystemRandom()
# Errors retrying cannot fix: the answer would be the same.
_PERMANENT = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    ValueError,
    TypeError,
)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` may pass on a retry (a timeout, a dropped connection, a 5xx)."""
    if isinstance(exc, _PERMANENT):
        return False
    # OSError covers the backends' translated 5xx/throttling errors, socket resets and
    # timeouts; the HTTP client libraries also raise their own non-OSError classes.
    module = type(exc).__module__.split(".")[0]
    return isinstance(exc, OSError) or module in ("aiohttp", "botocore", "aiobotocore", "gcsfs")


def with_retries(
    op: Callable[[], T], what: str, tries: int = RETRY_TRIES, deadline: float | None = None
) -> T:
    """Run ``op``, retrying transient storage faults with exponential backoff; never
    sleeping past ``deadline`` (``time.monotonic()``), where the last error is raised."""
    delay = RETRY_FIRST
    for attempt in range(1, tries + 1):
        try:
            return op()
        except Exception as exc:
            if attempt == tries or not transient(exc):
                raise
            if deadline is not None and time.monotonic() + delay > deadline:
                log.warning("%s failed (%s); no time left to retry it", what, exc)
                raise
            log.warning(
                "%s failed (%s: %s); retry %d in %.1f s",
                what,
                type(exc).__name__,
                exc,
                attempt,
                delay,
            )
            time.sleep(delay * (0.5 + _jitter.random()))
            delay = min(delay * 2, RETRY_MAX_SLEEP)
    raise AssertionError("unreachable")


class Backend:
    """One kind of place a run store lives. Paths are the backend's own (``root/rel``);
    a missing file or object raises FileNotFoundError, and every other failure comes
    out as StorageError (may pass on retry) or UsageError (it cannot)."""

    local = False  # the store is a directory on this machine's disk
    appends = False  # cell records are appended as lines to one file per attempt

    def __init__(self, url: str, fs: Any, root: str) -> None:
        self.url = url
        self.fs = fs
        self.root = root
        self.deadline: float | None = None  # after a notice: retries stop here

    def write(self, path: str, data: bytes, what: str) -> None:
        raise NotImplementedError

    def create(self, path: str, data: bytes, what: str) -> bool:
        """Write ``path`` unless it exists; False if it did (the fence)."""
        raise NotImplementedError

    def read(self, path: str, what: str, limit: int | None = None) -> bytes:
        """The bytes of ``path``; past ``limit`` bytes, refuse (StoreIntegrityError)
        before reading the rest: a document a writer made huge must not cost the reader
        its memory."""
        raise NotImplementedError

    def _bounded(self, data: bytes, path: str, limit: int | None) -> bytes:
        if limit is not None and len(data) > limit:
            raise self._too_large(path, limit)
        return data

    def _too_large(self, path: str, limit: int) -> StoreIntegrityError:
        return StoreIntegrityError(
            f"{self.url}/{path[len(self.root) :].lstrip('/')} is larger than the "
            f"{limit >> 20} MiB such a document may be; it was not read further. "
            "Inspect the store, or start the run over with `spotbook run ... --restart`"
        )

    def exists(self, path: str, what: str) -> bool:
        raise NotImplementedError

    def delete_all(self) -> None:
        """Delete the whole store (``spotbook runs rm``, ``gc``)."""
        with self.translate("delete the run store"):
            self.fs.rm(self.root, recursive=True)

    def names(self, path: str, what: str) -> list[str]:
        """Names directly under ``path``, fresh (another attempt may just have written)."""
        raise NotImplementedError

    def put_file(self, local: str, path: str, what: str) -> None:
        self.write_op(lambda: self.fs.put_file(local, path), what)

    def get_file(self, path: str, local: str, what: str) -> None:
        self.op(lambda: self.fs.get_file(path, local), what)

    def append(self, path: str, data: bytes, what: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} writes whole objects")

    def close(self) -> None:
        """Release what the backend holds open (append handles)."""

    # what only a directory on this disk needs
    def refuse_links(self, rels: tuple[str, ...], dirs: tuple[str, ...]) -> None:
        """Refuse a symbolic link among what the store trusts (local stores)."""

    def remove_partials(self, dirs: tuple[str, ...]) -> int:
        """Delete half-written temporaries a killed writer left; how many."""
        return 0

    def discard_dir(self, path: str) -> None:
        """Remove a folder of the store and all it holds (``files/`` at a --restart)."""

    # -- errors and retries ------------------------------------------------------------
    def op(self, op: Callable[[], T], what: str) -> T:
        """One operation, its errors translated (and, where the backend retries,
        retried)."""
        with self.translate(what):
            return op()

    def write_op(self, op: Callable[[], T], what: str) -> T:
        """A write: "not found" here means the bucket (or container) is missing."""
        try:
            return self.op(op, what)
        except FileNotFoundError as exc:
            raise StorageError(
                f"run store {self.url}: cannot {what}: the bucket does not exist or is not "
                f"visible with these credentials ({exc}); create it or choose another --run-dir"
            ) from exc

    @contextlib.contextmanager
    def translate(self, what: str) -> Iterator[None]:
        try:
            yield
        except (FileExistsError, FileNotFoundError):
            raise
        except (PermissionError, NotADirectoryError, IsADirectoryError) as exc:
            raise self.unusable(what, exc) from exc
        except OSError as exc:
            raise self.oserror(what, exc) from exc
        except Exception as exc:
            if transient(exc):
                raise StorageError(f"run store {self.url}: cannot {what}: {exc}") from exc
            raise

    def unusable(self, what: str, exc: OSError) -> Exception:
        return StorageError(f"run store {self.url}: cannot {what}: {exc}")

    def oserror(self, what: str, exc: OSError) -> Exception:
        return StorageError(f"run store {self.url}: cannot {what}: {exc}")


class LocalBackend(Backend):
    """A directory on this machine."""

    local = True
    appends = True

    def __init__(self, url: str, fs: Any, root: str) -> None:
        super().__init__(url, fs, root)
        self._fds: dict[str, int] = {}
        self._root_ok = False

    def unusable(self, what: str, exc: OSError) -> Exception:
        # a local path that cannot be a run store: retrying cannot help (exit 2)
        return UsageError(
            f"run store {self.url}: cannot {what}: {exc.strerror or exc} "
            f"({exc.filename or self.root}); give --run-dir a directory this user can "
            "write (or a new path)"
        )

    def oserror(self, what: str, exc: OSError) -> Exception:
        if exc.errno == errno.EROFS:  # permanent too: exit 2
            return UsageError(
                f"run store {self.url}: cannot {what}: {exc.strerror} "
                f"({exc.filename or self.root}); give --run-dir a directory on a "
                "writable filesystem"
            )
        return super().oserror(what, exc)

    def _dirs(self, path: str, what: str) -> None:
        """Make the folders ``path`` goes in; a place where none can be made (a missing
        parent gone meanwhile, /proc) is an unusable --run-dir, not a missing object."""
        self._own_root()
        try:
            make_private_dirs(os.path.dirname(path))
        except FileNotFoundError as exc:
            raise self.unusable(what, exc) from exc

    def write(self, path: str, data: bytes, what: str) -> None:
        self._own_root()  # the fast path below makes no folder (_dirs checks it too)
        with self.translate(what):
            try:
                atomic_write(path, data, private=True)
            except FileNotFoundError:
                self._dirs(path, what)
                atomic_write(path, data, private=True)

    def _own_root(self) -> None:
        """Refuse a run folder another user owns or others can write: they could swap the
        checkpoint folder's files or plant links in it (this user's new folders are 0700)."""
        if self._root_ok:
            return
        try:
            st = os.stat(self.root)
        except OSError:
            return  # not there yet: this user makes it, 0700
        if st.st_uid != os.geteuid():
            why = f"belongs to another user (uid {st.st_uid})"
        elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            why = f"can be changed by other users (mode {stat.S_IMODE(st.st_mode):o})"
        else:
            self._root_ok = True
            return
        raise StoreIntegrityError(
            f"run store {self.url} {why}: they could change what the run loads, so it was "
            f"not used; give --run-dir a folder of your own, or `chmod go-w {self.root}`"
        )

    def create(self, path: str, data: bytes, what: str) -> bool:
        with self.translate(what):
            self._dirs(path, what)
            try:
                # Link a complete temp file into place: exclusive and never half-written.
                tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
                with _private_file(tmp) as fh:
                    fh.write(data)
                try:
                    os.link(tmp, path)
                finally:
                    os.unlink(tmp)
            except FileExistsError:
                return False
        return True

    def read(self, path: str, what: str, limit: int | None = None) -> bytes:
        with self.translate(what):
            try:
                # non-blocking: a FIFO's open would wait for a writer that never comes
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError as exc:
                if os.path.islink(path):
                    rel = os.path.relpath(path, self.root)
                    raise StoreIntegrityError(
                        f"{self.url}/{rel} is a symbolic link; a run store holds plain files "
                        "only, so it was not read"
                    ) from exc
                raise
            with os.fdopen(fd, "rb") as fh:
                self._plain(fd, path)
                if limit is not None and os.fstat(fd).st_size > limit:
                    # refused from its size, unread (reading it to the limit cost a GiB)
                    raise self._too_large(path, limit)
                return self._bounded(fh.read(-1 if limit is None else limit + 1), path, limit)

    def _plain(self, fd: int, path: str) -> None:
        """Refuse what is not a plain file: a FIFO would hold the reader (or writer)
        forever, a device could be read without end."""
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO, socket or device"
            raise StoreIntegrityError(
                f"{self.url}/{os.path.relpath(path, self.root)} is {kind}, not a plain file; "
                "a run store holds plain files only, so it was not used"
            )

    def exists(self, path: str, what: str) -> bool:
        return os.path.exists(path)

    def names(self, path: str, what: str) -> list[str]:
        with self.translate(what):
            return sorted(n for n in os.listdir(path) if ".tmp-" not in n)

    def put_file(self, local: str, path: str, what: str) -> None:
        with self.translate(what):
            self._dirs(path, what)
            tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(6)}"
            try:
                with open(local, "rb") as src, _private_file(tmp) as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def append(self, path: str, data: bytes, what: str) -> None:
        """One write(2) per call: a kill leaves whole lines and at most one torn last
        line, which readers skip."""
        with self.translate(what):
            fd = self._fds.get(path)
            if fd is None:
                self._dirs(path, what)
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                try:
                    fd = os.open(path, flags, 0o600)
                except OSError as exc:
                    if exc.errno != errno.ENXIO:
                        raise
                    raise StoreIntegrityError(  # ENXIO: a FIFO nobody reads
                        f"{self.url}/{os.path.relpath(path, self.root)} is a FIFO, not a "
                        "plain file; a run store holds plain files only, so it was not used"
                    ) from exc
                try:
                    self._plain(fd, path)
                    os.set_blocking(fd, True)
                    os.fchmod(fd, 0o600)
                except BaseException:
                    os.close(fd)
                    raise
                self._fds[path] = fd
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def refuse_links(self, rels: tuple[str, ...], dirs: tuple[str, ...]) -> None:
        self._own_root()
        for rel in rels:
            if os.path.islink(os.path.join(self.root, rel)):
                raise StoreIntegrityError(
                    f"{self.url}/{rel} is a symbolic link; a run store holds plain files "
                    "and directories only, so it was not used"
                )
        for rel in dirs:
            try:
                entries = list(os.scandir(os.path.join(self.root, rel)))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if entry.is_symlink():
                    raise StoreIntegrityError(
                        f"{self.url}/{rel}/{entry.name} is a symbolic link; a run store holds "
                        "plain files only, so it was not used"
                    )

    def remove_partials(self, dirs: tuple[str, ...]) -> int:
        removed = 0
        for rel in dirs:
            where = os.path.join(self.root, rel) if rel else self.root
            try:
                entries = list(os.scandir(where))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                # spotbook's partials are plain files: anything else of that name (a
                # directory, a FIFO) is no writer's, is never read, and stays as it is
                plain = entry.is_file(follow_symlinks=False) or entry.is_symlink()
                if ".tmp-" in entry.name and plain and not _writer_alive(entry.name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed += 1
        return removed

    def discard_dir(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)

    def delete_all(self) -> None:
        with self.translate("delete the run store"):
            if os.path.islink(self.root) or not os.path.isdir(self.root):
                raise UsageError(f"{self.url} is not a run store's folder; nothing deleted")
            shutil.rmtree(self.root)


class ObjectBackend(Backend):
    """An object store (or any fsspec filesystem that is not this machine's disk)."""

    def op(self, op: Callable[[], T], what: str) -> T:
        with self.translate(what):
            return with_retries(op, f"{self.url}: {what}", deadline=self.deadline)

    def unusable(self, what: str, exc: OSError) -> Exception:
        if isinstance(exc, PermissionError):
            return StorageError(
                f"run store {self.url}: cannot {what}: permission denied ({exc}); check the "
                "credentials in this environment (workload identity, AWS_*/GOOGLE_* "
                "variables or credential files) can read and write that location"
            )
        return super().unusable(what, exc)

    def write(self, path: str, data: bytes, what: str) -> None:
        self.write_op(lambda: self.fs.pipe_file(path, data), what)

    def create(self, path: str, data: bytes, what: str) -> bool:
        try:
            self.write_op(lambda: self.fs.pipe_file(path, data, mode="create"), what)
        except FileExistsError:
            # A retried request (ours, or the client library's own) whose first try
            # landed finds its own bytes: that is a win. Callers make data unique.
            try:
                if self.read(path, what) != data:
                    return False
            except FileNotFoundError:
                return False
            log.debug("%s: an earlier try of this request landed", what)
        return True

    def read(self, path: str, what: str, limit: int | None = None) -> bytes:
        end = None if limit is None else limit + 1  # a ranged request: no more is fetched
        data: bytes = self.op(lambda: self.fs.cat_file(path, start=0, end=end), what)
        return self._bounded(data, path, limit)

    def exists(self, path: str, what: str) -> bool:
        return bool(self.op(lambda: self.fs.exists(path), what))

    def names(self, path: str, what: str) -> list[str]:
        found = self.op(lambda: self.fs.ls(path, detail=False), what)
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in found)

    def discard_dir(self, path: str) -> None:
        def rm() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path, recursive=True)

        self.write_op(rm, f"remove {path}")


def backend_for(url: str, fs: Any, root: str) -> Backend:
    """The backend for ``url``: the local disk or an object store."""
    from fsspec.implementations.local import LocalFileSystem

    kind = LocalBackend if isinstance(fs, LocalFileSystem) else ObjectBackend
    return kind(url, fs, root)


def atomic_write(path: str, data: bytes, private: bool = False) -> None:
    """Write ``path`` whole: a new file under a name no one can foresee (a link planted at
    a predictable one would take the write elsewhere), never through a link, then renamed
    over ``path`` (which replaces a link there, never writes through it)."""
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(6)}"
    try:
        if private:
            with _private_file(tmp) as fh:
                fh.write(data)
        else:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _private_file(path: str) -> Any:
    """A new file open for writing, 0600 whatever the umask (never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "wb")


def _writer_alive(name: str) -> bool:
    """Whether the process that names a temporary (``X.tmp-PID-...``) still runs here (a
    runner that lost the fence may still be finishing a write: leave it its file)."""
    try:
        pid = int(name.rsplit(".tmp-", 1)[1].split("-", 1)[0])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
