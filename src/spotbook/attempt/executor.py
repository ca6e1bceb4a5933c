"""One kernel and the cells sent to it. The only module that imports nbclient
and jupyter_client.

The executor knows nothing of stores, snapshots or resume: it starts a kernel,
runs one cell at a time and reports what happened, and evaluates expressions
silently (no history, no execution count, no output) for the snapshot layer.
Time limits and signals are the caller's: ``run_cell`` is a coroutine the
runner can race against a deadline or a termination notice.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import copy
import datetime
import hmac
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from queue import Empty
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.adapter import adapt
from jupyter_client.jsonutil import parse_date
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_client.session import DELIM
from nbclient import NotebookClient
from nbclient.client import timestamp
from nbclient.exceptions import CellExecutionComplete

from .._errors import KernelNotFoundError, KernelStartError
from ..kernel.loops import CHECKPOINT_MIME
from .kernel_ops import KernelError, counter_at

log = logging.getLogger(__name__)

OutputCallback = Callable[[str, dict[str, Any]], None]


LoopCallback = Callable[[int, dict[str, Any], list[Any]], Awaitable[None]]


def _loop_message(msg: dict[str, Any]) -> dict[str, Any] | None:
    """What a cell's loop told the runner (:mod:`spotbook.kernel.loops`), or None."""
    if msg["msg_type"] != "display_data":
        return None
    said = (msg["content"].get("data") or {}).get(CHECKPOINT_MIME)
    return said if isinstance(said, dict) else None


class KernelDied(Exception):
    """Internal: the kernel process is gone."""


@dataclass
class CellResult:
    """What one cell produced."""

    outputs: list[Any]
    execution_count: int | None
    metadata: dict[str, Any]
    error: dict[str, Any] | None = None  # ename, evalue, traceback (a list of lines)
    allowed_error: bool = False
    reply: dict[str, Any] = field(default_factory=dict)
    reply_metadata: dict[str, Any] = field(default_factory=dict)


# nbclient's arguments a run may set (RunSpec.nbclient); record_timing and
# store_widget_state are always on
_CLIENT_ARGS = ("iopub_timeout", "extra_arguments")


class _Client(NotebookClient):
    """nbclient's client with a hook that sees each output as it arrives, a note
    of earlier cells whose displays a message updated, and stream text joined to
    the stream output just before it, as Jupyter's own frontends store it."""

    on_output: OutputCallback | None = None
    touched: set[int]

    def output(
        self, outs: list[Any], msg: dict[str, Any], display_id: str | None, cell_index: int
    ) -> Any:
        """Append text to the previous output when both are the same stream.

        The kernel flushes stdout on a timer, so one ``print`` can arrive as one
        message or as several depending on load; joined, a cell's saved outputs
        are the same however the flushes fell, and a resumed run's notebook
        matches an uninterrupted one. Order is kept: stdout and stderr are never
        reordered, and an output widget's capture or a pending
        ``clear_output(wait=True)`` take nbclient's usual path.
        """
        content = msg["content"]
        last = outs[-1] if outs else None
        if (
            msg["msg_type"] == "stream"
            and last is not None
            and last.get("output_type") == "stream"
            and last.get("name") == content.get("name")
            and not self.clear_before_next_output
            and not self.output_hook_stack[msg["parent_header"].get("msg_id")]
        ):
            last["text"] = "".join(last["text"]) + content.get("text", "")
            return last
        return super().output(outs, msg, display_id, cell_index)

    def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
        transient = msg["content"].get("transient") or {}
        display_id = transient.get("display_id")
        if display_id:
            self.touched.update(self._display_id_map.get(display_id, {}))
        out = super().process_message(msg, cell, cell_index)
        if self.on_output is not None and out is not None:
            self.on_output(msg["msg_type"], msg["content"])
        return out


REPOLL = 0.5  # seconds: the longest a channel read waits before polling its socket again


