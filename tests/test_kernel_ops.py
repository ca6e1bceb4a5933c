"""The kernel seam (attempt/kernel_ops.py): every request the runner sends the kernel is
a call of an operation kernel/session.py has, with literal arguments, and its reply is
decoded there. A transport that records the requests stands in for the kernel here (the
real kernel answers them in every resume test)."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spotbook.attempt import kernel_ops
from spotbook.attempt.kernel_ops import (
    KERNEL_MODULE,
    KernelError,
    KernelOps,
    counter_at,
    storage_failure,
)
from spotbook.kernel import session as kernel_side


class Recorder:
    """A transport that records each request and answers it from ``replies``."""

    def __init__(self, replies: dict[str, Any]) -> None:
        self.replies = replies
        self.sent: list[tuple[str, str | None]] = []

    def _answer(self, expression: str) -> Any:
        operation = expression[len(KERNEL_MODULE) + 1 :].split("(", 1)[0]
        return self.replies[operation]

    async def evaluate(self, expression: str, timeout: float | None = None) -> Any:
        self.sent.append((expression, None))
        return self._answer(expression)

    async def call(self, code: str, result: str, timeout: float | None = None) -> Any:
        self.sent.append((code, result))
        return self._answer(result)


def _operation(expression: str) -> tuple[str, list[Any]]:
    """The kernel-side function an expression calls, and its arguments (literals only)."""
    assert expression.startswith(KERNEL_MODULE + "."), expression
    call = ast.parse(expression, mode="eval").body
    assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
    return call.func.attr, [ast.literal_eval(a) for a in call.args]


CALLS: list[tuple[str, tuple[Any, ...], str]] = [
    ("init", (), '{"reply_metadata": true}'),
    ("accelerators", (), "{}"),
    ("snapshot_estimate", (), '{"bytes": 10, "unsafe": ""}'),
    ("snapshot", ("/b",), '{"written": 1}'),
    ("snapshot_fork", ("/b", "/r.json"), '{"pid": 12}'),
    ("snapshot_staged", ("/b", "/r.json"), '{"pid": 12}'),
    ("restore_env", ({"cwd": "/w"},), "{}"),
    ("missing_modules", ("/b", "ab12"), '["torch"]'),
    ("not_installed", (["lightgbm"],), "[]"),
    ("set_pre", ({"rng": {}},), "{}"),
    ("apply_last", (), '{"rng": "gone"}'),
]


@pytest.mark.parametrize(("method", "args", "reply"), CALLS, ids=[c[0] for c in CALLS])
def test_each_operation_is_one_call_of_the_kernel_side_with_literals(
    method: str, args: tuple[Any, ...], reply: str
) -> None:
    recorder = Recorder({method: reply})
    got = asyncio.run(getattr(KernelOps(recorder), method)(*args))
    assert got == json.loads(reply)  # decoded here, not by the caller
    ((expression, _),) = recorder.sent
    name, sent = _operation(expression)
    assert name == method and hasattr(kernel_side, name)
    # documents travel as JSON text, the rest as they are
    assert len(sent) == len(args)
    decoded = [
        json.loads(s) if isinstance(a, dict | list) else s for a, s in zip(args, sent, strict=True)
    ]
    assert decoded == list(args)


def test_operations_run_as_a_cell_read_their_result_in_the_same_request() -> None:
    recorder = Recorder({"result": '{"failed": {}, "bytes": 3}'})
    ops = KernelOps(recorder)
    got = asyncio.run(ops.restore("/b", {"vars": {}, "stream": {}}, ("x",)))
    assert got == {"failed": {}, "bytes": 3}
    ((code, result),) = recorder.sent
    assert _operation(code) == ("restore", ["/b", '{"vars": {}, "stream": {}}', ("x",)])
    assert result is not None and _operation(result) == ("result", [])
    recorder.replies["result"] = '["numpy"]'
    assert asyncio.run(ops.reimport("/b", "ab12")) == ["numpy"]


def test_every_operation_the_seam_names_is_on_the_kernel_side() -> None:
    source = inspect.getsource(kernel_ops)
    named = {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("_call", "_json", "_run")
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    assert {"init", "snapshot", "restore", "result", "cell_effects"} <= named
    assert all(isinstance(n, str) and callable(getattr(kernel_side, n, None)) for n in named)


def test_only_literals_reach_the_kernel() -> None:
    with pytest.raises(TypeError, match="is not passed to the kernel"):
        asyncio.run(KernelOps(Recorder({})).snapshot(object()))  # type: ignore[arg-type]
    assert ast.literal_eval(counter_at(7).split(", ")[1].rstrip(")")) == 7


def test_a_kernel_error_says_whether_it_was_storage() -> None:
    assert storage_failure(KernelError("OSError", "[Errno 28] No space left on device"))
    assert storage_failure(KernelError("PermissionError", "denied"))
    assert not storage_failure(KernelError("PicklingError", "cannot pickle lock"))
    assert not storage_failure(KernelError("NoSuchError", "x"))
    assert storage_failure(RuntimeError("OSError: disk full"))  # text of a fork's failure


def test_a_snapshot_asked_with_a_cell_is_a_user_expression_decoded_or_its_error() -> None:
    expression = KernelOps.snapshot_after_cell("/b", "/r.json", "/r.json.begun", "/r.json.go")
    assert _operation(expression) == (
        "snapshot_after_cell",
        ["/b", "/r.json", "/r.json.begun", "/r.json.go"],
    )
    assert hasattr(kernel_side, "snapshot_after_cell")
    # as ipykernel puts a user expression's value, or its error, into the cell's reply
    ok = {"status": "ok", "data": {"text/plain": repr('{"pid": 12, "pause": 0.01}')}}
    assert KernelOps.expression_answer(ok) == {"pid": 12, "pause": 0.01}
    failed = {"status": "error", "ename": "OSError", "evalue": "disk full", "traceback": []}
    error = KernelOps.expression_answer(failed)
    assert isinstance(error, KernelError) and storage_failure(error)
    garbled = KernelOps.expression_answer({"status": "ok", "data": {"text/plain": "'{'"}})
    assert isinstance(garbled, KernelError)
    # not evaluated (the cell raised): nothing was taken
    assert KernelOps.expression_answer(None) is None
    assert KernelOps.expression_answer({}) is None


def test_the_writer_of_a_snapshot_asked_with_its_cell_waits_at_its_gate(tmp_path: Path) -> None:
    """The kernel's writer waits until the runner lets it go (or drops it); the runner's
    word never blocks, nor fails where the kernel is gone."""
    import threading

    answers: list[bool] = []
    for go in (True, False):
        gate = kernel_side._Gate(str(tmp_path / f"gate-{go}"))
        waiter = threading.Thread(target=lambda g=gate: answers.append(g.wait()))
        waiter.start()
        assert waiter.is_alive()  # nothing said yet: it waits
        KernelOps.release_writer(gate.path, go=go)
        waiter.join(timeout=30)
        gate.close()
        assert not os.path.exists(gate.path)
    assert answers == [True, False]
    # said before the writer reads, it is read all the same; the kernel drops it itself
    gate = kernel_side._Gate(str(tmp_path / "early"))
    KernelOps.release_writer(gate.path, go=True)
    gate.drop()  # what a next snapshot does: the "go" said first is what is read
    assert gate.wait()
    gate.close()
    KernelOps.release_writer(gate.path, go=True)  # gone: nothing happens


def test_only_streams_that_tag_each_write_let_a_snapshot_ride_with_its_cell() -> None:
    import io

    class Tagging(io.StringIO):
        def set_thread_parent(self, parent: Any) -> Any:
            return parent

        def reset_thread_parent(self, token: Any) -> None:
            pass

    assert kernel_side._tags_writes(Tagging())
    # a plain stream, or ipykernel 6's (tagged at flush): asked for on its own, as before
    assert not kernel_side._tags_writes(io.StringIO())


_FORK_ASKED = """
import json, sys, threading, types
from spotbook.kernel import session
stop = threading.Event()
threading.Thread(target=stop.wait, name="waiter", daemon=True).start()
print(session.snapshot_fork("/nonexistent/blobs", "/nonexistent/r.json"))
sys.modules["lightgbm"] = types.ModuleType("lightgbm")  # as once imported by a cell
print(session.snapshot_fork("/nonexistent/blobs", "/nonexistent/r.json"))
"""


def test_the_kernel_says_when_it_will_never_fork() -> None:
    # in a process of its own (the kernel side's modules only): the notebook's threads
    # may end, a loaded native thread pool stays (the runner then stops asking to fork)
    r = subprocess.run(
        [sys.executable, "-c", _FORK_ASKED], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    threads, pool = (json.loads(line) for line in r.stdout.splitlines())
    assert "lasting" not in threads and "waiter" in threads["unsafe"], threads
    assert pool["lasting"] is True and pool["unsafe"].startswith("lightgbm is loaded")


_STAGED_AFTER_REPLY = """
import asyncio, json, os
from IPython.core.interactiveshell import InteractiveShell
from spotbook.kernel import session
InteractiveShell.instance().user_ns["x"] = list(range(100_000))
d = {d!r}
def staged(name):
    session.snapshot_staged(os.path.join(d, "blobs"), os.path.join(d, name))
async def main():
    staged("r1.json")
    waited = session._writer.ident is None
    staged("r2.json")  # asked again before the loop turned: the first is written first
    first = os.path.exists(os.path.join(d, "r1.json"))
    await asyncio.sleep(0)
    session._writer.join()
    return [waited, first, os.path.exists(os.path.join(d, "r2.json"))]
print(json.dumps(asyncio.run(main())))
staged("r3.json")  # no event loop: at once
print(json.dumps(session._writer.ident is not None))
"""


def test_a_staged_snapshots_writer_starts_once_the_reply_is_sent(tmp_path: Any) -> None:
    """In the kernel the writer thread starts at the event loop's next turn, after the
    reply is sent (it would compete with the sending for the interpreter); a second
    staged snapshot asked for before that starts and waits for it; with no loop running,
    it starts at once."""
    r = subprocess.run(
        [sys.executable, "-c", _STAGED_AFTER_REPLY.format(d=str(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    in_loop, without = (json.loads(line) for line in r.stdout.splitlines())
    assert in_loop == [True, True, True] and without is True, r.stdout
