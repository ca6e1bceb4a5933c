"""The notebook's variables as one pickle stream, and reducers for handles.

One stream with one memo for the whole namespace keeps shared references: a list
held by two variables, or by a variable and a dict, comes back as one list. Each
variable is its own segment of the stream; a variable that fails to pickle is
cut out (its bytes, its out-of-band buffers and its memo entries) and listed, so
the others are still saved. Large buffers (numpy arrays, bytes, bytearrays) go
out of band (pickle protocol 5) into content-addressed blob files, so an
unchanged array is hashed but never written twice.

Reducers capture what plain pickling cannot, so it needs no replay:

- open files: path, mode, position and encoding; a file opened for writing is
  reopened without truncation at its position, and cut back to the size it had
  at the snapshot (what was written after the snapshot is written again by the
  cells that run again);
- SQLite connections: ``:memory:`` databases through ``serialize()``, file
  databases by path;
- locks (held or not), and so the events, conditions, semaphores and queues built
  on them;
- ``sys.stdout``/``sys.stderr`` (a logging handler writing to them, say);
- numpy views of an array that is saved too: a view again, not a copy;
- torch's CPU storages: their memory as an out-of-band buffer (torch's own reducer
  copies it through ``torch.save`` into bytes), one per storage, so tensors that share
  one (a view, a parameter and its ``.data``) share it again when loaded; a CUDA
  storage likewise, its bytes copied to the host (in a staged snapshot, asynchronously
  into pinned memory, and not at all when its tensor's counter says it is unchanged)
  and back to its device when loaded;
- functions defined in the notebook: re-bound to the live namespace.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import importlib
import io
import mmap
import os
import pickle
import pickletools
import random
import sqlite3
import stat
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle

OUT_OF_BAND = 64 * 1024  # buffers at least this large are stored as their own blobs
_LOCK_TYPE = type(threading.Lock())
_RLOCK_TYPE = type(threading.RLock())
_FILE_TYPES = (io.TextIOWrapper, io.BufferedReader, io.BufferedWriter, io.BufferedRandom, io.FileIO)
_WRITING = set("wax+")


# -- what a reducer's restore side calls --------------------------------------------
def _shell() -> Any:
    from IPython import get_ipython  # the kernel always has IPython

    return get_ipython()


def with_globals(func: types.FunctionType, glb: dict[str, Any]) -> types.FunctionType:
    """A copy of ``func`` that looks its globals up in ``glb``."""
    new = types.FunctionType(func.__code__, glb, func.__name__, func.__defaults__, func.__closure__)
    new.__kwdefaults__ = func.__kwdefaults__
    new.__qualname__ = func.__qualname__
    new.__doc__ = func.__doc__
    new.__dict__.update(func.__dict__)
    new.__annotations__ = func.__annotations__
    new.__module__ = func.__module__
    return new


def rebind_main(func: types.FunctionType) -> types.FunctionType:
    """Give a restored notebook function the live namespace as its globals."""
    return with_globals(func, _shell().user_global_ns)


def std_stream(name: str) -> Any:
    """``sys.stdout`` or ``sys.stderr`` as the restoring kernel has them."""
    return getattr(sys, name)


# set once the notebook holds a file open for writing (opened by a cell, or reopened by a
# restore): before the kernel forks for a snapshot, such files are flushed
WRITING_FILES: list[bool] = []
# set while a snapshot checks that a segment loads back: reconstructors that touch the
# world (files, databases) then make nothing
CHECKING = {"on": False}


def reopen(
    path: str,
    mode: str,
    position: int,
    size: int,
    text: dict[str, Any] | None,
    closed: bool,
) -> Any:
    """An open file as it was at the snapshot (see the module docstring)."""
    if CHECKING["on"]:
        return None  # a load check: nothing on disk is touched
    writing = bool(_WRITING & set(mode))
    if closed:
        how = ("r", text or {}) if text is not None else ("rb", {})
        try:  # closed at once: only its type and name matter
            handle = open(path, how[0], **how[1])  # noqa: SIM115
        except OSError:
            handle = open(os.devnull, how[0], **how[1])  # noqa: SIM115
        handle.close()
        return handle
    if writing:
        # The file must be there as the snapshot left it (a new node gets it back before
        # the kernel starts): a handle is never recreated on an empty or a shorter file,
        # which would pad what it writes next with NUL bytes. Missing or cut short, the
        # handle is not restored, and the cells that made it are replayed (or named).
        try:
            found = os.stat(path).st_size
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}, which this handle writes, is not here") from None
        if found < size:
            raise OSError(f"{path} has {found} bytes, fewer than the {size} at the snapshot")
        WRITING_FILES.append(True)
        flags = os.O_RDWR if "+" in mode else os.O_WRONLY
        if "a" in mode:
            flags |= os.O_APPEND
        fd = os.open(path, flags, 0o666)  # never O_TRUNC: what it wrote stays
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)  # written after the snapshot: the cells that wrote it run again
        handle = open(fd, mode, **(text or {}))  # noqa: SIM115
    else:
        handle = open(path, mode, **(text or {}))  # noqa: SIM115
    if position and "a" not in mode:
        handle.seek(position)
    return handle


def restore_sqlite(path: str, image: bytes | None, isolation_level: Any) -> Any:
    """A SQLite connection rebuilt from its saved database image."""
    if CHECKING["on"]:
        return None  # a load check: nothing on disk is touched
    if image is None:
        if not os.path.isfile(path):  # never a new empty database in its place
            raise FileNotFoundError(f"{path}, the SQLite database it connects to, is not here")
        return sqlite3.connect(path, isolation_level=isolation_level)
    # Copied into a plain in-memory database: a deserialized one is a different kind
    # (it reports a file name, and serialises without its open transaction's rows).
    loaded = sqlite3.connect(":memory:")
    loaded.deserialize(image)
    con = sqlite3.connect(":memory:", isolation_level=isolation_level)
    loaded.backup(con)
    loaded.close()
    return con


def new_lock(held: bool) -> Any:
    """A ``threading.Lock`` as it was saved: held or not."""
    lock = threading.Lock()
    if held:
        lock.acquire()
    return lock


def new_rlock() -> Any:
    """A new ``threading.RLock`` (a saved one is rebuilt free)."""
    return threading.RLock()


def with_grad(rebuild: Callable[..., Any], args: tuple[Any, ...], grad: Any) -> Any:
    """A torch tensor rebuilt by torch's own reducer, with the gradient plain pickling
    drops (an optimizer's next step needs it)."""
    tensor = rebuild(*args)
    tensor.grad = grad
    return tensor


def untyped_storage(buffer: Any) -> Any:
    """A torch CPU storage over a saved buffer's memory (a blob's private mapping, as
    numpy arrays are rebuilt on it: pages are copied only when written)."""
    torch = sys.modules.get("torch") or __import__("torch")
    view = memoryview(buffer).cast("B")
    if not view.nbytes:
        return torch.UntypedStorage(0)
    if view.readonly:  # an in-band buffer came back as bytes: torch wants to own a copy
        view = memoryview(bytearray(view))
    return torch.frombuffer(view, dtype=torch.uint8).untyped_storage()


def device_storage(buffer: Any, device: str) -> Any:
    """A torch storage on a GPU again (``device``, as ``cuda:0``): its saved bytes, as for
    a CPU storage, copied to the device. Without that device this fails, as torch's own
    reducer does, and the variable is replayed."""
    return untyped_storage(buffer).to(device=device)


def typed_storage(untyped: Any, dtype: Any) -> Any:
    """The typed storage torch's tensor reducer hands its rebuild function."""
    torch = sys.modules["torch"]
    return torch.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


def numpy_array(buffer: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    """A numpy array again, over its bytes (as numpy's own reducer rebuilds one). The
    library is the one whose object this is (imported by name, as a pickle's own
    reference to it would): the kernel side depends on none."""
    numpy = importlib.import_module("numpy")
    return numpy.frombuffer(buffer, dtype=dtype).reshape(shape)


def polars_frame(columns: list[Any]) -> Any:
    """A polars DataFrame again, from its columns in order (see ``_polars``)."""
    polars = importlib.import_module("polars")
    return polars.DataFrame([polars_series(*c) if isinstance(c, tuple) else c for c in columns])


def polars_series(name: str, buffer: Any, dtype: str) -> Any:
    """A polars Series of a plain numeric column, from its values' bytes."""
    values = importlib.import_module("numpy").frombuffer(buffer, dtype=dtype)
    return importlib.import_module("polars").Series(name, values)


def figure_again(
    kind: type, data: list[Any], layout: Any, frames: list[Any], grid: tuple[Any, Any]
) -> Any:
    """A plotly figure from its traces, layout and frames, each pickled as plotly pickles
    them (their numpy arrays stay arrays)."""
    figure = kind(data=data, layout=layout, frames=frames)
    figure._grid_str, figure._grid_ref = grid
    return figure


def _plotly_figure(kind: type) -> bool:
    return kind.__module__.startswith("plotly") and any(
        k.__name__ == "BaseFigure" and k.__module__ == "plotly.basedatatypes" for k in kind.__mro__
    )


def build_set(kind: type, items: list[Any], presize: bool = False) -> Any:
    """A set whose items were added in ``items``' order, into a table that grew item by
    item or (``presize``) was sized for them all first, as ``set.update`` and set
    literals size it (see :class:`SetInOrder`)."""
    source: Any = dict.fromkeys(items) if presize else items
    if kind is frozenset:
        return frozenset(source)
    out = kind()
    if presize:
        out.update(source)
    else:
        for item in items:
            out.add(item)
    return out


class SetInOrder:
    """A set to pickle with the insertion order that gives back its iteration order.

    A set's iteration order follows its table's slots, which depend on the order its
    items were added and on how its table grew; unpickling adds the items in iteration
    order to a growing table, which lands some in other slots. When another way is
    found that rebuilds the same iteration order (with the run's fixed hash seed), the
    set is saved with it.
    """

    def __init__(self, value: set[Any] | frozenset[Any], how: tuple[list[Any], bool]) -> None:
        self.kind = type(value)
        self.order, self.presize = how

    def __reduce__(self) -> Any:
        return build_set, (self.kind, self.order, self.presize)


def rebuild_order(
    value: set[Any] | frozenset[Any], tries: int = 64
) -> tuple[list[Any], bool] | None:
    """An insertion order and table sizing that rebuild ``value`` iterating as it does
    (``(iteration order, False)`` is what plain unpickling does), or None."""
    want = list(value)
    if len(want) > 100_000:
        return None
    shuffler = random.Random(len(want))  # its own generator, never the notebook's
    candidates: list[list[Any]] = [want, want[::-1]]
    for attempt in range(tries + 2):
        if attempt >= len(candidates):
            order = list(want)
            shuffler.shuffle(order)
            candidates.append(order)
        for presize in (False, True):
            if list(build_set(type(value), candidates[attempt], presize)) == want:
                return candidates[attempt], presize
    return None


def view_of(
    root: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any
) -> Any:
    """A numpy array over the memory of another restored array."""
    # only called for a snapshot that held numpy arrays: unpickling ``dtype`` imported numpy
    return sys.modules["numpy"].ndarray(
        shape, dtype=dtype, buffer=root, offset=offset, strides=strides
    )


# -- capture ------------------------------------------------------------------------
class Unsupported(Exception):
    """A value this pickler declines (its cells are replayed instead)."""


def _file_reduce(obj: Any) -> Any:
    raw = obj
    while hasattr(raw, "buffer") or hasattr(raw, "raw"):
        raw = getattr(raw, "buffer", None) or raw.raw
    name = getattr(raw, "name", None)
    if not isinstance(name, str | int):
        raise Unsupported("a file without a path")
    mode = getattr(obj, "mode", "") or getattr(raw, "mode", "")
    if isinstance(obj, io.TextIOWrapper) and "b" in mode:
        mode = mode.replace("b", "")
    if "b" not in mode and not isinstance(obj, io.TextIOWrapper):
        mode += "b"
    text = None
    if isinstance(obj, io.TextIOWrapper):
        text = {"encoding": obj.encoding, "errors": obj.errors}
    if obj.closed:
        path = name if isinstance(name, str) else os.devnull
        return reopen, (os.path.abspath(path), mode, 0, 0, text, True)
    fd = raw.fileno()
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")  # where it is now, whatever the cwd
    except OSError:
        if not isinstance(name, str):
            raise Unsupported("a file opened from a descriptor") from None
        path = os.path.abspath(name)
    if path.endswith(" (deleted)") or not os.path.isfile(path):
        raise Unsupported(f"{path} is not a regular file on disk")
    if any(c in mode for c in "wax+"):
        obj.flush()  # what it wrote so far is on disk, so its size is the snapshot's
    position = obj.tell()
    return reopen, (path, mode, position, os.fstat(fd).st_size, text, False)


def _sqlite_reduce(con: sqlite3.Connection) -> Any:
    try:
        rows = con.execute("PRAGMA database_list").fetchall()
    except sqlite3.ProgrammingError as exc:  # closed
        raise Unsupported(f"a closed SQLite connection ({exc})") from None
    main = next((r[2] for r in rows if r[1] == "main"), "")
    if main and os.path.isabs(main):  # a file on disk (in-memory ones have no path)
        return restore_sqlite, (main, None, con.isolation_level)
    return restore_sqlite, (":memory:", con.serialize(), con.isolation_level)


def _owner(obj: Any) -> Any:
    """The object at the end of an array's chain of bases (memoryviews included)."""
    base = obj
    while True:
        nxt = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
        if nxt is None:
            return base
        base = nxt


def array_roots(values: dict[str, Any]) -> dict[int, Any]:
    """For each memory owner behind the namespace's numpy arrays, the largest
    C-contiguous array over it: the array that views of that memory are saved as
    views of."""
    roots: dict[int, Any] = {}
    for value in values.values():
        if type(value).__name__ != "ndarray" or not value.flags.c_contiguous:
            continue
        if value.dtype.hasobject:
            continue
        key = id(_owner(value))
        if key not in roots or value.nbytes > roots[key].nbytes:
            roots[key] = value
    return roots


def _array_view(obj: Any, roots: dict[int, Any]) -> Any:
    """A numpy array over the memory of another saved array: (view_of, ...) or None."""
    root = roots.get(id(_owner(obj)))
    if root is None or root is obj or obj.dtype.hasobject:
        return None
    offset = obj.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    if obj.size == 0:
        return None
    # the whole extent must lie in the root, not only its start: a view of a larger
    # array than the root (the root a slice of it) is saved as an array of its own
    low = offset + sum(min(0, (n - 1) * st) for n, st in zip(obj.shape, obj.strides, strict=True))
    high = offset + sum(max(0, (n - 1) * st) for n, st in zip(obj.shape, obj.strides, strict=True))
    if low < 0 or high + obj.itemsize > root.nbytes:
        return None
    return view_of, (root, offset, obj.shape, obj.strides, obj.dtype)


def _torch_kind(kind: type, name: str) -> bool:
    return kind.__name__ == name and kind.__module__ in ("torch", "torch.storage")


def _memory_at(at: int, n: int) -> memoryview:
    """The ``n`` bytes at address ``at``, without a copy (valid while their owner lives)."""
    import ctypes

    return memoryview((ctypes.c_char * n).from_address(at)).cast("B")


def _storage_memory(storage: Any) -> memoryview:
    """A CPU storage's bytes, without a copy (valid while the storage lives)."""
    n = storage.nbytes()
    if not n:
        return memoryview(b"")
    return _memory_at(storage.data_ptr(), n)


_SAMPLES, _SAMPLE = 512, 128  # a numpy array's pieces hashed to tell a change: 64 KiB


def _sampled(at: int, n: int) -> bytes:
    """What stands for a numpy array's version counter (it has none): a hash of
    ``_SAMPLES`` pieces spread evenly over its ``n`` bytes at address ``at``, the first
    and the last among them. A change of the whole array, or of anything as large as the
    gaps between the pieces, moves it; a smaller one may not, and is caught when the
    writer hashes the array again (that snapshot dropped, the array copied from then on)."""
    whole = _memory_at(at, n)
    step = max(_SAMPLE, (n - _SAMPLE) // (_SAMPLES - 1))
    h = hashlib.blake2b(digest_size=16)
    for off in range(0, max(n - _SAMPLE, 0) + 1, step):
        h.update(whole[off : off + _SAMPLE])
    h.update(whole[max(n - _SAMPLE, 0) :])
    return h.digest()


def _change_token(tensor: Any) -> tuple[Any, ...] | None:
    """What says a CPU tensor's memory is unchanged since an earlier snapshot: the very
    tensor (by weak reference), its version counter (torch bumps it at every in-place
    change made through it or its views) and where its storage lies (and the storage,
    held while a snapshot still reads it). Writes through an
    alias that has a counter of its own (``.data``, ``.numpy()``) are not counted: a
    background snapshot hashes such a buffer again before it trusts it."""
    try:
        storage = tensor.untyped_storage()
        ptr, n = storage.data_ptr(), storage.nbytes()
        return (weakref.ref(tensor), tensor._version, ptr, n, storage)
    except Exception:  # inference tensors have no counter; some subclasses no weakref
        return None


class NamespacePickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle with spotbook's reducers and out-of-band buffers."""

    def __init__(
        self,
        file: Any,
        user_globals: dict[str, Any],
        on_buffer: Callable[[pickle.PickleBuffer], bool],
        array_roots: dict[int, Any],
        track: bool = False,
    ) -> None:
        super().__init__(file, protocol=5, buffer_callback=on_buffer)
        self.track = track  # numpy arrays with change tokens (staged snapshots)
        self.staging: StagedBlobs | None = None  # where a staged snapshot's GPU copies go
        self._user_globals = user_globals
        self._roots = array_roots
        self.types: set[type] = set()  # the types the segment being written reduces
        # torch: each CPU storage's change token (from the first tensor over it pickled)
        # and the buffers handed out for them, kept alive so ids are not reused
        self.tokens: dict[int, tuple[Any, tuple[Any, ...] | None]] = {}
        self.buffer_tokens: dict[int, tuple[Any, tuple[Any, ...] | None]] = {}
        self._std = {
            id(getattr(sys, n)): n
            for n in ("stdout", "stderr", "stdin", "__stdout__", "__stderr__", "__stdin__")
            if getattr(sys, n, None) is not None
        }

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is types.FunctionType and obj.__globals__ is self._user_globals:
            bare = with_globals(obj, {"__builtins__": builtins, "__name__": "__main__"})
            return rebind_main, (bare,)
        if id(obj) in self._std and obj is getattr(sys, self._std[id(obj)]):
            return std_stream, (self._std[id(obj)],)
        if kind in _FILE_TYPES:
            return _file_reduce(obj)
        if kind is _LOCK_TYPE:
            return new_lock, (obj.locked(),)
        if kind is _RLOCK_TYPE:
            if "count=0" not in repr(obj):
                raise Unsupported("an RLock that is held")
            return new_rlock, ()
        if kind is sqlite3.Connection:
            return _sqlite_reduce(obj)
        if kind is memoryview and obj.obj is not None and obj.c_contiguous:
            whole = memoryview(obj.obj)
            if (obj.format, obj.shape, obj.nbytes) == (whole.format, whole.shape, whole.nbytes):
                return memoryview, (obj.obj,)  # a view again, of the same (shared) object
        if kind.__module__.startswith("torch"):
            found = self._torch(obj, kind)
            if found is not None:
                return found
        if kind.__module__ in _POLARS and kind.__name__ in ("DataFrame", "Series"):
            found = self._polars(obj, kind)
            if found is not None:
                return found
        if (
            kind.__module__.startswith("torch")
            and getattr(obj, "grad", None) is not None
            and hasattr(obj, "requires_grad")
        ):
            reduced = obj.__reduce_ex__(5)
            if isinstance(reduced, tuple) and len(reduced) == 2:
                return with_grad, (reduced[0], reduced[1], obj.grad)
        if _plotly_figure(kind):
            # plotly pickles a figure as its JSON form: its arrays come back as base64
            # dicts ({'dtype': 'i1', 'bdata': ...}), so fig.data[0].y is no array
            grid = (obj._grid_str, obj._grid_ref)
            return figure_again, (kind, list(obj.data), obj.layout, list(obj.frames), grid)
        if kind is bytes and len(obj) >= OUT_OF_BAND:
            return bytes, (pickle.PickleBuffer(obj),)
        if self.track and kind.__name__ == "ndarray" and kind.__module__ == "numpy":
            found = self._numpy(obj)
            if found is not None:
                return found
        if kind.__name__ == "ndarray" and kind.__module__ == "numpy" and obj.base is not None:
            found = _array_view(obj, self._roots)
            if found is not None:
                return found
        self.types.add(kind)
        return super().reducer_override(obj)

    def _torch(self, obj: Any, kind: type) -> Any:
        """torch's storages on the CPU as out-of-band buffers (their tensors are reduced by
        torch, which hands over a typed storage); None for torch's own reducer."""
        if _torch_kind(kind, "TypedStorage"):
            untyped = getattr(obj, "_untyped_storage", None)
            if untyped is not None and untyped.device.type in ("cpu", "cuda"):
                return typed_storage, (untyped, obj.dtype)
            return None
        if _torch_kind(kind, "UntypedStorage"):
            if obj.device.type == "cuda":
                return self._cuda(obj)
            if obj.device.type != "cpu":
                return None
            buffer = pickle.PickleBuffer(_storage_memory(obj))
            token = self.tokens.get(id(obj), (None, None))[1]
            self.buffer_tokens[id(buffer)] = (buffer, token)
            return untyped_storage, (buffer,)
        if hasattr(obj, "untyped_storage") and hasattr(obj, "_version"):
            # a tensor: its storage's token, from the first tensor over it (a parameter's
            # own counter, not that of the ``.data`` alias torch reduces it through)
            with contextlib.suppress(Exception):
                storage = obj.untyped_storage()
                if id(storage) not in self.tokens:
                    self.tokens[id(storage)] = (storage, _change_token(obj))
        return None

    def _cuda(self, storage: Any) -> Any:
        """A CUDA storage as an out-of-band buffer of its bytes on the host: in a staged
        snapshot a copy into pinned memory made while the notebook is paused (or nothing
        at all, when its counter says it is unchanged), else a plain copy."""
        token = self.tokens.get(id(storage), (None, None))[1]
        n = storage.nbytes()
        if self.staging is not None and n >= OUT_OF_BAND:
            host = self.staging.from_device(storage, token)
        else:
            host = _device_view(storage).cpu().numpy()
        buffer = pickle.PickleBuffer(host)
        self.buffer_tokens[id(buffer)] = (buffer, token)
        return device_storage, (buffer, str(storage.device))

    def _numpy(self, obj: Any) -> Any:
        """Staged snapshots: a large plain array that owns its memory as an out-of-band
        buffer with a change token (its counter: a hash of pieces of it, ``_sampled``);
        None for numpy's own reducer."""
        dtype = obj.dtype
        if (
            obj.base is not None
            or obj.nbytes < OUT_OF_BAND
            or not obj.flags.c_contiguous
            or not obj.flags.writeable  # (left to numpy's reducer, as it always was)
            or dtype.hasobject
            or dtype.fields is not None
            or dtype.subdtype is not None
        ):
            return None
        buffer = pickle.PickleBuffer(obj)
        token = None
        with contextlib.suppress(TypeError):
            at = obj.__array_interface__["data"][0]
            token = (weakref.ref(obj), _sampled(at, obj.nbytes), at, obj.nbytes, obj)
        self.buffer_tokens[id(buffer)] = (buffer, token)
        return numpy_array, (buffer, dtype.str, obj.shape)

    def _polars(self, obj: Any, kind: type) -> Any:
        """A polars frame's (or series') plain numeric columns as out-of-band buffers of
        their own memory, without polars' serialisation (a copy of the whole frame each
        time); polars never changes a column's memory in place but through ``scatter``,
        so an unchanged column's blob is reused, as for a torch storage whose counter did
        not move (and checked the same way). Others columns are left to polars' reducer."""
        if kind.__name__ == "Series":
            plain = self._polars_column(obj, obj)
            return None if plain is None else (polars_series, plain)
        try:
            columns = obj.get_columns()
        except Exception:
            return None
        parts = [self._polars_column(c, obj) or c for c in columns]
        if all(type(p) is not tuple for p in parts):
            return None
        return polars_frame, (parts,)

    def _polars_column(self, series: Any, owner: Any) -> tuple[str, Any, str] | None:
        try:
            if (
                series.null_count()
                or series.n_chunks() != 1
                or any(series.flags.values())  # sortedness would be lost
                or not series.dtype.is_numeric()
            ):
                return None
            values = series.to_numpy(allow_copy=False)
        except Exception:  # a copy would be needed (not a plain column)
            return None
        if values.dtype.kind not in "iuf" or not values.flags.c_contiguous:
            return None
        buffer = pickle.PickleBuffer(values)
        token = None
        with contextlib.suppress(TypeError):  # (no weak reference to it)
            ptr = values.__array_interface__["data"][0]
            token = (weakref.ref(owner), 0, ptr, values.nbytes, values)
        self.buffer_tokens[id(buffer)] = (buffer, token)
        return (series.name, buffer, values.dtype.str)


_POLARS = ("polars.dataframe.frame", "polars.series.series")


# Large buffers move in pieces, several at a time: hashlib and os.pwrite/preadv release the
# GIL, so the pieces' hashing and writing run on every core. The threads are started and
# joined within each call, none outlives it, so the kernel stays safe to fork.
CHUNK = 32 << 20
_WORKERS = max(1, min(4, os.cpu_count() or 1))
_TREE = b"spotbook sha256 of 32 MiB pieces\n"
# blobs this large are mapped (private, copy-on-write), not copied into memory
MAP_AT = 1 << 20


def _pieces(size: int, work: Callable[[int], None]) -> None:
    """``work(offset)`` for each CHUNK of ``size`` bytes, on up to _WORKERS threads."""
    offsets = iter(range(0, size, CHUNK))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run() -> None:
        while not errors:
            with lock:
                at = next(offsets, None)
            if at is None:
                return
            try:
                work(at)
            except BaseException as exc:  # re-raised in the caller
                errors.append(exc)

    n = min(_WORKERS, -(-size // CHUNK))
    threads = [threading.Thread(target=run, name="spotbook-io", daemon=True) for _ in range(n - 1)]
    for t in threads:
        t.start()
    run()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def digest_of(view: memoryview) -> str:
    """A blob's name: its sha256; for a buffer of two pieces or more, ``t`` and the sha256
    of its pieces' sha256s (hashed in parallel)."""
    size = view.nbytes
    if size < 2 * CHUNK:
        return hashlib.sha256(view).hexdigest()
    parts: dict[int, bytes] = {}

    def one(at: int) -> None:
        parts[at] = hashlib.sha256(view[at : at + CHUNK]).digest()

    _pieces(size, one)
    return _tree_digest([parts[k] for k in sorted(parts)])


def _tree_digest(parts: list[bytes]) -> str:
    """The name of a blob of two pieces or more, from its pieces' sha256s in order."""
    return "t" + hashlib.sha256(_TREE + b"".join(parts)).hexdigest()


class Blobs:
    """A directory of content-addressed blob files (the store's, or a staging copy)."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.new: list[str] = []  # written by this object
        self.written = 0

    def path(self, digest: str) -> str:
        return os.path.join(self.dir, digest)

    def put(self, data: Any, token: tuple[Any, ...] | None = None) -> str:
        """Store ``data`` (bytes or a contiguous buffer); return its sha256. (``token``:
        what says the buffer is unchanged since an earlier snapshot; only
        :class:`StagedBlobs` uses it.)"""
        view = memoryview(data).cast("B")
        digest = digest_of(view)
        path = self.path(digest)
        if not os.path.exists(path):
            _private_dirs(self.dir)
            tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                try:
                    # the buffer itself, piece by piece in parallel: no copy
                    _pieces(view.nbytes, lambda at: _pwrite_all(fd, view[at : at + CHUNK], at))
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            self.new.append(digest)
            self.written += view.nbytes
        return digest

    def get(self, digest: str) -> bytearray | mmap.mmap:
        """A blob's bytes, checked against its name before anyone unpickles them. A large
        one is mapped, privately: arrays rebuilt on it use the page cache's pages until
        they are written to (copy on write), and the file is never changed through it.
        Blob files are only ever replaced whole (written aside, then renamed), so a
        mapping never sees one change or shrink."""
        with open_plain(self.path(digest)) as fh:
            size = os.fstat(fh.fileno()).st_size
            data: bytearray | mmap.mmap
            if size >= MAP_AT and hasattr(mmap, "MAP_PRIVATE"):
                data = mmap.mmap(
                    fh.fileno(),
                    size,
                    flags=mmap.MAP_PRIVATE,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE,
                )
            else:
                data = bytearray(size)
                fh.readinto(data)
        view = memoryview(data)
        try:
            # a name without the ``t``: a plain sha256 (so blobs of older versions load)
            found = digest_of(view) if digest.startswith("t") else hashlib.sha256(view).hexdigest()
            if found != digest:
                raise IntegrityError(f"blob {digest[:12]}… does not match its hash")
        finally:
            view.release()
        return data


# -- staged snapshots ------------------------------------------------------------------
# Kernels that must not fork (torch, polars, LightGBM, a GPU runtime, the notebook's own
# threads) are snapshotted without a copy of the process: at the cell boundary the state
# is pickled and each large buffer that changed is copied into staging memory; a writer
# thread then hashes and writes them while the notebook goes on. The pause is the pickling
# and the copies, not the hashing and the writing.
_STAGING_POOL: list[mmap.mmap] = []  # staging memory kept for the next snapshot
# torch storages known unchanged: (data_ptr, nbytes) -> (change token, digest)
_KNOWN: dict[tuple[int, int], tuple[tuple[Any, ...], str]] = {}
# tensors (and polars frames) whose counter missed a change, by id (frames do not hash)
_UNTRUSTED: dict[int, weakref.ref[Any]] = {}


def _staging_budget() -> int:
    """Bytes this process may take for staging copies: half of what the machine (or the
    container's memory limit) has available now."""
    avail = None
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/memory.max") as fh:
            limit = fh.read().strip()
        with open("/sys/fs/cgroup/memory.current") as fh:
            used = int(fh.read())
        if limit != "max":
            left = int(limit) - used
            avail = left if avail is None else min(avail, left)
    if avail is None:
        return 1 << 30
    return max(0, avail // 2) + sum(len(m) for m in _STAGING_POOL)


def _staging(n: int) -> mmap.mmap:
    """Anonymous memory for a staging copy: one kept from an earlier snapshot if one is
    large enough (its pages are already mapped), else a new mapping (huge pages asked
    for, so a copy takes few page faults)."""
    fits = [m for m in _STAGING_POOL if len(m) >= n]
    if fits:
        best = min(fits, key=len)
        _STAGING_POOL.remove(best)
        return best
    mem = mmap.mmap(-1, max(n, 1))
    with contextlib.suppress(AttributeError, OSError):
        mem.madvise(mmap.MADV_HUGEPAGE)
    return mem


class StagedBlobs(Blobs):
    """Blobs whose hashing and writing wait for :meth:`flush` (on the writer thread).

    :meth:`put` returns a placeholder name for a buffer still to be written (replaced
    by :meth:`name` once flushed) or, for a torch storage whose change token says it is
    unchanged since the last staged snapshot, that snapshot's digest (the buffer is
    hashed again by :meth:`flush`, and the snapshot refused as stale if it changed).
    A buffer that may change (a live array's memory) is copied first; an immutable one
    (bytes, the pickle stream) is kept as it is. When the copies would exceed the
    staging budget the buffer is written at once, in the pause (``fallback`` says so).
    """

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self.budget = _staging_budget()
        self.staged = 0  # bytes copied into staging memory
        self.fallback = ""
        self.reused = 0  # bytes known unchanged: neither copied nor written
        self.jobs: list[tuple[str, memoryview, Any, tuple[Any, ...] | None]] = []
        self.names: dict[str, str] = {}
        self._memory: list[mmap.mmap] = []
        self.verify: list[tuple[memoryview, Any, str, tuple[Any, ...]]] = []
        self.stale: list[str] = []
        self.learned: dict[tuple[int, int], tuple[tuple[Any, ...], str]] = {}
        self._owned: dict[int, Any] = {}  # host copies of GPU storages, by id: not copied again
        self._events: list[Any] = []  # the copies from the GPU still under way

    def from_device(self, storage: Any, token: tuple[Any, ...] | None) -> Any:
        """A GPU storage's bytes on the host, for :meth:`put`: a stand-in never read when
        its change token says it is unchanged (:meth:`flush` hashes the device's bytes
        again), a copy into pinned memory that :meth:`settle` waits for (a plain copy
        where none is to be had), or, beyond the staging budget, a plain copy written in
        the pause."""
        torch = sys.modules["torch"]  # loaded: it made the storage
        n = storage.nbytes()
        if token is not None and _known_digest(token) is not None:
            return mmap.mmap(-1, n)  # anonymous and never touched: no memory taken
        device = _device_view(storage)
        if self.staged + n > self.budget:
            return device.cpu().numpy()
        try:
            pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        except RuntimeError as exc:  # no pinned memory to be had: a plain copy, now
            self.fallback = f"pinned memory was refused ({exc})"[:300]
            host = device.cpu().numpy()
        else:
            pinned.copy_(device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(storage.device))
            self._events.append(event)
            host = pinned.numpy()
        self._owned[id(host)] = host
        self.staged += n
        return host

    def settle(self) -> None:
        """Wait for the copies from the GPU (in the pause: the next cell may change the
        memory they read)."""
        for event in self._events:
            event.synchronize()
        self._events.clear()

    def put(self, data: Any, token: tuple[Any, ...] | None = None) -> str:
        view = memoryview(data).cast("B")
        if token is not None:
            known = _known_digest(token)
            if known is not None:
                # the storage (token's last item) is held until the buffer is verified
                self.verify.append((view, token[4], known, token[:4]))
                self.reused += view.nbytes
                return known
        holder = view.obj
        if (
            type(holder) is bytes
            or type(holder).__name__ == "_BytesIOBuffer"
            or self._owned.get(id(holder)) is holder
        ):
            kept, keep = view, holder  # nobody can change it: no copy
        elif self.staged + view.nbytes <= self.budget:
            mem = _staging(view.nbytes)
            kept = memoryview(mem)[: view.nbytes]
            _copy(kept, view)
            self._memory.append(mem)
            keep = mem
            self.staged += view.nbytes
        else:
            self.fallback = (
                f"staging the state would take over half the memory available "
                f"({self.budget >> 20} MiB): the rest was written in the pause"
            )
            digest = super().put(view)
            if token is not None:
                self._learn(token, digest)
            return digest
        name = f"\x00staged:{len(self.jobs)}"
        self.jobs.append((name, kept, keep, token))
        return name

    def _learn(self, token: tuple[Any, ...], digest: str) -> None:
        """Remember a buffer's digest, with its counter then, for the next snapshot."""
        self.learned[(token[2], token[3])] = (token[:4], digest)

    def flush(self) -> None:
        """Hash and write the staged buffers; verify the ones reused (the writer)."""
        for name, view, _keep, token in self.jobs:
            self.names[name] = digest = super().put(view)
            if token is not None:
                self._learn(token, digest)
        for view, owner, digest, token in self.verify:
            # the buffer as it is now: the next cell may have changed it since the
            # boundary (a false alarm: one snapshot fewer), but it cannot look unchanged
            # unless it was (or was changed back)
            on_gpu = getattr(getattr(owner, "device", None), "type", "cpu") == "cuda"
            if (_device_digest(owner) if on_gpu else digest_of(view)) != digest:
                self.stale.append(digest)
                tensor = token[0]()
                if tensor is not None:
                    for gone in [k for k, ref in _UNTRUSTED.items() if ref() is None]:
                        del _UNTRUSTED[gone]
                    _UNTRUSTED[id(tensor)] = weakref.ref(tensor)
        self.verify.clear()
        self.jobs.clear()
        self._owned.clear()  # the pinned copies go back to torch's cache of pinned memory
        for mem in self._memory:
            _STAGING_POOL.append(mem)
        self._memory.clear()
        if self.stale:
            _KNOWN.clear()
        else:
            _KNOWN.update(self.learned)
            for dead in [k for k, (was, _) in _KNOWN.items() if was[0]() is None]:
                del _KNOWN[dead]
        # staging memory beyond what this snapshot used is given back
        while sum(len(m) for m in _STAGING_POOL) > self.staged + (64 << 20):
            _STAGING_POOL.pop(0).close()

    def name(self, value: str) -> str:
        return self.names.get(value, value)


def _device_view(storage: Any) -> Any:
    """A GPU storage's bytes as a tensor of bytes on its device (no copy)."""
    torch = sys.modules["torch"]
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _device_digest(storage: Any) -> str:
    """:func:`digest_of` a GPU storage's bytes as they are now, copied to the host a piece
    at a time (the writer's check of a storage reused unchanged)."""
    device = _device_view(storage)
    size = device.numel()
    if size < 2 * CHUNK:
        return hashlib.sha256(device.cpu().numpy()).hexdigest()
    parts = [
        hashlib.sha256(device[at : at + CHUNK].cpu().numpy()).digest()
        for at in range(0, size, CHUNK)
    ]
    return _tree_digest(parts)


def _address(view: memoryview) -> int | None:
    """Where a contiguous buffer's bytes lie: a writable one through ctypes, a read-only
    numpy array (a polars column's) from its array interface; None if not known."""
    import ctypes

    if not view.readonly:
        with contextlib.suppress(TypeError, ValueError):
            return ctypes.addressof(ctypes.c_char.from_buffer(view))
    owner = view.obj
    face = getattr(owner, "__array_interface__", None)
    if (
        isinstance(face, dict)
        and getattr(owner, "nbytes", None) == view.nbytes
        and face.get("strides") is None  # C-contiguous: the data starts the buffer
    ):
        return int(face["data"][0])
    return None


def _copy(dst: memoryview, src: memoryview) -> None:
    """``dst[:] = src``; a large one in pieces on every core (``ctypes.memmove`` lets go
    of the GIL; the notebook is paused meanwhile, so the cores are the snapshot's)."""
    import ctypes

    size = src.nbytes
    to, at = _address(dst), _address(src)
    if size < 2 * CHUNK or _WORKERS == 1 or to is None or at is None:
        dst[:] = src
        return

    def piece(off: int) -> None:
        ctypes.memmove(to + off, at + off, min(CHUNK, size - off))

    _pieces(size, piece)


def _known_digest(token: tuple[Any, ...]) -> str | None:
    entry = _KNOWN.get((token[2], token[3]))
    if entry is None:
        return None
    was, digest = entry
    tensor = token[0]()
    if tensor is None or was[0]() is not tensor:
        return None
    doubt = _UNTRUSTED.get(id(tensor))
    if doubt is not None and doubt() is tensor:
        return None
    return digest if was[1] == token[1] else None


def _pwrite_all(fd: int, view: memoryview, at: int) -> None:
    while view.nbytes:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


def _private_dirs(path: str) -> None:
    """Make ``path`` and its missing parents 0700 (``os.makedirs`` gives parents the
    umask's mode)."""
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


class IntegrityError(Exception):
    """A blob's bytes do not match the hash the (verified) manifest gives."""


def open_plain(path: str) -> io.BufferedReader:
    """``path`` opened to read, which must be a plain file: a link there is refused
    (OSError) and a FIFO, device or directory is IntegrityError — never waited on."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IntegrityError(f"{os.path.basename(path)[:12]}… is not a plain file")
        os.set_blocking(fd, True)
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class _BlobUnwritable(Exception):
    """An array's buffer could not be written: carried past the per-variable handler."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def dump_namespace(
    values: dict[str, Any], user_globals: dict[str, Any], blobs: Blobs
) -> tuple[dict[str, Any], dict[str, str]]:
    """Pickle ``values`` as one stream of segments.

    Returns ``(doc, failed)``: ``doc`` holds the stream's blob, its segments
    ``[name, end offset, buffers used so far]`` in order and the out-of-band buffers'
    blobs in order;
    ``failed`` maps each variable that could not be pickled to why.
    """
    stream = io.BytesIO()
    buffers: list[str] = []

    def on_buffer(buf: pickle.PickleBuffer) -> bool:
        try:
            raw = buf.raw()
        except BufferError:  # not contiguous: in band
            return True
        if raw.nbytes < OUT_OF_BAND:
            return True
        held = pickler.buffer_tokens.get(id(buf))
        try:
            buffers.append(blobs.put(raw, held[1] if held else None))
        except OSError as exc:  # the store's fault, not the variable's: see below
            raise _BlobUnwritable(exc) from exc
        return False

    roots = array_roots(values)
    staging = blobs if isinstance(blobs, StagedBlobs) else None
    pickler = NamespacePickler(stream, user_globals, on_buffer, roots, track=staging is not None)
    pickler.staging = staging
    segments: list[list[Any]] = []
    failed: dict[str, str] = {}
    # arrays that view another come last, so the array they view is saved first
    order = sorted(
        values,
        key=lambda n: (
            type(values[n]).__name__ == "ndarray"
            and roots.get(id(_owner(values[n]))) is not values[n]
        ),
    )
    try:
        for name in order:
            start, nbuf, marker = stream.tell(), len(buffers), []  # type: ignore[var-annotated]
            pickler.types = set()
            try:
                if name in LOAD_CHECK["exclude"]:
                    raise LoadCheckError(LOAD_CHECK["exclude"][name])
                pickler.dump((marker, values[name]))
                if LOAD_CHECK["on"]:
                    _load_check(pickler, stream, start, marker, len(buffers) > nbuf, name)
            except _BlobUnwritable as exc:
                # a full disk (or EIO, EDQUOT) is no reason to leave a variable out: the whole
                # snapshot fails as the store's, and the runner stops with progress kept
                raise exc.error from None
            except Exception as exc:  # pickling can raise anything: the variable is replayed
                failed[name] = f"{type(exc).__name__}: {exc}"[:300]
                # cut the segment out: its bytes, its buffers and the memo entries it made
                memo = pickler.memo.copy()
                first = memo[id(marker)][0] if id(marker) in memo else None
                if first is not None:
                    pickler.memo = {k: v for k, v in memo.items() if v[0] < first}
                stream.seek(start)
                stream.truncate()
                del buffers[nbuf:]
                continue
            segments.append([name, stream.tell(), len(buffers)])
        if staging is not None:
            staging.settle()
        data = stream.getbuffer()
        doc = {
            "stream": blobs.put(data),
            "size": data.nbytes,
            "segments": segments,
            "buffers": buffers,
        }
        del data
        return doc, failed
    finally:
        # the pickler and on_buffer hold each other: what the pickler holds (the buffers
        # handed out, pinned copies of GPU memory among them) would otherwise live on
        # until the cyclic collector runs, and torch could not reuse that pinned memory
        pickler.clear_memo()
        pickler.tokens.clear()
        pickler.buffer_tokens.clear()


# Types whose objects pickle but do not load back (a ``__reduce__`` that "lies") are found
# when the snapshot is taken: each segment with a type not yet seen to load is loaded
# once, from its bytes, against the live objects earlier segments hold, and cut out (its
# variable replayed or named) if that fails. Only in the background snapshot's copy of the
# kernel (loading objects in the kernel itself could change what the notebook sees, e.g.
# pyplot's figures), and not for segments with out-of-band buffers or over 16 MB.
LOAD_CHECK: dict[str, Any] = {"on": False, "progress": None, "exclude": {}}
_LOADS: set[type] = set()  # types seen to load back
_CHECK_LIMIT = 16 << 20


class LoadCheckError(Exception):
    """A segment pickled, but its bytes do not load back."""


def _load_check(
    pickler: Any, stream: io.BytesIO, start: int, marker: Any, oob: bool, name: str
) -> None:
    new = pickler.types - _LOADS
    size = stream.tell() - start
    if not new or oob or size > _CHECK_LIMIT:
        return
    progress = LOAD_CHECK["progress"]
    if progress is not None:  # should loading it end the process, the supervisor knows
        os.write(progress, name.encode("utf-8", "surrogatepass") + b"\0")
    memo = pickler.memo.copy()
    first = memo[id(marker)][0] if id(marker) in memo else 0
    # the pure-Python unpickler: its memo takes the live objects (the C one's does not)
    loader: Any = pickle._Unpickler(io.BytesIO(stream.getbuffer()[start:]))
    loader.memo = {idx: obj for idx, obj in memo.values() if idx < first}
    CHECKING["on"] = True
    try:
        loader.load()
    except Exception as exc:
        why = f"pickles but does not load back ({type(exc).__name__}: {exc})"
        raise LoadCheckError(why) from None
    finally:
        CHECKING["on"] = False
    _LOADS.update(new)


def load_namespace(doc: dict[str, Any], blobs: Blobs) -> tuple[dict[str, Any], dict[str, str]]:
    """Load a stream :func:`dump_namespace` wrote; return ``(values, failed)``.

    A segment that fails to load is isolated: the load goes on at the next segment's
    start (its offset and first buffer are in the manifest) with what the earlier
    segments made. The memo entries the failed segment would have made are its constants
    where it pushed one, else placeholders (so later segments' memo indices still line
    up), and a later segment that refers to a placeholder fails too, by name, before it
    is loaded: an object is never rebuilt on a placeholder. (Manifests of older versions,
    without buffer counts, stop at the first failure: later segments are reported as
    failed.)
    """
    raw = blobs.get(doc["stream"])
    stream = io.BytesIO(raw)
    buffers = _Buffers(blobs, doc["buffers"])
    unpickler: Any = pickle.Unpickler(stream, buffers=buffers)
    values: dict[str, Any] = {}
    failed: dict[str, str] = {}
    broken = ""
    bad: set[int] | None = None  # placeholders' memo indices, once a segment failed
    memo_end = 0  # (counted once a segment failed) the memo's length before this segment
    begin = 0
    for segment in doc["segments"]:
        name, end = segment[0], int(segment[1])
        if broken:
            failed[name] = f"not loaded: {broken}"
            continue
        if bad is not None:
            made, refs, atoms = _memo_use(raw, begin, end)
            if refs & bad:
                failed[name] = "refers to an object of a variable that failed to load"
                unpickler = _carry_on(
                    unpickler, stream, buffers, segment, memo_end, made, atoms, bad
                )
                memo_end += made
                begin = end
                continue
        try:
            values[name] = unpickler.load()[1]
        except IntegrityError:
            raise
        except Exception as exc:  # a pickle that "lies": its cells are replayed
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
            if len(segment) < 3:
                broken = f"loading {name!r} before it failed"
                continue
            if bad is None:  # the first failure: count the memo up to this segment
                bad = set()
                memo_end = _memo_use(raw, 0, begin)[0]
            made, _, atoms = _memo_use(raw, begin, end)
            unpickler = _carry_on(unpickler, stream, buffers, segment, memo_end, made, atoms, bad)
            memo_end += made
            begin = end
            continue
        if bad is not None:
            memo_end += made
        begin = end
    return values, failed


# opcodes that push a constant: a memo entry right after one holds that constant
_ATOMS = frozenset(
    {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINBYTES"}
    | {"BINBYTES", "BINBYTES8", "BININT", "BININT1", "BININT2", "LONG1", "LONG4", "BINFLOAT"}
)


def _memo_use(raw: Any, begin: int, end: int) -> tuple[int, set[int], dict[int, Any]]:
    """In ``raw[begin:end]`` (whole pickles): how many memo entries its pickles make,
    which memo indices they read, and the constants among the entries it makes (by their
    offset from its first)."""
    made, refs, atoms = 0, set(), {}
    data = io.BytesIO(bytes(memoryview(raw)[begin:end]))
    while data.tell() < end - begin:
        last = None
        for op, arg, _ in pickletools.genops(data):
            if op.name == "MEMOIZE":
                if last is not None and last[0] in _ATOMS:
                    atoms[made] = last[1]
                made += 1
            elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                refs.add(int(arg or 0))
            last = (op.name, arg)
    return made, refs, atoms


def _carry_on(
    unpickler: Any,
    stream: io.BytesIO,
    buffers: _Buffers,
    segment: list[Any],
    start: int,
    made: int,
    atoms: dict[int, Any],
    bad: set[int],
) -> Any:
    """An unpickler at the next segment's start, after a segment (whose ``made`` memo
    entries begin at ``start``) failed or was skipped: those entries are its constants
    where it pushed one, else placeholders, whose indices go into ``bad``. It is the
    pure-Python unpickler (slower, after a failure only): its memo is a plain dict, and
    MEMOIZE stores at the memo's length, as the rest of the stream expects (the C
    unpickler takes no memo it did not build)."""
    stream.seek(int(segment[1]))
    buffers.at = int(segment[2])
    memo = unpickler.memo
    memo = dict(memo) if isinstance(memo, dict) else memo.copy()
    for offset in range(made):
        if offset in atoms:
            memo[start + offset] = atoms[offset]
        else:
            memo[start + offset] = None
            bad.add(start + offset)
    carried: Any = pickle._Unpickler(stream, buffers=buffers)
    carried.memo = memo
    return carried


class _Buffers:
    """The out-of-band buffers of a stream, in order, from a position that can be set
    (after a segment that failed part-way, to the next segment's first)."""

    def __init__(self, blobs: Blobs, digests: list[str]) -> None:
        self.blobs = blobs
        self.digests = digests
        self.at = 0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self.at >= len(self.digests):
            raise StopIteration
        digest = self.digests[self.at]
        self.at += 1
        return _buffer(self.blobs, digest)


def _buffer(blobs: Blobs, digest: str) -> Any:
    return blobs.get(digest)
