"""The entry points the runner calls inside the kernel.

- :func:`init` right after the kernel starts, before any cell: remembers what the
  kernel started with (environment, modules, threads) and installs two watchers —
  IPython's cell events and an audit hook — that note what each cell does outside
  its variables (files written, processes started, random numbers drawn).
  :func:`cell_effects` hands that note to the runner with the cell's own reply.
- :func:`snapshot`: the variables as one pickle stream and the process state
  (:mod:`.process_state`), into blob files; returns the manifest's contents.
  :func:`snapshot_fork` does the same in a forked copy of the kernel (copy-on-write:
  the state as it is now), so the notebook goes on while the copy writes.
- :func:`restore_env`, :func:`reimport`, :func:`restore` and :func:`apply_last`:
  the resume, in that order (see the runner's ``_restore``).

Results travel back as JSON strings; the runner signs and stores them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

from . import process_state
from .pickling import (
    LOAD_CHECK,
    WRITING_FILES,
    Blobs,
    IntegrityError,
    SetInOrder,
    StagedBlobs,
    _private_dirs,
    dump_namespace,
    load_namespace,
    rebuild_order,
)

# IPython's own names in the namespace: its history and helpers, never the notebook's
_IPYTHON_NAMES = frozenset(
    {"In", "Out", "get_ipython", "exit", "quit", "open", "_", "__", "___", "_i", "_ii", "_iii"}
    | {"_ih", "_oh", "_dh", "__builtins__", "__builtin__", "__name__", "__doc__"}
    | {"__package__", "__loader__", "__spec__", "__warningregistry__"}
)
_HISTORY = "\x00history"  # segment holding In/Out, after the variables
_OUT = "\x00out:"
_baseline_modules: set[str] = set()
_baseline_threads: set[int] = set()
_effects: dict[str, list[str]] = {}
_recording = False
_rng_before: dict[str, Any] = {}
_owned_before: dict[str, tuple[str, Any]] = {}  # the notebook's generators, before the cell
_pre: dict[str, Any] = {}  # the state a cell started with, when the runner needs it
# path -> its size before the running cell first opened it for writing (None: absent),
# so a cell that runs again after a kill can be given back the files it started with
_undo: dict[str, int | None] = {}
_last_env: Any = None
_reply_hooked = False  # each cell's note rides in its execute reply's metadata
_result: str = ""  # what the last silent call returned, read through user_expressions
_state: dict[str, Any] = {}  # a loaded snapshot between restore steps
_IGNORED_PREFIXES: tuple[str, ...] = ()
# Where Python writes that is the environment's or IPython's own, not the run's files:
# never captured (the environment is rebuilt by replaying the cells that changed it)
_NOT_RUN_FILES: tuple[str, ...] = ()
_MAX_EFFECTS = 8
# every path a cell opened for writing (beyond the report's few): the runner captures
# those outside the directories it scans with the snapshot that covers the cell
_written: set[str] = set()
_MAX_WRITTEN = 4096
_CHECKPOINT: dict[str, Any] = {"dir": "", "written": False}  # written: by the running cell


def _shell() -> Any:
    from IPython import get_ipython

    return get_ipython()


def _history_name(name: str) -> bool:
    """``_N``, ``_iN``: IPython's numbered history."""
    body = name[2:] if name.startswith("_i") else name[1:]
    return name.startswith("_") and body.isdigit()


def init() -> str:
    """Remember the kernel's starting point and start watching cells. Idempotent.

    Returns JSON: ``reply_metadata`` says whether each cell's note (:func:`cell_effects`)
    travels in the metadata of the cell's own execute reply (ipykernel), so the runner
    need not ask for it with every cell; ``snapshot_with_cell``, whether a staged snapshot
    may be asked for with the cell it follows (:func:`snapshot_after_cell`)."""
    global _IGNORED_PREFIXES, _NOT_RUN_FILES, _reply_hooked
    if _baseline_modules:
        return _started()
    process_state.set_baseline()
    # Python finds its temporary directory by writing and removing a probe file there on
    # first use, which ipykernel makes in the first cell; found now, before cells are
    # watched, it is not noted as that cell writing and deleting a file
    import tempfile

    tempfile.gettempdir()
    _baseline_modules.update(sys.modules)
    _baseline_threads.update(t.ident or 0 for t in threading.enumerate())
    home = os.path.expanduser("~")
    # the environment's, IPython's and matplotlib's own places, and the checkpoint
    # directory (spotbook's to restore: a rerun writing it is meant)
    own = (
        sys.prefix,
        sys.base_prefix,
        os.path.join(home, ".ipython"),
        os.environ.get("MPLCONFIGDIR", os.path.join(home, ".matplotlib")),
        os.environ.get("SPOTBOOK_CHECKPOINT_DIR", os.path.join(home, ".spotbook-none")),
    )
    # the report does not name writes to caches and configuration either; the run's
    # files do include them (a new node's home is empty)
    caches = tuple(os.path.join(home, d) for d in (".cache", ".config", ".local"))
    _IGNORED_PREFIXES = tuple(os.path.join(p, "") for p in (*own, *caches))
    _NOT_RUN_FILES = tuple(os.path.join(p, "") for p in (*own, "/dev", "/proc", "/sys"))
    checkpoint = os.environ.get("SPOTBOOK_CHECKPOINT_DIR")
    _CHECKPOINT["dir"] = os.path.join(os.path.abspath(checkpoint), "") if checkpoint else ""
    shell = _shell()
    shell.events.register("pre_run_cell", _pre_cell)
    shell.events.register("post_run_cell", _post_cell)
    sys.addaudithook(_audit)
    _reply_hooked = _note_in_replies(shell)
    from . import loops

    loops.install(shell)  # in-cell resume points, for the cells the runner asks it of
    return _started()


