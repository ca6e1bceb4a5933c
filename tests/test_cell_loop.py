"""The real cell loop, snapshots and commit order (attempt/cells.py, snapshots.py,
commit_order.py) over the fake kernel (tests/fakekernel.py), which lets a test decide when
each background snapshot lands against the cells after it. The invariant: a cell's record
is never in the store before the snapshot that follows it, whatever the interleaving.
(The real kernel keeps it in test_background.py and under the fidelity matrix's kills;
this suite reaches the interleavings a real kernel makes only by chance.)

No resume here: the fake kernel cannot restore state, and nothing is killed. What a
resume on a wiped node makes of these stores is test_background.py's and
test_node_loss.py's (with the real kernel)."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spotbook import SnapshotMode, SnapshotPolicy
from spotbook._api import prepare_run
from spotbook._errors import StorageError, Terminated
from spotbook.attempt import cells as cell_loop
from spotbook.attempt.context import RunnerOptions
from spotbook.attempt.runner import Runner
from spotbook.store.runstore import CellKey, RunStore

from .fakekernel import FakeKernel, Script
from .nbwrite import write_notebook

Event = tuple[str, int]  # ("record" | "snapshot", cell), in the order the store got them


class Run:
    """A run of ``n`` cells in a fresh local store, every cell snapshotted in the
    background, with what reaches the store recorded as it happens."""

    def __init__(self, tmp_path: Path, n: int) -> None:
        self.n = n
        tmp_path.mkdir(parents=True, exist_ok=True)
        write_notebook(
            tmp_path / "nb.ipynb", *(f"x{i} = {i}\nprint('cell', {i})" for i in range(n))
        )
        self.store = prepare_run(
            str(tmp_path / "nb.ipynb"),
            str(tmp_path / "out.ipynb"),
            cwd=str(tmp_path),
            run_dir=str(tmp_path / "rd"),
            snapshot=SnapshotPolicy(mode=SnapshotMode.EVERY_CELL),
        )
        self.events: list[Event] = []
        self.landed: dict[int, asyncio.Event] = {}
        self.script = Script()
        self._spy(self.store)
        self.runner = Runner.open(
            self.store,
            RunnerOptions(
                kernel_factory=functools.partial(FakeKernel, script=self.script),
                handle_signals=False,
            ),
        )

    def _spy(self, store: RunStore) -> None:
        write_cell, write_snapshot = store.write_cell, store.write_snapshot

        def cell(index: int, attempt: int, record: dict[str, Any]) -> None:
            write_cell(index, attempt, record)
            if record.get("status") != "executed":  # a note, not a record
                self.events.append(("record", index))

        def snapshot(key: CellKey, doc: dict[str, Any]) -> None:
            write_snapshot(key, doc)
            self.events.append(("snapshot", key.index))
            self.landed_event(key.index).set()

        store.write_cell = cell  # type: ignore[method-assign]
        store.write_snapshot = snapshot  # type: ignore[method-assign]

    def landed_event(self, index: int) -> asyncio.Event:
        return self.landed.setdefault(index, asyncio.Event())

    def committed(self, kind: str) -> list[int]:
        return [i for k, i in self.events if k == kind]

    def check(self, given_up: frozenset[int] = frozenset()) -> None:
        """No record before the snapshot after its cell (the last cell has none; one
        ``given_up`` at the notice's deadline lets its records go without it)."""
        for at, (kind, index) in enumerate(self.events):
            if kind == "record" and index < self.n - 1 and index not in given_up:
                assert ("snapshot", index) in self.events[:at], self.events

    def go(self) -> BaseException | None:
        """Run the attempt; what it raised. Every gate opens afterwards (a writer the
        run gave up on ends), and if the run has not ended after a minute: a run that
        waits forever on a snapshot then fails the test instead of hanging it."""
        guard = threading.Timer(60.0, self.script.open_all)
        guard.start()
        try:
            asyncio.run(self.runner.arun())
        except BaseException as exc:
            return exc
        finally:
            guard.cancel()
            self.script.open_all()
            for writer in self.script.writers:
                writer.join()
            for gate in self.script.held:
                gate.close()
        return None

    def on_disk(self) -> tuple[list[int], list[int]]:
        """The records and snapshots a new reader of the store finds."""
        reader = RunStore(self.store.url)
        reader.unseal()
        records, _ = reader.records_and_notes()
        return sorted(records), sorted(reader.snapshot_keys())


Plan = Callable[[Run, int], None]


def test_no_record_reaches_the_store_before_its_snapshot_whatever_the_interleaving(
    tmp_path: Path,
) -> None:
    for seed in range(24):
        rng = random.Random(seed)
        run = Run(tmp_path / str(seed), rng.randint(3, 7))
        # when the writer of the snapshot after each cell may write: at once, as the
        # next cell starts (which then waits until it has landed), or as it ends
        plans = {i: rng.choice(["now", "start", "end"]) for i in range(run.n - 1)}
        for i, plan in plans.items():
            if plan == "now":
                run.script.gate(i).set()

        async def before(index: int, run: Run = run, plans: dict[int, str] = plans) -> None:
            run.check()
            prev = index - 1
            if plans.get(prev) == "start":
                assert ("record", prev) not in run.events  # held behind its snapshot
                run.script.gate(prev).set()
                await run.landed_event(prev).wait()
                # the held record commits the moment its snapshot is in, mid-cell
                assert run.events[-2:] == [("snapshot", prev), ("record", prev)], run.events

        async def after(index: int, run: Run = run, plans: dict[int, str] = plans) -> None:
            run.check()
            if plans.get(index - 1) == "end":
                assert ("record", index - 1) not in run.events
                run.script.gate(index - 1).set()

        run.script.before, run.script.after = before, after
        assert run.go() is None, plans
        run.check()
        assert sorted(run.committed("record")) == list(range(run.n)), (seed, run.events)
        assert sorted(run.committed("snapshot")) == list(range(run.n - 1)), (seed, run.events)
        assert run.on_disk() == (list(range(run.n)), list(range(run.n - 1)))


def test_a_snapshot_the_store_cannot_take_drops_the_records_behind_it(tmp_path: Path) -> None:
    run = Run(tmp_path, 4)
    run.script.fail[1] = "OSError: [Errno 28] No space left on device"

    async def after(index: int) -> None:
        if index == 2:  # cell 2's record is held behind the snapshot after cell 1 too
            run.script.gate(1).set()

    run.script.gate(0).set()
    run.script.after = after
    exc = run.go()
    assert isinstance(exc, StorageError), exc
    assert "No space left on device" in str(exc) and "spotbook resume" in str(exc)
    run.check()
    # cells 1 and 2 run again on resume: neither record was committed
    assert run.committed("record") == [0] and run.committed("snapshot") == [0], run.events
    assert run.on_disk() == ([0], [0])
    assert run.runner.journal.attempt_rec["outcome"] == "storage-error"


@pytest.mark.parametrize("lands", ["before cell 2 ends", "as the loop waits after cell 2"])
def test_state_that_cannot_be_pickled_turns_snapshots_off_and_the_run_goes_on(
    tmp_path: Path, lands: str
) -> None:
    # the failure of the snapshot after cell 1 is seen before the loop asks whether one
    # is due after cell 2, or only as it waits for it there (one at a time): either way
    # no snapshot is taken after it
    run = Run(tmp_path, 4)
    run.script.fail[1] = "PicklingError: cannot pickle 'generator' object"
    run.script.open_all()
    for i in (0, 2):
        run.script.gate(i).set()
    if lands == "before cell 2 ends":
        run.script.gate(1).set()
    else:

        async def after(index: int) -> None:
            if index == 2:
                run.script.gate(1).set()

        run.script.after = after
    assert run.go() is None
    run.check(given_up=frozenset({1, 2}))
    assert run.committed("snapshot") == [0]
    assert sorted(run.committed("record")) == [0, 1, 2, 3]
    off = run.runner.journal.attempt_rec["snapshots_off"]
    assert "after cell 1" in off and "cannot pickle" in off


@pytest.mark.parametrize("lasting", [True, False])
def test_a_kernel_that_will_never_fork_is_asked_once(tmp_path: Path, lasting: bool) -> None:
    # torch loaded is for good: later snapshots are staged without asking for a fork
    # (one round trip less in each pause), asked for with the cell itself (one more
    # less); the notebook's threads may end, so a kernel
    # that cannot fork for now is asked at every snapshot
    run = Run(tmp_path, 5)
    run.script.lasting = lasting
    run.script.open_all()
    for i in range(4):
        run.script.gate(i).set()
    assert run.go() is None
    run.check()
    assert run.committed("snapshot") == [0, 1, 2, 3]
    assert run.runner.session is not None
    assert run.runner.session.forks_asked == (1 if lasting else 4)  # type: ignore[attr-defined]
    # once it is known never to fork, the snapshot after a cell is asked for with the
    # cell's own request (a round trip less again)
    assert run.runner.session.staged_with_cell == (3 if lasting else 0)  # type: ignore[attr-defined]
    assert "a fake kernel" in run.runner.journal.attempt_rec["snapshots_staged"]


def test_a_notice_while_a_snapshot_is_written_waits_no_longer_than_the_save_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the snapshot after cell 1 never lands; the notice comes as cell 2 starts
    monkeypatch.setattr(cell_loop, "SAVE_BUDGET", 0.5)
    run = Run(tmp_path, 5)
    run.script.gate(0).set()

    async def before(index: int) -> None:
        if index == 2:
            assert run.runner.notice is not None
            run.runner.notice.fire("SIGTERM")

    run.script.before = before
    with caplog.at_level(logging.WARNING, logger="spotbook"):
        exc = run.go()
    assert isinstance(exc, Terminated), exc
    # given up at the save budget: cell 1's and 2's records commit without their
    # snapshots (a resume replays them from the one after cell 0); cell 3 never ran
    assert "after cell 1 did not finish in time" in caplog.text
    run.check(given_up=frozenset({1, 2}))
    assert run.committed("snapshot") == [0], run.events
    assert sorted(run.committed("record")) == [0, 1, 2], run.events
    assert run.runner.journal.attempt_rec["outcome"] == "preempted"
