"""A fake kernel for the real cell loop: the surface of ``attempt.executor.KernelSession``
(cells, outputs, the transport the kernel seam speaks over) in the test's own process.

It runs each cell's source with ``exec`` in a namespace of its own, and answers the
operations of ``spotbook.kernel.session`` the runner asks for on a fresh run (``init``,
the snapshots, ``accelerators``) by parsing the seam's call (``KERNEL_MODULE.op(literal,
...)``). A snapshot is always staged, as for a kernel that must not fork: its manifest
is written by a thread of this process, which waits for the test to open its
:class:`Script` gate first, so a test decides when each snapshot lands against the cells
that follow it (as httpx's ``MockTransport`` lets a test decide what a server answers).
Nothing here resumes: restoring needs the real kernel (the resume tests have it).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import json
import os
import pickle
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nbformat

from spotbook.attempt.executor import CellResult
from spotbook.attempt.kernel_ops import KERNEL_MODULE, KernelError
from spotbook.kernel import session as kernel_side


@dataclass
class Script:
    """What the test decides: when each snapshot's writer may write, what it meets, and
    what happens as each cell starts and ends."""

    # the snapshot after cell i is written once gates[i] is set (absent: at once)
    gates: dict[int, threading.Event] = field(default_factory=dict)
    # the snapshot after cell i fails in the writer with this error ("OSError: ..." is
    # storage, anything else is state that could not be pickled)
    fail: dict[int, str] = field(default_factory=dict)
    # awaited as cell i starts (before its code) and ends (after it), in the runner's loop
    before: Callable[[int], Awaitable[None]] | None = None
    after: Callable[[int], Awaitable[None]] | None = None
    writers: list[threading.Thread] = field(default_factory=list)
    # the FIFOs a writer asked with its cell waits at until the runner lets it go
    held: list[Any] = field(default_factory=list)
    # whether the kernel says it will never fork (as one that loaded torch does)
    lasting: bool = True

    def gate(self, index: int) -> threading.Event:
        return self.gates.setdefault(index, threading.Event())

    def open_all(self) -> None:
        for event in self.gates.values():
            event.set()
        for gate in self.held:  # one the runner let go reads its "go" first
            gate.drop()


def _operation(expression: str) -> tuple[str, list[Any]]:
    if not expression.startswith(KERNEL_MODULE + "."):
        raise NotImplementedError(f"the fake kernel evaluates only the seam's calls: {expression}")
    call = ast.parse(expression, mode="eval").body
    assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
    return call.func.attr, [ast.literal_eval(a) for a in call.args]


class FakeKernel:
    """Stands where ``KernelSession`` stands (``RunnerOptions.kernel_factory``)."""

    def __init__(self, nb: Any, *, script: Script, **_session_args: Any) -> None:
        self.nb = nb
        self.script = script
        self.ns: dict[str, Any] = {}
        self.count = 0
        self.language_info: dict[str, Any] = {"name": "python", "version": "3"}
        self.cell_expressions: dict[str, str] = {}
        self._running: tuple[int, list[Any]] | None = None
        self.stopped = False
        self.last = -1  # the notebook cell that finished last
        self.forks_asked = 0
        self.staged_with_cell = 0  # snapshots asked for with their cell's own request

    # -- the kernel's life ---------------------------------------------------------------
    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        self.stopped = True

    def kill_now(self) -> None:
        self.stopped = True

    # -- cells ---------------------------------------------------------------------------
    @property
    def running(self) -> int | None:
        return None if self._running is None else self._running[0]

    def live_outputs(self) -> tuple[int, list[Any]] | None:
        if self._running is None:
            return None
        index, outputs = self._running
        return index, [dict(o) for o in outputs]

    def widget_state(self) -> dict[str, Any] | None:
        return None

    def display_ids(self, index: int) -> dict[str, list[int]]:
        return {}

    def seed_cell(self, index: int, outputs: list[Any], display_ids: dict[str, list[int]]) -> None:
        pass

    def take_touched(self, current: int) -> set[int]:
        return set()

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
        # (its cells' loops are not resume points: the request's metadata asks nothing of
        # it; what a resumed cell had shown comes first, as in the real kernel)
        outputs = [dict(o) for o in outputs or ()]
        self._running = (index, outputs) if live else None
        try:
            if self.script.before is not None:
                await self.script.before(index)
            out = io.StringIO()
            error = None
            try:
                with contextlib.redirect_stdout(out):
                    exec(compile(str(cell.source), f"<cell {index}>", "exec"), self.ns)
            except Exception as exc:
                error = {"ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
            if out.getvalue():
                outputs.append(nbformat.v4.new_output("stream", name="stdout", text=out.getvalue()))
            if error is not None:
                outputs.append(nbformat.v4.new_output("error", **error))
            if self.script.after is not None:
                await self.script.after(index)
        finally:
            self._running = None
        self.count += store_history
        if live:
            self.last = index
        # as ipykernel: the user expressions asked with a cell, once its code raised nothing
        values = {}
        for key, expression in (expressions or {}).items() if error is None else ():
            try:
                value = await self.evaluate(expression)
                values[key] = {"status": "ok", "data": {"text/plain": repr(value)}}
            except KernelError as exc:
                values[key] = {"status": "error", "ename": exc.ename, "evalue": exc.evalue}
        return CellResult(
            outputs=outputs,
            execution_count=self.count if store_history else None,
            metadata={"execution": {}},
            error=error,
            reply={"status": "error" if error else "ok", "user_expressions": values},
        )

    async def replay_cell(self, index: int, execution_count: int | None = None) -> CellResult:
        raise NotImplementedError("the fake kernel does not resume")

    # -- the transport of the kernel seam -----------------------------------------------
    async def evaluate(self, expression: str, timeout: float | None = None) -> Any:
        name, args = _operation(expression)
        return getattr(self, f"op_{name}")(*args)

    async def call(self, code: str, result: str, timeout: float | None = None) -> Any:
        raise NotImplementedError("the fake kernel does not resume")

    # -- the kernel side's operations (their replies are JSON text, as the real ones) ---
    def op_init(self) -> str:
        return json.dumps({"reply_metadata": True, "snapshot_with_cell": True})

    def op_accelerators(self) -> str:
        return json.dumps({})

    def op_snapshot_estimate(self) -> str:
        return json.dumps({"bytes": len(pickle.dumps(self._state())), "unsafe": "a fake kernel"})

    def op_snapshot_fork(self, blob_dir: str, result_path: str) -> str:
        self.forks_asked += 1
        if self.script.lasting:
            return json.dumps({"unsafe": "a fake kernel", "lasting": True})
        return json.dumps({"unsafe": "a fake kernel, for now"})

    def op_snapshot(self, blob_dir: str) -> str:
        manifest = self._manifest(blob_dir, self._state(), self.last)
        if "error" in manifest:  # as the real transport reports an operation that raised
            ename, _, evalue = manifest["error"].partition(": ")
            raise KernelError(ename, evalue)
        return json.dumps(manifest)

    def op_snapshot_after_cell(self, blob_dir: str, result_path: str, begun: str, gate: str) -> str:
        self.staged_with_cell += 1
        with open(begun, "x"):
            pass
        return self.op_snapshot_staged(blob_dir, result_path, gate)

    def op_snapshot_staged(self, blob_dir: str, result_path: str, gate: str = "") -> str:
        index = self.last
        state = self._state()  # copied now, at the boundary
        held = kernel_side._Gate(gate) if gate else None  # the real kernel's gate
        if held is not None:
            self.script.held.append(held)

        def write() -> None:
            if held is not None and not held.wait():
                return  # the runner took no snapshot after that cell
            self.script.gate(index).wait()
            text = json.dumps(self._manifest(blob_dir, state, index))
            with open(f"{result_path}.tmp", "w") as fh:
                fh.write(text)
            os.replace(f"{result_path}.tmp", result_path)

        writer = threading.Thread(target=write, name=f"fake-writer-{index}", daemon=True)
        self.script.writers.append(writer)
        writer.start()
        return json.dumps({"pid": os.getpid(), "pause": 0.0, "staged": 0, "reused": 0})

    def _state(self) -> dict[str, Any]:
        return {k: v for k, v in self.ns.items() if not k.startswith("__")}

    def _manifest(self, blob_dir: str, state: dict[str, Any], index: int) -> dict[str, Any]:
        failure = self.script.fail.get(index)
        if failure is not None:
            return {"error": failure}
        data = pickle.dumps(state)
        digest = hashlib.sha256(data).hexdigest()
        imports = json.dumps([]).encode()
        imports_digest = hashlib.sha256(imports).hexdigest()
        os.makedirs(blob_dir, exist_ok=True)
        for name, blob in ((digest, data), (imports_digest, imports)):
            with open(os.path.join(blob_dir, name), "wb") as fh:
                fh.write(blob)
        return {
            "vars": {k: {"kind": "object", "type": type(v).__qualname__} for k, v in state.items()},
            "stream": {"stream": digest, "buffers": []},
            "env": {},
            "imports": imports_digest,
            "uncaptured": {},
            "threads": [],
            "new_blobs": [digest, imports_digest],
            "written": len(data) + len(imports),
            "state_bytes": len(data),
            "capture_seconds": 0.0,
            "seconds": 0.0,
        }