def _started() -> str:
    with_cell = _tags_writes(sys.stdout) and _tags_writes(sys.stderr)
    return json.dumps({"reply_metadata": _reply_hooked, "snapshot_with_cell": with_cell})


def _note_in_replies(shell: Any) -> bool:
    """Put each cell's note into its execute reply's metadata (under ``spotbook``), when
    it has one: ipykernel's kernel lets ``finish_metadata`` add to the reply it is about
    to send, after the cell (and its ``post_run_cell`` event) ran. Asking for the note as
    a user expression instead costs every cell an evaluation and a formatting (about a
    millisecond of the kernel's time on the 2-core machine)."""
    kernel = getattr(shell, "kernel", None)
    finish = getattr(kernel, "finish_metadata", None)
    if kernel is None or not callable(finish):
        return False

    def finish_metadata(parent: Any, metadata: Any, reply_content: Any) -> Any:
        found = finish(parent, metadata, reply_content)
        try:
            noted = _effects or _pre or _written or _CHECKPOINT["written"]
            if noted and not parent["content"].get("silent"):
                found = {**found, "spotbook": _cell_note()}
        except Exception:  # the note must never break the reply
            pass
        return found

    kernel.finish_metadata = finish_metadata
    return True


def _cell_note() -> dict[str, Any]:
    note: dict[str, Any] = {"effects": dict(_effects), "pre": dict(_pre), "undo": dict(_undo)}
    if _written:
        note["written"] = sorted(_written)
    if _CHECKPOINT["written"]:
        note["checkpoint"] = True
    return note


def _pre_cell(info: Any = None) -> None:
    """Before each cell: what it starts from, so a replay can start from the same."""
    global _recording, _rng_before, _last_env, _owned_before
    _effects.clear()
    _pre.clear()
    _undo.clear()
    _written.clear()
    _CHECKPOINT["written"] = False
    env = process_state.capture_env()
    if env != _last_env:  # sent only when it changed: most cells share their start
        _pre["env"] = _last_env = env
    _rng_before = process_state.rng_states()
    _owned_before = process_state.owned_rngs(_shell().user_ns)
    _recording = True


def _post_cell(result: Any = None) -> None:
    global _recording
    _recording = False
    if _rng_before and not process_state.same_rngs(_rng_before, process_state.rng_states()):
        _effects["random"] = sorted(_rng_before)
        _pre["rng"] = process_state.rngs_json(_rng_before)  # where a replay starts it from
    if _owned_before:
        after = process_state.owned_rngs(_shell().user_ns)
        drawn = {n: s for n, s in _owned_before.items() if after.get(n) != s}
        if drawn:  # a replay of this cell starts them where it first did
            _pre["owned_rng"] = drawn


def _note(kind: str, what: str) -> None:
    seen = _effects.setdefault(kind, [])
    if what not in seen and len(seen) < _MAX_EFFECTS:
        seen.append(what)


