"""Code that runs inside the kernel: snapshot and restore of the user namespace.

The runner calls these through ``user_expressions`` of a silent execute request,
so nothing is added to the user's namespace or history. Each variable is pickled
on its own (cloudpickle, protocol 5) into a content-addressed blob; what cannot
be pickled, or does not load back, is listed so the runner replays the cells
that made it. Functions defined in the notebook are pickled without their
globals and re-bound to the live namespace on restore, so they see later
changes to globals as they would have in the original kernel, and a large
array a function refers to is not stored a second time.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import importlib
import json
import pickle
import sys
import time
import types
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import cloudpickle

from ._store import RunStore

_VERIFY_BELOW = 1 << 20  # round-trip small pickles to catch ones that "lie"
_written: set[str] = set()  # blobs this kernel knows are in the store
_chunked: dict[str, list[str]] = {}  # whole-pickle sha256 -> its chunks' (object stores)
_CHUNK = 32 << 20  # object stores: pickles larger than this are stored in chunks
_UPLOADERS = 8  # object stores: concurrent blob transfers
# name -> (content fingerprint, manifest entry) of plain buffers in the last snapshot
_known: dict[str, tuple[str, dict[str, Any]]] = {}
_SKIP = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})


def _shell() -> Any:
    from IPython import get_ipython  # the kernel always has IPython

    return get_ipython()


def _with_globals(func: types.FunctionType, glb: dict[str, Any]) -> types.FunctionType:
    """A copy of ``func`` that looks its globals up in ``glb``."""
    new = types.FunctionType(func.__code__, glb, func.__name__, func.__defaults__, func.__closure__)
    new.__kwdefaults__ = func.__kwdefaults__
    new.__qualname__ = func.__qualname__
    new.__doc__ = func.__doc__
    new.__dict__.update(func.__dict__)
    new.__annotations__ = func.__annotations__
    new.__module__ = func.__module__
    return new


def _rebind_main(func: types.FunctionType) -> types.FunctionType:
    """Give a restored notebook function the live namespace as its globals."""
    return _with_globals(func, _shell().user_global_ns)


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    def __init__(self, file: Any, user_globals: dict[str, Any]) -> None:
        super().__init__(file, protocol=5)
        self._user_globals = user_globals

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.FunctionType and obj.__globals__ is self._user_globals:
            bare = _with_globals(obj, {"__builtins__": builtins, "__name__": "__main__"})
            return (_rebind_main, (bare,))
        return super().reducer_override(obj)


def _dumps(obj: Any, user_globals: dict[str, Any]) -> bytes:
    import io

    buf = io.BytesIO()
    _Pickler(buf, user_globals).dump(obj)
    return buf.getvalue()


def _user_vars(shell: Any) -> dict[str, Any]:
    hidden = shell.user_ns_hidden
    out = {}
    for name, value in shell.user_ns.items():
        if name.startswith("_") or name in _SKIP:
            continue
        if name in hidden and hidden[name] is value:
            continue
        out[name] = value
    return out


def _fingerprint(value: Any) -> str | None:
    """Content hash of a plain buffer (numpy ndarray without objects, bytes).

    Hashing runs at about 2 GB/s, several times cheaper than pickling and writing:
    an unchanged large array is then neither pickled nor written again.
    """
    kind = type(value)
    if kind not in (bytes, bytearray) and (kind.__module__, kind.__qualname__) != (
        "numpy",
        "ndarray",
    ):
        return None
    try:
        view = memoryview(value)
    except (TypeError, ValueError):  # object arrays and the like
        return None
    if not view.c_contiguous:
        return None
    digest = hashlib.sha256(view.cast("B"))
    digest.update(repr((kind.__qualname__, str(getattr(value, "dtype", "")), view.shape)).encode())
    return digest.hexdigest()


def state_bytes() -> int:
    """Rough size of the user namespace, to estimate a first snapshot's cost."""
    total = 0
    for value in _user_vars(_shell()).values():
        nbytes = getattr(value, "nbytes", None)
        total += nbytes if isinstance(nbytes, int) else sys.getsizeof(value, 0)
    return total


def _put(store: RunStore, digest: str, data: bytes) -> int:
    path = store.blob_path(digest)
    if store.exists(path):
        return 0
    store.write(path, data)
    return len(data)


