"""The one owner of the order that makes a resume exact: a snapshot that covers a cell is
committed before that cell's record.

A committed record says "this cell never runs again"; so, when the policy snapshots after
a cell, its record may commit only once the snapshot is in the store. A synchronous
snapshot keeps the order by itself (the cell loop takes it, then records the cell). A
snapshot written in the background (a fork of the kernel, or a thread of it) covers the
cell it follows while the next cells run: their records wait here until its manifest is
committed. Every finished cell's record reaches the journal through :class:`CommitOrder`.

States:

``FREE``
    no snapshot is being written: a record commits at once;
``HOLDING``
    a snapshot after cell ``behind`` is being written: records wait, in order, for
    ``written`` (its manifest committed, or given up: a resume then replays from the one
    before, so the records may commit without it) or ``lost`` (the store failed: the
    records are dropped, and their cells run again on resume).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

Commit = Callable[[int, dict[str, Any]], None]


class Order(enum.Enum):
    """The states above."""

    FREE = "free"
    HOLDING = "holding"


class CommitOrder:
    """Commits finished cells' records through ``commit`` in the order above."""

    def __init__(self, commit: Commit) -> None:
        self._commit = commit
        self.state = Order.FREE
        self.behind: int | None = None  # the cell the snapshot being written follows
        self._held: list[tuple[int, dict[str, Any]]] = []

    def record(self, index: int, record: dict[str, Any]) -> None:
        """A finished cell's record: committed now, or held behind the snapshot."""
        if self.state is Order.HOLDING:
            self._held.append((index, record))
        else:
            self._commit(index, record)

    def writing(self, index: int) -> None:
        """A snapshot after cell ``index`` is being written in the background (one at a
        time: the one before was ``written`` or ``lost`` first)."""
        if self.state is Order.HOLDING:
            raise RuntimeError(
                f"a snapshot after cell {index} began while the one after cell "
                f"{self.behind} was being written"
            )
        self.state, self.behind = Order.HOLDING, index

    def written(self) -> None:
        """The snapshot's manifest is committed (or it was given up): the held records
        commit, in the order their cells finished."""
        held, self._held = self._held, []
        self.state, self.behind = Order.FREE, None
        for index, record in held:
            self._commit(index, record)

    def lost(self) -> None:
        """The snapshot could not be written: the held records are dropped (their cells
        run again on resume, as after a kill)."""
        self._held = []
        self.state, self.behind = Order.FREE, None

    def held(self) -> dict[int, dict[str, Any]]:
        """The records waiting, by cell."""
        return dict(self._held)