def _path(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if not isinstance(value, str):
        return None
    path = os.path.abspath(value)
    if path.startswith(_IGNORED_PREFIXES) or "__pycache__" in path or path.startswith("/dev/"):
        return None
    return path


def _wrote(value: Any) -> None:
    """Remember a path the running cell writes, for the runner's capture of the run's
    files (wherever it is, but for the environment's and IPython's own places)."""
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if not isinstance(value, str):
        return
    path = os.path.abspath(value)
    if _CHECKPOINT["dir"] and path.startswith(_CHECKPOINT["dir"]):
        _CHECKPOINT["written"] = True  # saved before the cell's record commits
        return
    if len(_written) >= _MAX_WRITTEN:
        return
    if not path.startswith(_NOT_RUN_FILES) and "__pycache__" not in path:
        _written.add(path)


def _unwrote(value: Any) -> None:
    """A path the running cell removed (or renamed away): no longer one it left written."""
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if isinstance(value, str):
        _written.discard(os.path.abspath(value))


# Modules that start a command only to ask the system something for themselves (the
# fonts it has, where a shared library is, the processor's name). matplotlib lists the
# fonts with fc-list the first time it runs under a new home, which is every new node:
# that is not the notebook acting on the world, and a replay of it changes nothing.
_QUERY_CALLERS = frozenset({"matplotlib.font_manager", "ctypes.util", "platform"})


def _asked_by_library() -> bool:
    """Whether the command being started comes from one of ``_QUERY_CALLERS``."""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") in _QUERY_CALLERS:
            return True
        frame = frame.f_back
    return False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """What a cell does to the world, for the fidelity report of a replay. Not what
    spotbook's own threads do meanwhile (a staged snapshot's writer, its hashing helpers):
    those writes are the snapshot's, not the cell's."""
    if not _recording or threading.current_thread().name.startswith("spotbook-"):
        return
    try:
        if event == "open":
            path, mode, flags = args
            writing = (
                any(c in mode for c in "wax+")
                if isinstance(mode, str)
                else bool(isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR))
            )
            where = _path(path) if writing else None
            if writing:
                WRITING_FILES.append(True)
                _wrote(path)
            if where:
                _note("writes", where)
                if where not in _undo:
                    try:
                        _undo[where] = os.stat(where).st_size
                    except OSError:
                        _undo[where] = None
        elif event in ("os.remove", "os.rmdir", "shutil.rmtree"):
            _unwrote(args[0])
            where = _path(args[0])
            if where:
                _note("deletes", where)
        elif event in ("os.rename", "shutil.move", "shutil.copyfile"):
            if event != "shutil.copyfile":
                _unwrote(args[0])
            _wrote(args[1])
            where = _path(args[1])
            if where:
                _note("writes", where)
        elif event in ("subprocess.Popen", "os.system", "os.posix_spawn", "os.exec"):
            if _asked_by_library():
                return
            command = args[1] if event == "subprocess.Popen" else args[0]
            if isinstance(command, list | tuple):
                command = " ".join(map(str, command))
            _note("runs", str(command)[:120])
        elif event == "socket.connect":
            address = args[1]
            if isinstance(address, tuple):
                _note("connects", ":".join(map(str, address[:2])))
        elif event == "urllib.Request":
            _note("connects", str(args[0])[:120])
        elif event == "sqlite3.connect":
            where = _path(args[0]) if args[0] != ":memory:" else None
            if where:
                _wrote(where)
                _note("writes", where)
    except Exception:  # the hook must never break the notebook
        return


def cell_effects() -> str:
    """What the cell that just ran did outside its variables, and what it started from
    where a replay needs it (JSON)."""
    if not _effects and not _pre and not _written and not _CHECKPOINT["written"]:
        return "{}"
    return json.dumps(_cell_note(), sort_keys=True)


def set_pre(pre_json: str) -> str:
    """Before replaying a cell out of order: the cwd, path, environment and random
    generators it started from the first time; JSON of what could not be set."""
    pre = json.loads(pre_json)
    failed = process_state.restore(pre.get("env") or {}, process_state.ENV)
    failed.update(process_state.restore_rngs(pre.get("rng") or {}))
    owned = pre.get("owned_rng") or {}
    if owned:
        failed.update(process_state.set_owned_rngs(_shell().user_ns, owned))
    return json.dumps(failed)


def result() -> str:
    """What the last silent call left (read through ``user_expressions``)."""
    return _result


