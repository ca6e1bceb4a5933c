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
from typing import Any

import cloudpickle

from ._store import RunStore

_VERIFY_BELOW = 1 << 20  # round-trip small pickles to catch ones that "lie"
_written: set[str] = set()  # blobs this kernel knows are in the store
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


def snapshot(url: str) -> str:
    """Write every user variable's blob to the store; return the manifest as JSON."""
    started = time.perf_counter()
    shell = _shell()
    store = RunStore(url)
    entries: dict[str, dict[str, Any]] = {}
    seen: dict[int, str] = {}
    written = 0
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
        if digest not in _written:
            path = store.blob_path(digest)
            if not store.exists(path):
                store.write(path, data)
                written += len(data)
            _written.add(digest)
        entries[name] = {"kind": "blob", "sha256": digest, "size": len(data)}
        if fingerprint:
            _known[name] = (fingerprint, entries[name])
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
    for name, entry in variables.items():
        if name not in wanted or entry["kind"] == "alias":
            continue
        try:
            if entry["kind"] == "module":
                ns[name] = importlib.import_module(entry["module"])
            elif entry["kind"] == "blob":
                data = store.read(store.blob_path(entry["sha256"]))
                if data is None:
                    failed[name] = "blob missing from the run store"
                    continue
                if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    return json.dumps({"integrity": f"blob of {name!r} does not match its hash"})
                ns[name] = pickle.loads(data)
                loaded += len(data)
                _written.add(entry["sha256"])
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