def _repoll(channel: Any) -> None:
    """Make a channel's reads wait in short polls instead of one long one.

    Under CPU load, an asyncio wait on a ZeroMQ socket sometimes misses the wake-up
    for a message that has already arrived (its file descriptor is edge-triggered),
    and a read without a timeout then waits forever: raw nbclient stalls on
    nbclient's own Output.ipynb test notebook in half of its runs on a loaded
    2-core machine, and only its cell timeout ends the stall. Polling again every
    ``REPOLL`` seconds asks the socket itself, which finds the message.
    """
    read = channel.get_msg

    async def get_msg(timeout: float | None = None) -> Any:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = REPOLL if deadline is None else max(0.0, deadline - loop.time())
            try:
                return await read(timeout=min(REPOLL, left))
            except Empty:
                if deadline is not None and loop.time() >= deadline:
                    raise

    channel.get_msg = get_msg


def _date(header: dict[str, Any]) -> dict[str, Any]:
    """A header's ISO 8601 ``date`` as a datetime, as jupyter_client gives it (its own
    parser, dateutil's, costs more than the rest of decoding a message)."""
    value = header.get("date")
    if isinstance(value, str):
        try:
            header["date"] = datetime.datetime.fromisoformat(value)
        except ValueError:
            header["date"] = parse_date(value)
    return header


class _Wire:
    """The shell and IOPub sockets of a kernel client, read without waiting.

    A cell's messages are read here rather than by nbclient's loop (three tasks, a timer
    and a wait per cell, on top of jupyter_client's decoding): one poll of both sockets,
    then every message either holds is taken at once. The sockets are edge-triggered, so
    a wake-up can be missed under load; a poll never waits longer than ``REPOLL`` before
    the sockets are read again, which finds what such a wake-up missed.
    """

    def __init__(self, kc: Any) -> None:
        self.session = kc.session
        self.shell: zmq.Socket[bytes] = zmq.Socket.shadow(kc.shell_channel.socket.underlying)
        self.iopub: zmq.Socket[bytes] = zmq.Socket.shadow(kc.iopub_channel.socket.underlying)
        self.poller = zmq.asyncio.Poller()
        self.poller.register(kc.shell_channel.socket, zmq.POLLIN)
        self.poller.register(kc.iopub_channel.socket, zmq.POLLIN)

    def take(self, sock: zmq.Socket[bytes]) -> dict[str, Any] | None:
        """The next message on ``sock``, decoded and its signature checked, or None."""
        if not int(sock.get(zmq.EVENTS)) & zmq.POLLIN:  # (cheaper than an Again raised)
            return None
        try:
            parts = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None
        return self.decode(parts)

    def decode(self, parts: list[bytes]) -> dict[str, Any]:
        """jupyter_client's ``Session.deserialize``: signature (and replay) check, the
        four JSON frames, the header dates, the protocol adaptation."""
        session = self.session
        parts = parts[parts.index(DELIM) + 1 :]
        if len(parts) < 5:
            raise ValueError(f"malformed kernel message: {len(parts)} frames")
        if session.auth is not None:
            signature = parts[0]
            if signature in session.digest_history:
                raise ValueError(f"duplicate signature on a kernel message: {signature!r}")
            digest = session.auth.copy()
            for frame in parts[1:5]:
                digest.update(frame)
            if not hmac.compare_digest(signature, digest.hexdigest().encode()):
                raise ValueError(f"invalid signature on a kernel message: {signature!r}")
            session._add_digest(signature)
        header = _date(json.loads(parts[1]))
        msg = {
            "header": header,
            "msg_id": header["msg_id"],
            "msg_type": header["msg_type"],
            "parent_header": _date(json.loads(parts[2])),
            "metadata": json.loads(parts[3]),
            "content": json.loads(parts[4]),
            "buffers": [memoryview(b) for b in parts[5:]],
        }
        result: dict[str, Any] = adapt(msg)
        return result


