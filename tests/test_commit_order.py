"""The commit order (attempt/commit_order.py), without a kernel: a record commits only
once no snapshot written in the background covers it, in the order its cells finished,
and never after that snapshot was lost. The cell loop and the snapshots reach the
journal only through it (the real kernel keeps the same order in test_background.py and
the fidelity matrix's kills while a snapshot is written)."""

from __future__ import annotations

import random

import pytest

from spotbook.attempt.commit_order import CommitOrder, Order


def _order() -> tuple[CommitOrder, list[int]]:
    committed: list[int] = []
    return CommitOrder(lambda i, rec: committed.append(i)), committed


def test_free_commits_at_once_and_holding_waits_for_the_snapshot() -> None:
    order, committed = _order()
    order.record(0, {})
    assert committed == [0] and order.state is Order.FREE
    order.writing(1)
    order.record(1, {"i": 1})
    order.record(2, {"i": 2})
    assert committed == [0] and order.held() == {1: {"i": 1}, 2: {"i": 2}}
    assert order.state is Order.HOLDING and order.behind == 1
    order.written()
    assert committed == [0, 1, 2] and order.held() == {} and order.state is Order.FREE


def test_a_lost_snapshot_drops_what_waited_for_it() -> None:
    order, committed = _order()
    order.writing(3)
    order.record(3, {})
    order.lost()
    order.record(4, {})
    assert committed == [4] and order.state is Order.FREE


def test_one_snapshot_at_a_time() -> None:
    order, _ = _order()
    order.writing(1)
    with pytest.raises(RuntimeError, match="while the one after cell 1"):
        order.writing(2)


def _events(seed: int) -> list[str]:
    rng = random.Random(seed)
    return rng.choices(["cell", "snapshot", "written", "lost"], k=rng.randrange(61))


def test_no_record_commits_before_the_snapshot_that_covers_it() -> None:
    for seed in range(300):  # random sequences of the events the cell loop meets
        _check(_events(seed))


def _check(events: list[str]) -> None:
    order, committed = _order()
    cell = 0
    covering: int | None = None  # the snapshot being written follows this cell
    lost: set[int] = set()
    waiting: list[int] = []
    for event in events:
        if event == "cell":
            order.record(cell, {"cell": cell})
            if covering is not None:
                waiting.append(cell)
            cell += 1
        elif event == "snapshot" and covering is None:
            covering = cell  # after the next cell to finish (the cell loop's order)
            order.writing(cell)
        elif event == "written" and covering is not None:
            order.written()
            covering, waiting = None, []
        elif event == "lost" and covering is not None:
            order.lost()
            lost.update(waiting)
            covering, waiting = None, []
        # never a record of a cell the snapshot covers, nor one lost with it
        assert not set(committed) & (set(waiting) | lost), (events, committed)
    assert committed == sorted(committed), events  # in the order the cells finished
    assert set(committed) | set(waiting) | lost == set(range(cell)), events
    assert sorted(order.held()) == waiting, events