# -- snapshot --------------------------------------------------------------------------
def _namespace(shell: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    hidden = shell.user_ns_hidden
    values: dict[str, Any] = {}
    kinds: dict[str, dict[str, Any]] = {}
    for name, value in shell.user_ns.items():
        if name in _IPYTHON_NAMES or _history_name(name):
            continue
        if name in hidden and hidden[name] is value:
            continue
        if isinstance(value, types.ModuleType) and sys.modules.get(value.__name__) is value:
            kinds[name] = {"kind": "module", "module": value.__name__}
            continue
        values[name] = value
    return values, kinds


def state_bytes(values: dict[str, Any] | None = None) -> int:
    """Rough size of the user namespace, to estimate a first snapshot's cost."""
    total = 0
    if values is None:
        values, _ = _namespace(_shell())
    for value in values.values():
        try:  # torch's sparse tensors raise RuntimeError for nbytes, not AttributeError
            nbytes = getattr(value, "nbytes", None)
        except Exception:
            nbytes = None
        total += nbytes if isinstance(nbytes, int) else sys.getsizeof(value, 0)
    return total


def snapshot_estimate() -> str:
    """What the runner's policy needs before a snapshot's cost is known (JSON): the
    state's rough size, and why it could not be written in the background ("" if it
    could)."""
    return json.dumps({"bytes": state_bytes(), "unsafe": fork_unsafe()})


def _imports() -> list[str]:
    """Modules the notebook imported, in the order it first imported them."""
    return [
        m
        for m in sys.modules
        if m not in _baseline_modules and not m.startswith(("spotbook", "cloudpickle"))
    ]


# threads libraries start for themselves (pyzmq's garbage collector after a large message,
# tqdm's monitor, IPython's loop for %%bash): not the notebook's, so neither a fidelity
# alarm nor a reason to snapshot synchronously (the copy never uses them)
_LIBRARY_THREADS = (
    "spotbook",  # the writer of a staged snapshot, and its hashing pieces
    "zmq",
    "tqdm",
    "IPython",
    "ipykernel",
    "jupyter_client",
    "tornado",
    "traitlets",
    "comm",
    "ipywidgets",
    "matplotlib",
)


def _script_loop() -> Any:
    """The event loop IPython's script magics (%%bash) run in a thread of their own."""
    with contextlib.suppress(Exception):
        magics = _shell().magics_manager.registry.get("ScriptMagics")
        return getattr(magics, "event_loop", None)
    return None


def _library_thread(t: threading.Thread) -> bool:
    if type(t).__module__.startswith(_LIBRARY_THREADS):
        return True
    target = getattr(t, "_target", None)
    owner = getattr(target, "__self__", None)
    if owner is not None and owner is _script_loop():
        return True
    module = getattr(target, "__module__", None) or ""
    return isinstance(module, str) and module.startswith(_LIBRARY_THREADS)


def _threads() -> list[str]:
    """The threads the notebook started that still run."""
    return sorted(
        t.name
        for t in threading.enumerate()
        if t.ident not in _baseline_threads and t.is_alive() and not _library_thread(t)
    )


def snapshot(blob_dir: str) -> str:
    """Write the state's blobs into ``blob_dir``; return the manifest's contents (JSON)."""
    return json.dumps(_take(Blobs(blob_dir)))


def _take(blobs: Blobs) -> dict[str, Any]:
    """The state into ``blobs``; the manifest (with the blobs' names as ``put`` gave
    them: placeholders, for :class:`StagedBlobs`, until it is flushed)."""
    started = time.perf_counter()
    shell = _shell()
    values, kinds = _namespace(shell)
    t0 = time.perf_counter()
    process, uncaptured = process_state.capture()
    env = {
        name: process.pop(name)
        for name in [p.name for p in process_state.PARTS if p.stage == process_state.ENV]
        if name in process
    }
    capture_seconds = time.perf_counter() - t0
    segments: dict[str, Any] = {f"\x00part:{k}": v for k, v in process.items()}
    segments.update(values)
    unordered = []
    for name, value in values.items():
        if isinstance(value, set | frozenset):
            how = rebuild_order(value)
            if how is None:
                unordered.append(name)  # said to differ
            elif how != (list(value), False):  # plain unpickling would not do
                segments[name] = SetInOrder(value, how)
    hm = shell.history_manager
    segments[_HISTORY] = {"parsed": list(hm.input_hist_parsed), "raw": list(hm.input_hist_raw)}
    for n, value in hm.output_hist.items():
        segments[f"{_OUT}{n}"] = value
    doc, failed = dump_namespace(segments, shell.user_global_ns, blobs)
    variables: dict[str, Any] = dict(kinds)
    for name, value in values.items():
        if name in failed:
            variables[name] = {
                "kind": "unserialisable",
                "type": type(value).__qualname__,
                "error": failed[name],
            }
        else:
            variables[name] = {"kind": "object", "type": type(value).__qualname__}
            if name in unordered:
                variables[name]["order"] = "may differ"
    for name, why in failed.items():
        if name.startswith("\x00part:"):
            uncaptured[name[len("\x00part:") :]] = why
    imports = blobs.put(json.dumps(_imports()).encode())
    return dict(
        {
            "vars": variables,
            "stream": doc,
            "env": env,
            "imports": imports,
            "uncaptured": uncaptured,
            "threads": _threads(),
            "new_blobs": blobs.new,
            "written": blobs.written,
            "state_bytes": state_bytes(values),
            "capture_seconds": capture_seconds,
            "seconds": time.perf_counter() - started,
        }
    )


@contextlib.contextmanager
def history_before_cell() -> Iterator[None]:
    """Meanwhile, IPython's history is as it was before the running cell (which runs
    again, and is stored again, when a run is resumed inside it)."""
    hm = _shell().history_manager
    parsed, raw = hm.input_hist_parsed, hm.input_hist_raw
    running = (parsed[-1:], raw[-1:])
    del parsed[-1:], raw[-1:]
    try:
        yield
    finally:
        parsed.extend(running[0])
        raw.extend(running[1])


def take_in_cell(blobs: Blobs) -> dict[str, Any]:
    """:func:`_take` from inside a running cell (a loop's checkpoint): the notebook's open
    files flushed first (the run's files are captured next), and the history as it was
    before the cell (:func:`history_before_cell`)."""
    _flush_open_files()
    with history_before_cell():
        return _take(blobs)


# -- staged snapshots (kernels that must not fork) -----------------------------------------
_writer: threading.Thread | None = None
_WRITER_NICE = 10  # added to the kernel's own niceness (Linux: per thread)


class _Gate:
    """What a writer asked for with a cell waits on before it writes a byte: a FIFO at
    ``path`` the runner writes ``b"g"`` into once the cell's files are noted in the store
    (:func:`snapshot_after_cell`); any other byte drops the snapshot. The kernel holds it
    open both ways (Linux opens a FIFO read-write at once), so the runner's write never
    finds it without a reader, and the kernel can drop it itself."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.mkfifo(path, 0o600)
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)

    def wait(self) -> bool:
        try:
            return os.read(self.fd, 1) == b"g"
        except OSError:
            return False

    def drop(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.fd, b"x")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


_gate: _Gate | None = None  # the last writer's, until the next snapshot is staged


def snapshot_staged(blob_dir: str, result_path: str, gate: str = "") -> str:
    """Without a fork: pickle the state now, copying the large buffers that changed into
    staging memory (:class:`~.pickling.StagedBlobs`), and leave the hashing and writing to
    a thread of this kernel that writes the manifest into ``result_path`` (atomically:
    complete or absent; ``{"stale": why}`` when a buffer reused as unchanged had changed,
    ``{"error": why}`` when writing failed) while the notebook goes on. Returns
    ``{"pid", "pause", "staged", "reused", "fallback"}`` at once."""
    global _writer, _gate
    t0 = time.perf_counter()
    if _writer is not None:  # the runner waits for one before asking for the next
        if _gate is not None:  # one it let go reads its b"g" first; one it left, this
            _gate.drop()
        _start(_writer)  # if no turn of the event loop has started it since
        _writer.join()
    if _gate is not None:
        _gate.close()
        _gate = None
    blobs = StagedBlobs(blob_dir)
    manifest = _take(blobs)
    pause = time.perf_counter() - t0
    if gate:
        _gate = _Gate(gate)
    _writer = threading.Thread(
        target=_write_staged,
        args=(blobs, manifest, result_path, t0, _gate),
        name="spotbook-writer",
        daemon=True,
    )
    writer = _writer
    _after_reply(lambda: _start(writer))
    return json.dumps(
        {
            "pid": os.getpid(),
            "pause": pause,
            "staged": blobs.staged,
            "reused": blobs.reused,
            "fallback": blobs.fallback,
        }
    )


def snapshot_after_cell(blob_dir: str, result_path: str, begun: str, gate: str) -> str:
    """:func:`snapshot_staged`, asked for with a cell's own execute request (a user
    expression, evaluated once the cell's code has run without error, before the reply):
    a request's round trip less in the pause. What it prints is not the cell's output
    (:func:`_outputs_apart`), as a silent request's was not. It makes the file ``begun``
    first: should the kernel die in it, the runner knows that the cell's code had ended
    and the snapshot killed it, not the cell. Where the cell opened files for writing,
    its writer waits at ``gate`` (a :class:`_Gate`) until the runner has noted them in the
    store: a run killed while the snapshot is written must give them back to the cell
    that then runs again (one appending to a file would append twice). Where it opened
    none, there is no note to wait for, and the writer starts as the reply goes out."""
    with open(begun, "x"):
        pass
    with _outputs_apart():
        return snapshot_staged(blob_dir, result_path, gate if _undo else "")


# the request that what a snapshot prints is sent as the output of: none the runner asked
_NO_REQUEST = {"msg_id": "spotbook-snapshot", "msg_type": "execute_request", "session": ""}


@contextlib.contextmanager
def _outputs_apart() -> Iterator[None]:
    """Meanwhile, what is written to ``sys.stdout`` and ``sys.stderr`` (a reducer's print,
    a warning) goes out as the output of no request the runner reads (ipykernel's streams
    tag each write with its thread's parent request). The streams are not replaced: the
    state captured and pickled may refer to them (a logging handler's stream), and must
    find them as they are."""
    tokens = []
    streams: tuple[Any, ...] = (sys.stdout, sys.stderr)
    for stream in streams:
        if _tags_writes(stream):
            tokens.append((stream, stream.set_thread_parent(_NO_REQUEST)))
    try:
        yield
    finally:
        for stream, token in tokens:
            stream.reset_thread_parent(token)


def _tags_writes(stream: Any) -> bool:
    """Whether ``stream`` tags each write with its thread's parent request (ipykernel 7's
    streams; older ones send what they hold under the parent of the moment they flush)."""
    return callable(getattr(stream, "set_thread_parent", None)) and callable(
        getattr(stream, "reset_thread_parent", None)
    )


def _after_reply(start: Callable[[], None]) -> None:
    """Call ``start`` at the kernel's event loop's next turn, once the reply to the request
    running now has been sent (nothing in ipykernel's handling of a request waits on the
    loop after the code's user expressions are evaluated), else now. A staged snapshot's
    writer started before would compete for the interpreter with the sending of that
    reply, which the runner, and so the notebook, waits for: on 2 cores that doubled a
    pause of a few milliseconds. (A forked copy made to wait so gained nothing, measured:
    its round trip stayed 9-18 ms.)"""
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        start()
        return
    loop.call_soon(start)


def _start(thread: threading.Thread) -> None:
    if thread.ident is None:
        thread.start()


def _write_staged(
    blobs: StagedBlobs,
    manifest: dict[str, Any],
    result_path: str,
    t0: float,
    gate: _Gate | None = None,
) -> None:
    """The writer thread: the staged buffers hashed and written, then the manifest. It
    yields the processor to the notebook (a lower priority, which the threads it starts
    to hash and write in pieces inherit): the notebook's next cell, and the runner
    starting it, come first. With a ``gate``, only once the runner lets it go."""
    if gate is not None and not gate.wait():
        return  # the runner took no snapshot after that cell: nothing is written
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        os.setpriority(
            os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + _WRITER_NICE)
        )
    cpu = time.thread_time()
    try:
        blobs.flush()
        if blobs.stale:
            text = json.dumps(
                {
                    "stale": f"{len(blobs.stale)} buffer(s) changed without their tensor's "
                    "version counter saying so (written through .data or .numpy(), a numpy "
                    "array changed between the pieces hashed to tell, or a polars column "
                    "changed in place)"
                }
            )
        else:
            doc = manifest["stream"]
            doc["stream"] = blobs.name(doc["stream"])
            doc["buffers"] = [blobs.name(d) for d in doc["buffers"]]
            manifest["imports"] = blobs.name(manifest["imports"])
            manifest["new_blobs"] = blobs.new
            manifest["written"] = blobs.written
            manifest["seconds"] = time.perf_counter() - t0
            # the hashing pieces run on helper threads too: their CPU is not counted here
            manifest["cpu_seconds"] = time.thread_time() - cpu
            manifest["cpus"] = _cpus()
            manifest["staged_bytes"] = blobs.staged
            manifest["reused_bytes"] = blobs.reused
            text = json.dumps(manifest)
    except BaseException as exc:  # reported to the runner
        text = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]})
    tmp = f"{result_path}.tmp"
    with contextlib.suppress(OSError):
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, result_path)


# -- background snapshots -----------------------------------------------------------------
_children: set[int] = set()
_FILE_TYPES = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)


def _flush_open_files() -> None:
    """Flush every open file object that writes, here in the kernel, before it forks:
    the copy saves a file by flushing it, and what it flushed the kernel would flush
    again (they share the descriptor), writing it twice. Only where the notebook ever
    opened a file for writing (looking costs a walk over the heap's objects)."""
    if not WRITING_FILES:
        return
    import gc

    kinds = set(_FILE_TYPES)
    for obj in gc.get_objects():
        if type(obj) in kinds:
            with contextlib.suppress(Exception):
                if not obj.closed and obj.writable():
                    obj.flush()


def _reap() -> None:
    for pid in list(_children):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _children.discard(pid)


_NATIVE_POOLS = ("torch", "jax", "polars", "lightgbm", "xgboost", "duckdb", "catboost")


def fork_unsafe() -> str:
    """Why this kernel cannot be forked for a snapshot ("" when it can): a copy of a
    process holding a GPU context, or threads the notebook started (they may hold locks
    the copy would need, and do not exist in it), or a platform without fork."""
    return _never_forks() or _threads_running()


def _threads_running() -> str:
    """The notebook's threads that keep this kernel from forking now ("" if none)."""
    threads = _threads()
    return f"threads started by the notebook are running ({', '.join(threads)})" if threads else ""


def _never_forks() -> str:
    """What keeps this kernel from forking for the rest of its life ("" if nothing): a
    module once loaded stays, as does a GPU context (unlike the notebook's threads)."""
    if not hasattr(os, "fork") or sys.platform == "win32":
        return "this platform has no fork()"
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            if torch.cuda.is_initialized():
                return "the kernel holds a CUDA context (torch)"
    for name, lib in (("cupy", "CuPy"), ("tensorflow", "TensorFlow")):
        if name in sys.modules:
            return f"{lib} is loaded in the kernel (a GPU runtime must not be forked)"
    bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None) or {}
    if any(name != "cpu" for name in backends):
        return "the kernel holds a JAX accelerator backend"
    # native thread pools that a forked copy does not get, and may wait on forever while
    # it pickles their objects (seen with these in the object-class table)
    for name in _NATIVE_POOLS:
        if name in sys.modules:
            return f"{name} is loaded in the kernel (its native thread pool does not survive fork)"
    return ""


def _cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _die_with_parent() -> None:
    """Linux: the copy dies when the kernel does (a lost node takes both)."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


def _checked_snapshot(blob_dir: str, tries: int = 3) -> str:
    """In the background snapshot's copy: :func:`snapshot` with load checks (each new type
    loaded back once), written by a copy of the copy, so that loading an object that ends
    the process (a ``__reduce__`` that calls ``os._exit``, a crash in a C extension) ends
    only that one: the variable it was loading is left out (replayed on resume) and the
    snapshot is written again without it; after ``tries`` such ends, without checks."""
    import random
    import tempfile

    excluded: dict[str, str] = {}
    state = random.getstate()  # (a fork reseeds random's generator in the child)
    for _ in range(tries):
        # beside the blobs (never among the run's files, which the runner is scanning)
        _private_dirs(blob_dir)
        fd, out_path = tempfile.mkstemp(prefix="check.tmp-", dir=blob_dir)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _die_with_parent()
                random.setstate(state)
                os.close(read_end)
                LOAD_CHECK.update(on=True, progress=write_end, exclude=excluded)
                try:
                    text = snapshot(blob_dir)
                except BaseException as exc:  # an ordinary failure (a full disk): said as is
                    text = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]})
                os.write(fd, text.encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        seen = b""
        while chunk := os.read(read_end, 65536):
            seen += chunk
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(fd, "rb") as fh:
            fh.seek(0)  # (the copy wrote through this very descriptor: its offset is shared)
            text = fh.read().decode()
        os.unlink(out_path)
        if status == 0 and text:
            return text
        names = [n.decode("utf-8", "surrogatepass") for n in seen.split(b"\0") if n]
        if not names:
            break  # it ended before checking anything: not a load check's doing
        excluded[names[-1]] = "loading it back ended the process that checked it"
    LOAD_CHECK.update(on=False, progress=None, exclude=excluded)
    return snapshot(blob_dir)


def snapshot_fork(blob_dir: str, result_path: str) -> str:
    """Fork the kernel; the copy writes the snapshot (as :func:`snapshot`) and its
    manifest into ``result_path`` (atomically: complete or absent), then exits. Returns
    ``{"pid", "pause"}`` at once, or ``{"unsafe": why}`` when it must not fork, with
    ``"lasting": true`` when it never will (the runner then stops asking)."""
    _reap()
    why = _never_forks()
    if why:
        return json.dumps({"unsafe": why, "lasting": True})
    why = _threads_running()
    if why:
        return json.dumps({"unsafe": why})
    parent = os.getpid()
    t0 = time.perf_counter()
    _flush_open_files()
    import random

    # random's global generator is reseeded in a forked child (os.register_at_fork):
    # the copy must save the kernel's, not its own
    seed_state = random.getstate()
    pid = os.fork()
    if pid == 0:  # the copy: write, and leave without running any of the kernel's code
        code = 1
        try:
            import signal

            _die_with_parent()
            if os.getppid() != parent:
                os._exit(1)
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            random.setstate(seed_state)
            # sys.stdout/stderr stay as they are: the snapshot saves them by identity
            try:
                manifest = json.loads(_checked_snapshot(blob_dir))
                # what the copy took from the machine (counted from the fork): the
                # policy charges the notebook its share of the CPUs
                import resource

                used = resource.getrusage(resource.RUSAGE_SELF)
                manifest["cpu_seconds"] = used.ru_utime + used.ru_stime
                manifest["cpus"] = _cpus()
                text = json.dumps(manifest)
            except BaseException as exc:  # reported to the runner
                text = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]})
            tmp = f"{result_path}.tmp"
            with open(tmp, "w") as fh:
                fh.write(text)
            os.replace(tmp, result_path)
            code = 0
        finally:
            os._exit(code)
    _children.add(pid)
    return json.dumps({"pid": pid, "pause": time.perf_counter() - t0})


# -- restore ---------------------------------------------------------------------------
def restore_env(env_json: str) -> str:
    """Stage ENV: cwd, ``sys.path`` and environment, before anything is imported."""
    failed = process_state.restore(json.loads(env_json), process_state.ENV)
    return json.dumps(failed)


def reimport(blob_dir: str, digest: str) -> None:
    """Import the notebook's modules again, in its order, inside a (silent) cell.

    Run through ``run_cell`` as the original imports were, so libraries that decide
    defaults at import time (pandas asks whether it runs under a kernel) decide the
    same. Modules that no longer import are left to the unpickler to report.
    """
    global _result
    import importlib

    names = json.loads(bytes(Blobs(blob_dir).get(digest)))
    failed = []
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except BaseException:
            failed.append(name)
    _result = json.dumps(failed)


def missing_modules(blob_dir: str, digest: str) -> str:
    """The top-level modules the snapshot's notebook imported that this environment
    cannot import (JSON list), found before anything is loaded."""
    import importlib.util

    names = json.loads(bytes(Blobs(blob_dir).get(digest)))
    missing = []
    for top in sorted({str(n).split(".")[0] for n in names}):
        if top in sys.modules or top.startswith("_"):
            continue
        try:
            if importlib.util.find_spec(top) is None:
                missing.append(top)
        except (ImportError, ValueError):
            missing.append(top)
    return json.dumps(missing)


def not_installed(names_json: str) -> str:
    """Of these distributions (pip's names), those this environment lacks (JSON list)."""
    import importlib.metadata

    lacking = []
    for name in json.loads(names_json):
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            lacking.append(name)
    return json.dumps(lacking)


def restore(blob_dir: str, manifest_json: str, keep: tuple[str, ...] = ()) -> None:
    """Load the variables and stage CONFIG; ``_result`` says what failed (JSON).

    ``keep``: variables left as a replay made them (see the resume plan's ``keep``).
    """
    global _result
    started = time.perf_counter()
    manifest = json.loads(manifest_json)
    blobs = Blobs(blob_dir)
    shell = _shell()
    _close_files({k: v for k, v in shell.user_ns.items() if k not in keep})
    try:
        loaded, failed = load_namespace(manifest["stream"], blobs)
    except FileNotFoundError as exc:
        _result = json.dumps({"missing": f"a blob is missing from the run store ({exc})"})
        return
    except (IntegrityError, OSError) as exc:
        _result = json.dumps({"integrity": str(exc)})
        return
    parts = {k[len("\x00part:") :]: v for k, v in loaded.items() if k.startswith("\x00part:")}
    _state.clear()
    _state["parts"] = parts
    problems = process_state.restore(parts, process_state.CONFIG)
    ns = shell.user_ns
    variables = manifest["vars"]
    unrestored: dict[str, str] = {}
    for name, entry in variables.items():
        if name in keep and name in ns:
            continue
        try:
            if entry["kind"] == "module":
                import importlib

                ns[name] = importlib.import_module(entry["module"])
            elif entry["kind"] == "object":
                if name in loaded:
                    ns[name] = loaded[name]
                else:
                    unrestored[name] = failed.get(name, "not in the snapshot")
            else:
                unrestored[name] = entry.get("error", "not serialisable")
        except Exception as exc:
            unrestored[name] = f"{type(exc).__name__}: {exc}"[:300]
    _restore_history(shell, loaded)
    _result = json.dumps(
        {
            "failed": unrestored,
            "process_failed": problems,
            "bytes": manifest["stream"].get("size", 0),
            "seconds": time.perf_counter() - started,
        }
    )


def _close_files(ns: dict[str, Any]) -> None:
    """Before the snapshot is loaded again after a replay: close the files the first
    load opened, so what a replayed cell wrote through them lands now, before the
    reopened files are cut back to their size at the snapshot (not later, from a
    buffer flushed when the old object is collected)."""
    for value in list(ns.values()):
        if isinstance(value, io.IOBase) and not value.closed:
            with contextlib.suppress(Exception):  # in-memory files have no descriptor
                if value.fileno() > 2:
                    value.close()


def _restore_history(shell: Any, loaded: dict[str, Any]) -> None:
    hm = shell.history_manager
    ns = shell.user_ns
    hist = loaded.get(_HISTORY)
    if hist:
        hm.input_hist_parsed[:] = hist["parsed"]
        hm.input_hist_raw[:] = hist["raw"]
        for i, name in ((1, "_i"), (2, "_ii"), (3, "_iii")):
            if len(hist["parsed"]) > i - 1:
                ns[name] = hist["parsed"][-i]
        for n, source in enumerate(hist["parsed"]):
            if n:
                ns[f"_i{n}"] = source
    outs = sorted((int(k[len(_OUT) :]), v) for k, v in loaded.items() if k.startswith(_OUT))
    for n, value in outs:
        hm.output_hist[n] = value
        ns[f"_{n}"] = value
    hook = shell.displayhook
    for name, (_, value) in zip(("_", "__", "___"), reversed(outs[-3:]), strict=False):
        # the display hook moves _, __ and ___ on only while they are what it set
        ns[name] = value
        setattr(hook, name, value)
        if name in shell.user_ns_hidden:
            shell.user_ns_hidden[name] = value


def apply_last() -> str:
    """Stage LAST (random generators), and CONFIG again after replays; JSON of failures."""
    parts = _state.get("parts", {})
    failed = process_state.restore(parts, process_state.CONFIG)
    failed.update(process_state.restore(parts, process_state.LAST))
    return json.dumps(failed)


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