_TIMING = ("iopub.status.busy", "iopub.execute_input", "shell.execute_reply", "iopub.status.idle")


def _timing_in_order(cell: Any) -> None:
    """The cell's timing metadata in the order the kernel sends them, whichever of its
    two sockets was read first (a notebook's bytes should not depend on that)."""
    timing = cell.metadata["execution"]
    ordered = {k: timing[k] for k in _TIMING if k in timing}
    ordered.update(timing)
    cell.metadata["execution"] = ordered


# An AF_UNIX socket's path holds 107 bytes on Linux (103 on macOS); a margin below both.
_SOCKET_PATH_MAX = 100


def _socket_dir() -> str | None:
    """A private folder for the kernel's IPC sockets whose paths fit an AF_UNIX address:
    under $TMPDIR, else /tmp or /dev/shm (a deep $TMPDIR — a pod's, a CI worker's — would
    make the kernel's first connect fail with "File name too long"); None where none fits."""
    for where in (None, "/tmp", "/dev/shm"):
        if where is not None and not os.path.isdir(where):
            continue
        with contextlib.suppress(OSError):
            d = tempfile.mkdtemp(prefix="spotbook-kernel-", dir=where)
            if len(os.path.join(d, "kernel-99").encode()) <= _SOCKET_PATH_MAX:
                return d
            os.rmdir(d)
    return None


