"""What vouches for a run store: the key (never kept in the store) and the seal.

Whoever can write a run store's bucket must neither run code in the pod nor change a
run's result without the resume refusing (docs/DESIGN.md, "Threat model"). So every
object the runner trusts on resume carries an HMAC-SHA256 ``mac`` made with a key the
store never holds, over the object's content *and its place*: the run id and the
object's name (cell index and attempt, snapshot, manifest number). A valid object of
another run, another cell or an older attempt therefore fails where it is copied to.

Where the key comes from, first match wins:

``SPOTBOOK_SNAPSHOT_KEY``
    the key itself (any string; ``openssl rand -hex 32`` makes a good one);
``SPOTBOOK_SNAPSHOT_KEY_FILE``
    a file holding it: ``spotbook submit`` mounts its Kubernetes Secret there;
the per-user key file
    ``$SPOTBOOK_CONFIG_DIR/key``, else ``$XDG_CONFIG_HOME/spotbook/key``, else
    ``~/.config/spotbook/key``: created 0600 on first use, refused when others can
    read it.

The key is never used as it is: seals are made with a key derived from it by scrypt
(once per process), and a run records the derived key's id (an HMAC of a fixed text), so
a resume with another key says so instead of calling every object tampered. Someone who
reads the store and tries to guess a weak key from that id, or from any sealed object,
pays a scrypt derivation per guess. Runs sealed before (``format`` 1 in run.json) were
sealed with the key itself, and are checked that way to their end.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import posixpath
import re
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._errors import StoreIntegrityError, UsageError

log = logging.getLogger(__name__)

KEY_ENV = "SPOTBOOK_SNAPSHOT_KEY"
KEY_FILE_ENV = "SPOTBOOK_SNAPSHOT_KEY_FILE"
CONFIG_ENV = "SPOTBOOK_CONFIG_DIR"
# 1: HMAC with the key itself (spotbook before issue 31's last step); 2: with a key
# derived by scrypt. A store keeps the format it was made with.
SEAL_FORMAT = 2
SEAL_FORMATS = (1, 2)
_DOMAIN = b"spotbook-seal-1\0"
# scrypt's cost: 16 MiB and about 0.05 s of one core per derivation (once per process),
# against a microsecond for an HMAC: bench/bench_key_guess.py measures both
_KDF_SALT, _KDF_N, _KDF_R = b"spotbook-seal-2", 1 << 14, 8


@functools.lru_cache(maxsize=8)
def derive_key(secret: bytes) -> bytes:
    """The key seals of format 2 are made with: scrypt of the run key."""
    return hashlib.scrypt(
        secret, salt=_KDF_SALT, n=_KDF_N, r=_KDF_R, p=1, maxmem=32 << 20, dklen=32
    )


def config_dir() -> str:
    """The user's spotbook configuration directory (the key is there)."""
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "spotbook")


@dataclass(frozen=True)
class Key:
    """A run key and where it came from."""

    secret: bytes
    source: str  # where it came from, for messages (never the key itself)

    def mac_key(self, fmt: int = SEAL_FORMAT) -> bytes:
        """What seals of format ``fmt`` are made with (1: the key itself; 2: derived)."""
        return self.secret if fmt == 1 else derive_key(self.secret)

    def id_for(self, fmt: int) -> str:
        """The id a run sealed in format ``fmt`` records for this key."""
        return hmac.new(self.mac_key(fmt), b"spotbook key id", hashlib.sha256).hexdigest()[:16]

    @property
    def id(self) -> str:
        return self.id_for(SEAL_FORMAT)


_MAX_KEY = 64 << 10  # a key file holds a key: a few dozen bytes, never a stream
# A key is guessed from the key id every run.json carries unless it is long: a 3-letter
# key falls at once. 32 characters is 128 bits as hex (`openssl rand -hex 32` gives 64).
MIN_KEY = 32