def snapshot(url: str) -> str:
    """Write every user variable's blob to the store; return the manifest as JSON.

    On object stores, pickles over ``_CHUNK`` bytes are stored as content-addressed
    chunks, and blobs are uploaded by a few threads while the next variable is
    pickled: one stream per object is far below what a bucket takes in parallel.
    """
    started = time.perf_counter()
    shell = _shell()
    store = RunStore(url)
    entries: dict[str, dict[str, Any]] = {}
    seen: dict[int, str] = {}
    written = 0
    pool = None if store.local else ThreadPoolExecutor(_UPLOADERS)
    pending: list[Future[int]] = []
    new: list[str] = []
    try:
        for name, value in _user_vars(shell).items():
            if id(value) in seen:
                entries[name] = {"kind": "alias", "of": seen[id(value)]}
                continue
            seen[id(value)] = name
            if isinstance(value, types.ModuleType):
                entries[name] = {"kind": "module", "module": value.__name__}
                continue
            fingerprint = _fingerprint(value)
            known = _known.get(name)
            if fingerprint and known and known[0] == fingerprint and known[1]["sha256"] in _written:
                entries[name] = known[1]
                continue
            try:
                data = _dumps(value, shell.user_global_ns)
                if len(data) < _VERIFY_BELOW:
                    cloudpickle.loads(data)
            except Exception as exc:  # pickling can raise anything; the variable is replayed
                entries[name] = {
                    "kind": "unserialisable",
                    "type": type(value).__qualname__,
                    "error": f"{type(exc).__name__}: {exc}"[:300],
                }
                continue
            digest = hashlib.sha256(data).hexdigest()
            entry: dict[str, Any] = {"kind": "blob", "sha256": digest, "size": len(data)}
            if digest in _chunked:
                entry["chunks"] = _chunked[digest]
            elif digest not in _written:
                new.append(digest)
                if pool is None:
                    written += _put(store, digest, data)
                elif len(data) > _CHUNK:
                    chunks = []
                    for offset in range(0, len(data), _CHUNK):
                        piece = data[offset : offset + _CHUNK]
                        chunks.append(hashlib.sha256(piece).hexdigest())
                        pending.append(pool.submit(_put, store, chunks[-1], piece))
                    entry["chunks"] = _chunked[digest] = chunks
                else:
                    pending.append(pool.submit(_put, store, digest, data))
            entries[name] = entry
            if fingerprint:
                _known[name] = (fingerprint, entry)
        written += sum(f.result() for f in pending)  # an upload that failed raises here
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    _written.update(new)
    return json.dumps(
        {
            "vars": entries,
            "written": written,
            "state_bytes": state_bytes(),
            "seconds": time.perf_counter() - started,
        }
    )


def sign(key: bytes, variables: dict[str, Any]) -> str:
    """HMAC over a manifest's variables (the blobs are bound by their sha256)."""
    canon = json.dumps(variables, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canon, hashlib.sha256).hexdigest()


def restore(url: str, manifest_json: str, key: str, only: list[str] | None = None) -> str:
    """Verify and load a snapshot into the namespace; return what failed as JSON."""
    started = time.perf_counter()
    manifest = json.loads(manifest_json)
    variables = manifest["vars"]
    if not hmac.compare_digest(sign(key.encode(), variables), manifest.get("mac", "")):
        return json.dumps({"integrity": "manifest signature does not match the run's key"})
    shell = _shell()
    store = RunStore(url)
    ns = shell.user_ns
    failed: dict[str, str] = {}
    loaded = 0
    wanted = set(only) if only is not None else set(variables)
    # Fetch every blob (or chunk) up front, several at a time on object stores;
    # unpickle one by one as they arrive.
    pool = ThreadPoolExecutor(1 if store.local else _UPLOADERS)
    fetches: dict[str, list[Future[bytes | None]]] = {}
    for name, entry in variables.items():
        if name in wanted and entry["kind"] == "blob":
            parts = entry.get("chunks") or [entry["sha256"]]
            fetches[name] = [pool.submit(store.read, store.blob_path(d)) for d in parts]
    try:
        return _restore_into(ns, variables, wanted, fetches, failed, started, loaded)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _restore_into(
    ns: dict[str, Any],
    variables: dict[str, Any],
    wanted: set[str],
    fetches: dict[str, list[Future[bytes | None]]],
    failed: dict[str, str],
    started: float,
    loaded: int,
) -> str:
    for name, entry in variables.items():
        if name not in wanted or entry["kind"] == "alias":
            continue
        try:
            if entry["kind"] == "module":
                ns[name] = importlib.import_module(entry["module"])
            elif entry["kind"] == "blob":
                parts = [f.result() for f in fetches[name]]
                present = [p for p in parts if p is not None]
                if len(present) < len(parts):
                    failed[name] = "blob missing from the run store"
                    continue
                data = present[0] if len(present) == 1 else b"".join(present)
                if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    return json.dumps({"integrity": f"blob of {name!r} does not match its hash"})
                ns[name] = pickle.loads(data)
                loaded += len(data)
                _written.add(entry["sha256"])
                if "chunks" in entry:
                    _chunked[entry["sha256"]] = entry["chunks"]
            else:
                failed[name] = entry.get("error", "not serialisable")
        except Exception as exc:  # a pickle that "lies": replay the cells that made it
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    for name, entry in variables.items():
        if entry["kind"] == "alias" and name in wanted:
            if entry["of"] in ns and entry["of"] not in failed:
                ns[name] = ns[entry["of"]]
            else:
                failed[name] = f"alias of {entry['of']!r}, which was not restored"
    return json.dumps({"failed": failed, "bytes": loaded, "seconds": time.perf_counter() - started})


def set_execution_count(n: int) -> None:
    """Continue the kernel's In[] numbering where the interrupted run left off."""
    _shell().execution_count = n


def accelerators() -> str:
    """Devices the notebook's ML frameworks see, for those it has imported.

    Only frameworks already in ``sys.modules`` are asked: importing one just to look
    would cost seconds and, for some, GPU memory the notebook wanted.
    """
    found: dict[str, Any] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            cuda = torch.cuda.is_available()
            found["torch"] = {
                "version": str(torch.__version__),
                "cuda": bool(cuda),
                "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                if cuda
                else [],
            }
        except Exception as exc:  # a broken CUDA setup must not fail the run
            found["torch"] = {"error": str(exc)}
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(tf, "config"):
        try:
            found["tensorflow"] = {
                "version": str(tf.__version__),
                "devices": [d.name for d in tf.config.list_physical_devices("GPU")],
            }
        except Exception as exc:
            found["tensorflow"] = {"error": str(exc)}
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "devices"):
        try:
            found["jax"] = {
                "version": str(jax.__version__),
                "devices": [f"{d.platform}:{d.device_kind}" for d in jax.devices()],
            }
        except Exception as exc:
            found["jax"] = {"error": str(exc)}
    return json.dumps(found)