class KernelSession:
    """A started kernel and a client to it."""

    def __init__(
        self,
        nb: Any,
        *,
        kernel_name: str,
        cwd: str | None,
        start_timeout: float,
        env: dict[str, str],
        on_output: OutputCallback | None = None,
        allow_errors: bool = False,
        nbclient: dict[str, Any] | None = None,
    ) -> None:
        # --allow-errors: every cell may fail, as one tagged raises-exception may
        self._allow_errors = allow_errors
        self._client = _Client(
            nb,
            kernel_name=kernel_name,
            timeout=None,
            startup_timeout=max(1, int(start_timeout)),
            allow_errors=True,
            shutdown_kernel="immediate",
            record_timing=True,
            # the run's nbclient arguments (RunSpec.nbclient) that change what it does
            **{k: v for k, v in (nbclient or {}).items() if k in _CLIENT_ARGS},
        )
        self._client.on_output = on_output
        self._client.touched = set()
        self._wire: _Wire | None = None
        self._kernel_name = kernel_name
        self._cwd = cwd
        self._env = env
        self._ipc_dir: str | None = None
        # evaluated after every cell, in the cell's own reply (no extra round trip)
        self.cell_expressions: dict[str, str] = {}
        self._running: tuple[int, Any] | None = None  # the notebook cell running now
        # hears what a cell's loops tell the runner (a checkpoint written): the cell, what
        # the kernel said, the cell's outputs up to that moment
        self.on_loop: LoopCallback | None = None
        self.language_info: dict[str, Any] = {}

    async def start(self) -> None:
        client = self._client
        specs = kernel_specs()
        check_kernel(self._kernel_name, specs)
        try:
            client.km = client.kernel_manager_class(
                kernel_name=self._kernel_name, kernel_spec_manager=specs, config=client.config
            )
            # IPC sockets: local only, no plain-text TCP ports, no warning from ipykernel;
            # on loopback TCP where no temporary folder has a path short enough for them
            self._ipc_dir = _socket_dir()
            if self._ipc_dir is not None:
                client.km.transport = "ipc"
                client.km.ip = os.path.join(self._ipc_dir, "kernel")
            await client.async_start_new_kernel(cwd=self._cwd, env=self._env)
        except NoSuchKernel as exc:
            available = list(specs.find_kernel_specs())
            raise KernelNotFoundError(self._kernel_name, available) from exc
        except FileNotFoundError as exc:
            raise KernelStartError(f"cannot start kernel {self._kernel_name!r}: {exc}") from exc
        try:
            await client.async_start_new_kernel_client()
            for channel in (self._kc.shell_channel, self._kc.iopub_channel):
                _repoll(channel)
            self._wire = _Wire(self._kc)
        except RuntimeError as exc:
            raise KernelStartError(
                f"kernel {self._kernel_name!r} did not answer within the start timeout "
                f"({client.startup_timeout} s); raise --start-timeout or check the kernel: {exc}"
            ) from exc
        msg_id = self._kc.kernel_info()
        reply = await self._reply(msg_id, timeout=float(client.startup_timeout))
        self.language_info = dict(reply["content"].get("language_info") or {})

    @property
    def _kc(self) -> Any:
        return self._client.kc

    @property
    def _km(self) -> Any:
        return self._client.km

    @property
    def running(self) -> int | None:
        """The notebook cell running now (not a replay); None between cells."""
        return None if self._running is None else self._running[0]

    def live_outputs(self) -> tuple[int, list[Any]] | None:
        """The cell running now and its outputs so far (a copy), for OUTPUT as it grows;
        None between cells and during replays."""
        running = self._running
        if running is None:
            return None
        index, cell = running
        return index, [dict(o) for o in cell.get("outputs", [])]

    async def run_cell(
        self,
        cell: Any,
        index: int,
        store_history: bool = True,
        live: bool = True,
        expressions: dict[str, str] | None = None,
        request: dict[str, Any] | None = None,
        outputs: list[Any] | None = None,
    ) -> CellResult:
        """Execute one cell. Errors in the cell are results, not exceptions. ``live``: its
        outputs so far are the notebook's (``live_outputs``); a replay's are not.
        ``expressions``: user expressions asked with this cell besides ``cell_expressions``
        (evaluated after its code if that raised nothing; their values in ``reply``).
        ``request``: metadata of the execute request (what the kernel's loops are asked to
        do: :mod:`spotbook.kernel.loops`); ``outputs``: what the cell had shown before
        (a cell resumed inside a loop goes on from them)."""
        client = self._client
        cell.metadata["execution"] = {}
        content = {
            "code": cell.source,
            "silent": False,
            "store_history": store_history,
            "user_expressions": {**self.cell_expressions, **(expressions or {})},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        msg = self._kc.session.msg("execute_request", content, metadata=request or {})
        self._kc.shell_channel.send(msg)
        msg_id = msg["header"]["msg_id"]
        cell.outputs = [dict(o) for o in outputs or ()]
        client.clear_before_next_output = False
        self._running = (index, cell) if live else None
        try:
            reply = await self._pump(msg_id, cell, index)
        finally:
            self._running = None
        client.nb.cells[index] = cell
        content = reply.get("content", {})
        error = None
        if content.get("status") == "error":
            ename, evalue = content.get("ename"), content.get("evalue")
            traceback = content.get("traceback")
            shown = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            if ename in (None, "NoneType") and shown:
                # An error raised while IPython displayed the result (a broken __repr__)
                # leaves the reply without a name; the cell's error output has it.
                ename, evalue = shown[-1].get("ename"), shown[-1].get("evalue")
                traceback = shown[-1].get("traceback")
            error = {
                "ename": str(ename or "Error"),
                "evalue": str(evalue or ""),
                "traceback": [str(line) for line in traceback or []],
            }
        return CellResult(
            outputs=list(cell.get("outputs", [])),
            execution_count=cell.get("execution_count"),
            metadata={"execution": dict(cell.metadata.get("execution", {}))},
            error=error,
            allowed_error=self._allow_errors or "raises-exception" in cell.metadata.get("tags", []),
            reply=content,
            reply_metadata=reply.get("metadata") or {},
        )

    async def _pump(self, msg_id: str, cell: Any, index: int) -> dict[str, Any]:
        """Read the kernel's messages until cell ``msg_id`` has replied and gone idle;
        its IOPub messages become the cell's outputs (nbclient's ``process_message``).
        Returns the execute reply. After the reply, the idle status is awaited for
        nbclient's ``iopub_timeout`` at most, as nbclient does."""
        wire = self._wire
        assert wire is not None
        client = self._client
        loop = asyncio.get_running_loop()
        reply: dict[str, Any] | None = None
        idle = False
        idle_by: float | None = None
        alive_at = loop.time() + 1.0
        while True:
            while not idle and (msg := wire.take(wire.iopub)) is not None:
                if msg["parent_header"].get("msg_id") == msg_id:
                    said = _loop_message(msg)
                    if said is not None:  # the kernel's word to the runner, not an output
                        if self.on_loop is not None:
                            await self.on_loop(index, said, copy.deepcopy(cell.outputs))
                        continue
                    try:
                        client.process_message(msg, cell, index)
                    except CellExecutionComplete:
                        idle = True
            while reply is None and (msg := wire.take(wire.shell)) is not None:
                if msg["parent_header"].get("msg_id") == msg_id:
                    reply = msg
                    cell.metadata["execution"]["shell.execute_reply"] = timestamp(msg)
            if reply is not None and idle:
                _timing_in_order(cell)
                return reply
            now = loop.time()
            if reply is not None:
                if idle_by is None:
                    idle_by = now + client.iopub_timeout
                elif now >= idle_by:
                    log.warning("timeout waiting for the kernel's IOPub output of cell %d", index)
                    _timing_in_order(cell)
                    return reply
            if now >= alive_at:
                if not await self._km.is_alive():
                    raise KernelDied("the kernel process died")
                alive_at = now + 1.0
            await wire.poller.poll(int(REPOLL * 1000))

    def widget_state(self) -> dict[str, Any] | None:
        """Widget state for the notebook's metadata, as nbclient records it."""
        self._client.set_widgets_metadata()
        state = self._client.nb.metadata.get("widgets")
        return dict(state) if state else None

    def display_ids(self, index: int) -> dict[str, list[int]]:
        """Which outputs of cell ``index`` carry which display id (for later updates)."""
        return {
            did: list(cells[index])
            for did, cells in self._client._display_id_map.items()
            if cells.get(index)
        }

    def seed_cell(self, index: int, outputs: list[Any], display_ids: dict[str, list[int]]) -> None:
        """On resume: put a finished cell's outputs back so later display updates reach it."""
        self._client.nb.cells[index].outputs = outputs
        for did, idxs in display_ids.items():
            self._client._display_id_map.setdefault(did, {})[index] = list(idxs)

    def take_touched(self, current: int) -> set[int]:
        """Earlier cells whose outputs a display update changed since the last call."""
        touched = self._client.touched - {current}
        self._client.touched = set()
        return touched

    async def replay_cell(self, index: int, execution_count: int | None = None) -> CellResult:
        """Run cell ``index`` again to rebuild kernel state; its outputs are discarded.

        The notebook's recorded outputs and display-id links stay as they were: a
        scratch copy runs, and display updates cannot reach other cells meanwhile.
        With ``execution_count`` it runs under its first number and into IPython's
        history (``In``, ``Out``, ``_``) as it did the first time.
        """
        client = self._client
        original = client.nb.cells[index]
        links = client._display_id_map
        client._display_id_map = {}
        scratch = copy.deepcopy(original)
        scratch.outputs = []
        try:
            if execution_count:
                await self.evaluate(counter_at(execution_count))
            return await self.run_cell(
                scratch, index, store_history=bool(execution_count), live=False
            )
        finally:
            client.nb.cells[index] = original
            client._display_id_map = links
            client.touched = set()

    async def _reply(self, msg_id: str, timeout: float | None) -> dict[str, Any]:
        kc = self._kc
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            wait = 1.0 if deadline is None else min(1.0, max(0.0, deadline - loop.time()))
            try:
                msg: dict[str, Any] = await kc.shell_channel.get_msg(timeout=wait)
            except Empty:
                if not await kc.is_alive():
                    raise KernelDied("kernel died") from None
                if deadline is not None and loop.time() >= deadline:
                    raise TimeoutError("no reply from the kernel") from None
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg

    async def evaluate(self, expression: str, timeout: float | None = None) -> Any:
        """Evaluate a Python expression silently in the kernel; return its value.

        The value must be a literal (str, number, ...): it comes back as its repr.
        Raises KernelError (a RuntimeError) with the kernel's error if evaluation failed.
        """
        kc = self._kc
        msg_id = kc.execute(
            "", silent=True, store_history=False, user_expressions={"r": expression}
        )
        reply = await self._reply(msg_id, timeout)
        result = reply["content"].get("user_expressions", {}).get("r", {})
        if result.get("status") != "ok":
            raise KernelError(result.get("ename"), result.get("evalue"))
        return ast.literal_eval(result["data"]["text/plain"])

    async def call(self, code: str, result: str, timeout: float | None = None) -> Any:
        """Run ``code`` silently as a cell would run (inside IPython's ``run_cell``, so
        imports see the kernel as a cell's imports do), then evaluate ``result``.

        Nothing reaches the notebook: no history, no execution count, no output.
        Raises KernelError (a RuntimeError) with the kernel's error if either failed.
        """
        kc = self._kc
        msg_id = kc.execute(code, silent=True, store_history=False, user_expressions={"r": result})
        reply = await self._reply(msg_id, timeout)
        content = reply["content"]
        if content.get("status") != "ok":
            raise KernelError(content.get("ename"), content.get("evalue"))
        value = content.get("user_expressions", {}).get("r", {})
        if value.get("status") != "ok":
            raise KernelError(value.get("ename"), value.get("evalue"))
        return ast.literal_eval(value["data"]["text/plain"])

    def kill_now(self) -> None:
        """Kill the kernel process at once (from any thread): the process is leaving."""
        proc = getattr(getattr(self._client.km, "provisioner", None), "process", None)
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()

    async def shutdown(self) -> None:
        client = self._client
        if client.km is None:
            return
        try:
            await client._async_cleanup_kernel()
        except Exception as exc:  # shutting down must never hide the run's own outcome
            log.debug("kernel cleanup failed: %s", exc)
        if self._ipc_dir:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)