def _bounded_key(data: bytes, path: str) -> bytes:
    if len(data) > _MAX_KEY:  # /dev/zero, a log file: read no further
        raise UsageError(f"the key file {path!r} is larger than 64 KiB: it holds no key")
    return data.strip()


def _strong(key: Key) -> Key:
    if len(key.secret) < MIN_KEY:
        raise UsageError(
            f"the run key from {key.source} has {len(key.secret)} characters; a key needs at "
            f"least {MIN_KEY}, or it can be guessed from the key id in run.json (make one "
            "with `openssl rand -hex 32`)"
        )
    return key


def _key_file(path: str) -> bytes:
    """A key file's bytes: a plain file that only its owner can change, read up to a bound
    (a FIFO would hold the reader forever, a device never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise UsageError(
            f"${KEY_FILE_ENV} names {path!r}, which cannot be read ({exc.strerror}); "
            "mount the run key's Secret there or unset the variable"
        ) from exc
    mode = os.fstat(fd).st_mode  # (before a file object: a directory cannot be one)
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UsageError(
            f"the key file {path!r} (${KEY_FILE_ENV}) is not a plain file (a directory, "
            "FIFO, socket or device): it holds no key"
        )
    with os.fdopen(fd, "rb") as fh:
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UsageError(
                f"the key file {path!r} (${KEY_FILE_ENV}) can be changed by other users "
                f"(mode {stat.S_IMODE(mode):o}); make it writable by its owner only "
                f"(`chmod go-w {path}`)"
            )
        return _bounded_key(fh.read(_MAX_KEY + 1), path)


def load_key(create: bool = True) -> Key:
    """The key this process signs and checks with (see the module's docstring)."""
    value = os.environ.get(KEY_ENV, "").strip()
    if value:
        return _strong(Key(value.encode(), f"${KEY_ENV}"))
    path = os.environ.get(KEY_FILE_ENV)
    if path:
        data = _key_file(path)
        if not data:
            raise UsageError(f"the key file {path!r} (${KEY_FILE_ENV}) is empty")
        return _strong(Key(data, f"{path} (${KEY_FILE_ENV})"))
    return _strong(_user_key(os.path.join(config_dir(), "key"), create))


def _user_key(path: str, create: bool) -> Key:
    try:
        # (not blocking: a FIFO put there would hold the reader forever)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        if not create:
            raise UsageError(
                f"no spotbook key at {path}; set {KEY_ENV} or {KEY_FILE_ENV} to the key "
                "the run was created with"
            ) from None
        return _create_user_key(path)
    except OSError as exc:
        raise UsageError(f"cannot read the spotbook key {path} ({exc.strerror})") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(
            f"the spotbook key {path} is not a plain file (a directory, FIFO, socket or "
            "device): it holds no key; remove it to make a new one"
        )
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(
                f"the spotbook key {path} can be read by other users (mode "
                f"{stat.S_IMODE(mode):o}); make it private with `chmod 600 {path}`"
            )
        data = _bounded_key(fh.read(_MAX_KEY + 1), path)
    if not data:
        raise UsageError(f"the spotbook key {path} is empty; delete it to make a new one")
    return Key(data, path)


def _create_user_key(path: str) -> Key:
    directory = os.path.dirname(path)
    make_private_dirs(directory)
    # written whole under a name of its own, then linked into place: a process starting at
    # the same moment (a sweep's first points) never reads a key half written
    tmp = os.path.join(directory, f".key-{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(secrets.token_hex(32).encode())
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process made it first: use theirs
            return _user_key(path, create=False)
    finally:
        os.unlink(tmp)
    log.info("created the spotbook key %s (keep it private; runs are checked with it)", path)
    return _user_key(path, create=False)


# -- trust in one store made before the seal -------------------------------------------
# `spotbook trust RUN` writes one entry per store into the user's configuration folder
# (never into a store, never into a pod): a store from before the seal resumes on this
# machine only where its own location was trusted, by this user, by that command.
def _trust_path(url: str) -> str:
    name = hashlib.sha256(url.encode()).hexdigest()[:32]
    return os.path.join(config_dir(), "trusted", f"{name}.json")


def is_trusted(url: str) -> bool:
    """Whether this user trusted the store at ``url`` with ``spotbook trust``: an entry
    for exactly that location, a plain file only its owner can change."""
    path = _trust_path(url)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            return False
        try:
            entry = json.loads(fh.read(4096))
        except ValueError:
            return False
    return isinstance(entry, dict) and entry.get("url") == url


def trust(url: str) -> str:
    """Trust the store at ``url`` (made before the seal) on this machine; the entry's path."""
    import time

    path = _trust_path(url)
    make_private_dirs(os.path.dirname(path))
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({"url": url, "trusted": time.time()}, fh)
    os.replace(tmp, path)
    return path


def untrust(url: str) -> bool:
    """Take the trust in ``url`` back; whether there was any."""
    try:
        os.unlink(_trust_path(url))
        return True
    except FileNotFoundError:
        return False


def copy_checked(src: str, dst: str, check: Callable[[int], None]) -> None:
    """Copy ``src`` to the new file ``dst`` once ``check`` (given ``src`` open, never
    waited on: a FIFO there opens at once) has not raised; the kernel copies the bytes
    (``sendfile``: none through this process). A link at ``src`` is refused (OSError)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(src, flags)
    try:
        check(fd)  # a FIFO, device or directory is the check's to refuse
        os.set_blocking(fd, True)
        size = os.fstat(fd).st_size
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            sent = 0
            while sent < size:
                n = os.sendfile(out, fd, sent, size - sent)
                if n == 0:
                    raise OSError(0, f"{src} ended early")
                sent += n
        finally:
            os.close(out)
    finally:
        os.close(fd)


def make_private_dirs(path: str) -> None:
    """``os.makedirs`` whose new directories are 0700 whatever the umask.

    ``kernel/pickling.py`` has its own copy: code in the user's kernel imports nothing of
    spotbook's host side, and the host does not load the kernel package (cloudpickle).
    """
    path = os.path.abspath(path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            continue
        os.chmod(p, 0o700)


def canonical_text(doc: dict[str, Any]) -> str:
    """What a mac covers: the document without its ``mac``, keys sorted, compact."""
    body = {k: v for k, v in doc.items() if k != "mac"} if "mac" in doc else doc
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical(doc: dict[str, Any]) -> bytes:
    """``canonical_text`` as bytes: what a mac covers."""
    return canonical_text(doc).encode()


def sha256_hex(data: bytes) -> str:
    """The hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


class Seal:
    """Signs and checks one run's objects, each bound to the run and its place."""

    legacy = False

    def __init__(self, key: Key, run_id: str, url: str, fmt: int = SEAL_FORMAT) -> None:
        self.key = key
        self.run_id = run_id
        self.url = url
        self.format = fmt
        self._secret = key.mac_key(fmt)
        self._prefix = _DOMAIN + run_id.encode() + b"\0"

    @property
    def key_id(self) -> str:
        """The key's id as this seal's format records it."""
        return self.key.id_for(self.format)

    def mac(self, place: str, doc: dict[str, Any]) -> str:
        return self._mac_of(place, canonical(doc))

    def _mac_of(self, place: str, canon: bytes) -> str:
        msg = self._prefix + place.encode() + b"\0" + canon
        return hmac.new(self._secret, msg, hashlib.sha256).hexdigest()

    def sign(self, place: str, doc: dict[str, Any]) -> dict[str, Any]:
        return {**doc, "mac": self.mac(place, doc)}

    def signed_line(self, place: str, doc: dict[str, Any]) -> str | None:
        """``doc`` signed, as one compact JSON line, encoded once: its canonical text
        with the ``mac`` appended (a reader parses it and checks the mac over the
        canonical text of the rest, which is this text again). None where this seal
        does not sign this way."""
        text = canonical_text(doc)
        if "mac" in doc or not text.endswith("}") or text == "{}":
            return None
        return f'{text[:-1]},"mac":"{self._mac_of(place, text.encode())}"}}\n'

    def check(self, place: str, doc: Any) -> dict[str, Any]:
        """``doc`` if its mac is right for this run and ``place``; else refuse."""
        mac = doc.get("mac") if isinstance(doc, dict) else None
        if not isinstance(mac, str) or not hmac.compare_digest(mac, self.mac(place, doc)):
            raise self.refuse(place, "failed its integrity check (HMAC)")
        assert isinstance(doc, dict)
        return doc

    def refuse(self, place: str, why: str) -> StoreIntegrityError:
        return StoreIntegrityError(
            f"{self.url}/{place} {why}; it was not used. The run store was changed by "
            "someone without this run's key, or an object was moved from another run, "
            "cell or attempt. Inspect the store; to discard its progress and start over "
            "run `spotbook run NOTEBOOK --run-dir ... --restart`"
        )


class LegacySeal(Seal):
    """A store made by spotbook 0.x before the seal: its key is an object in the store.

    Anyone who can write the store can also sign with that key, so nothing here is
    authenticated; snapshot manifests are checked as that version did (accidents only).
    """

    legacy = True

    def __init__(self, store_key: bytes, run_id: str, url: str) -> None:
        super().__init__(Key(store_key, "the store's own key object"), run_id, url, fmt=1)

    def _old_mac(self, doc: dict[str, Any]) -> str:
        body = {k: v for k, v in doc.items() if k not in ("mac", "name")}
        canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        return hmac.new(self.key.secret, canon, hashlib.sha256).hexdigest()

    def signed_line(self, place: str, doc: dict[str, Any]) -> str | None:
        return None

    def sign(self, place: str, doc: dict[str, Any]) -> dict[str, Any]:
        if place.startswith("state/snap/"):
            return {**doc, "mac": self._old_mac(doc)}
        return doc

    def check(self, place: str, doc: Any) -> dict[str, Any]:
        if not isinstance(doc, dict):
            raise self.refuse(place, "is not a JSON object")
        if place.startswith("state/snap/") and doc.get("mac") != self._old_mac(doc):
            raise self.refuse(place, "failed its integrity check (HMAC)")
        return doc


# -- paths read from a store are data ------------------------------------------------
_DRIVE = re.compile(r"^[A-Za-z]:")


def safe_relpath(rel: Any, what: str) -> str:
    """``rel`` as a normalised relative path that stays inside its directory, or refuse.

    Absolute paths, ``..``, drive letters, backslashes, empty and control characters
    are refused: a path in a manifest names a file, it never chooses where one goes.
    """
    ok = isinstance(rel, str) and rel and "\\" not in rel and not _DRIVE.match(rel)
    if ok:
        ok = not any(ord(ch) < 32 for ch in rel) and not rel.startswith("/")
    if ok:
        parts = rel.split("/")
        ok = all(p not in ("", ".", "..") for p in parts)
    if not ok:
        raise StoreIntegrityError(
            f"{what} names the path {rel!r}, which is not a plain relative path inside its "
            "directory; it was refused before anything was written"
        )
    assert isinstance(rel, str)
    return posixpath.normpath(rel)


def inside(base: str, rel: str) -> str:
    """The local path of ``rel`` under ``base``; refuse one that leaves it (symlinks)."""
    target = os.path.join(base, *rel.split("/"))
    real_base = os.path.realpath(base)
    real_parent = os.path.realpath(os.path.dirname(target))
    if os.path.commonpath([real_base, real_parent]) != real_base or os.path.islink(target):
        raise StoreIntegrityError(
            f"{rel!r} would be written through a symbolic link that leaves {base}; refused"
        )
    return target