def kernel_specs() -> KernelSpecManager:
    """jupyter_client's kernelspec finder, with the folders it searches given: its default
    adds IPython's ``kernels`` folder by importing IPython, which costs every ``spotbook
    run`` about 0.1 s of its start (a resume imports IPython anyway, to read cells)."""
    from jupyter_core.paths import jupyter_path

    ipython_dir = os.environ.get("IPYTHONDIR") or os.path.join(os.path.expanduser("~"), ".ipython")
    dirs = [*jupyter_path("kernels"), os.path.join(os.path.expanduser(ipython_dir), "kernels")]
    return KernelSpecManager(kernel_dirs=dirs)


def check_kernel(name: str, specs: KernelSpecManager | None = None) -> None:
    """Raise KernelNotFoundError (exit 2) unless a kernelspec ``name`` is installed."""
    specs = specs or kernel_specs()
    try:
        specs.get_kernel_spec(name)
    except NoSuchKernel as exc:
        raise KernelNotFoundError(name, list(specs.find_kernel_specs())) from exc


# The run key vouches for the store; the notebook has no use for it, and its
# environment can end up in snapshots, outputs and logs.
_PRIVATE_ENV = ("SPOTBOOK_SNAPSHOT_KEY", "SPOTBOOK_SNAPSHOT_KEY_FILE")


def kernel_env(extra: dict[str, str]) -> dict[str, str]:
    """The kernel's environment: this process's, less the run's secrets, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}
    env.update(extra)
    return env


def python_transform(source: str) -> str:
    """IPython syntax (magics, ``!cmd``) as plain Python, for static analysis."""
    from IPython.core.inputtransformer2 import TransformerManager

    result: str = TransformerManager().transform_cell(source)
    return result
