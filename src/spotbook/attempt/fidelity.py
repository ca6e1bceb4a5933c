"""The fidelity report of a resume: what came back, what was replayed, what may differ.

It goes into the attempt record (``fidelity``), ``spotbook status`` and ``--json``.
``exact`` is true when nothing may differ from an uninterrupted run (for a
deterministic notebook); ``--strict-resume`` refuses to go on when it is false.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .replay import ResumePlan
from .run_files import RunFiles

_PART = "\x00part:"


@dataclass
class FidelityReport:
    """What a resumed run may differ in from an uninterrupted one, and why."""

    snapshot: str | None
    # the cell (its index) the snapshot was taken after, for words a person reads
    snapshot_after: int | None = None
    variables: int = 0
    process: list[str] = field(default_factory=list)
    replayed: dict[int, str] = field(default_factory=dict)
    chains: dict[str, list[int]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    may_differ: list[str] = field(default_factory=list)
    undone: list[str] = field(default_factory=list)
    files: dict[str, Any] = field(default_factory=dict)  # what this node lacked and got back
    environment: list[int] = field(default_factory=list)  # cells replayed for the environment
    # the checkpoint inside a cell it went on from ("cell 7, iteration 15 of 20 of its
    # loop 1"); "" for a snapshot between cells
    inside: str = ""

    def files_checked(
        self,
        doc: dict[str, Any],
        restored: dict[str, Any] | None,
        records: dict[int, dict[str, Any]],
        files: RunFiles | None,
        never: frozenset[int] = frozenset(),
    ) -> set[int]:
        """What of the run's files this node lacks after the restore, by name: a file that
        could not be put back, one that was not saved (excluded, over the budget) and is
        not here, one a finished cell wrote outside the scanned directories that is gone.
        Never "nothing known to differ" while a file the run wrote is missing. Returns the
        cells to replay to rebuild the missing files that were not saved: those whose
        records say they wrote them (not those in ``never``)."""
        rebuild: set[int] = set()
        listed = doc.get("files") or {}
        if restored:
            self.files = {k: restored[k] for k in ("files", "bytes") if k in restored}
        for path, why in sorted(((restored or {}).get("failed") or {}).items()):
            self.may_differ.append(f"file {path} could not be put back on this node ({why})")
        after = int(doc["after"])
        for path, entry in sorted((listed.get("skipped") or {}).items()):
            if not os.path.lexists(path):
                writers = [
                    i
                    for i, r in sorted(records.items())
                    if i <= after and path in (r.get("written") or ()) and i not in never
                ]
                what = (
                    f"file {path} ({int(entry.get('size') or 0)} bytes) was not saved "
                    f"({entry.get('why')}) and is missing on this node"
                )
                if writers:
                    rebuild.add(writers[-1])
                    what += f": cell {writers[-1] + 1}, which wrote it, is replayed to rebuild it"
                self.may_differ.append(what)
        entries = listed.get("entries") or {}
        deleted = {
            p for i, r in records.items() for p in (r.get("effects") or {}).get("deletes") or ()
        }
        for i, rec in sorted(records.items()):
            if i > after:
                continue  # replayed: it writes its files again
            for path in rec.get("written") or ():
                scanned = files is not None and files.covers(path) and not listed.get("truncated")
                if path in entries or path in deleted or scanned or os.path.lexists(path):
                    continue
                self.may_differ.append(
                    f"file {path}, written by cell {i}, is missing on this node (it was not "
                    "saved with the snapshot)"
                )
        return rebuild

    def restored(
        self, doc: dict[str, Any], failed: dict[str, str], process_failed: dict[str, str]
    ) -> None:
        """What a loaded snapshot gave back, and what it could not."""
        self.variables = sum(1 for n in doc["vars"] if n not in failed)
        parts = list(doc.get("env") or {}) + [
            s[0][len(_PART) :] for s in doc["stream"]["segments"] if s[0].startswith(_PART)
        ]
        self.process = [p for p in parts if p not in process_failed]
        for part, why in sorted((doc.get("uncaptured") or {}).items()):
            self.may_differ.append(f"{part} was not captured at the snapshot ({why})")
        self.process_problems(process_failed)
        for name, entry in sorted(doc["vars"].items()):
            if entry.get("order") and name not in failed:
                self.may_differ.append(
                    f"set {name!r} may iterate in another order after the resume (its items "
                    "land in other slots when it is rebuilt)"
                )
        threads = doc.get("threads") or []
        if threads:
            self.may_differ.append(
                f"thread{'s' if len(threads) > 1 else ''} {', '.join(map(repr, threads))} "
                "started by the notebook ran at the snapshot and do not run after the resume"
            )

    def process_problems(self, failed: dict[str, str]) -> None:
        for part, why in sorted(failed.items()):
            self.may_differ.append(f"{part} could not be restored ({why})")

    def planned(self, plan: ResumePlan) -> None:
        self.replayed = {i: plan.reasons.get(i, "") for i in plan.replay}
        self.chains = {n: list(c) for n, c in plan.chains.items()}
        self.dropped = list(plan.dropped)
        self.may_differ.extend(plan.may_differ)

    @property
    def exact(self) -> bool:
        return not self.may_differ

    def to_json(self) -> dict[str, Any]:
        return {
            "exact": self.exact,
            "snapshot": self.snapshot,
            "snapshot_after": self.snapshot_after,
            "variables_restored": self.variables,
            "process_restored": self.process,
            "replayed": [{"cell": i, "why": why} for i, why in sorted(self.replayed.items())],
            "chains": self.chains,
            "not_restored_unused": self.dropped,
            "may_differ": list(self.may_differ),
            "files_given_back": list(self.undone),
            "files_restored": dict(self.files),
            "environment_replayed": list(self.environment),
            **({"inside": self.inside} if self.inside else {}),
        }


def summary_lines(fidelity: dict[str, Any]) -> list[str]:
    """The report as lines for ``spotbook status``."""
    lines = []
    if fidelity.get("fallback"):
        lines.append(
            f"state could not be rebuilt: ran again from the first cell ({fidelity['fallback']})"
        )
    restored = fidelity.get("process_restored") or []
    after = fidelity.get("snapshot_after")
    if isinstance(fidelity.get("inside"), str):
        source = f" from the checkpoint inside {fidelity['inside']}"
    elif isinstance(after, int):  # cells as papermill numbers them, from 1
        source = f" from the snapshot after cell {after + 1}"
    else:  # a report written before it said which cell
        source = f" from {fidelity['snapshot']}" if fidelity.get("snapshot") else ""
    lines.append(
        f"restored {fidelity.get('variables_restored', 0)} variables"
        + (f" and {', '.join(restored)}" if restored else "")
        + (source or " (no snapshot)")
    )
    for name, cells in sorted((fidelity.get("chains") or {}).items()):
        lines.append(f"{name!r}: rebuilt by replaying cells {_numbered(cells)}")
    dropped = fidelity.get("not_restored_unused") or []
    if dropped:
        lines.append(f"not restored, and no later cell reads them: {', '.join(dropped)}")
    files = fidelity.get("files_restored") or {}
    if files.get("files"):
        lines.append(
            f"this node lacked the run's files: {files['files']} restored "
            f"({files.get('bytes', 0) / 1e6:.1f} MB) before the kernel started"
        )
    env = fidelity.get("environment_replayed") or []
    if env:
        lines.append(
            f"environment: cell{'s' if len(env) > 1 else ''} {_numbered(env)} "
            "replayed first (what they installed was missing)"
        )
    for item in fidelity.get("files_given_back") or []:
        lines.append(f"the cell that runs again: {item}")
    for item in fidelity.get("may_differ") or []:
        lines.append(f"may differ: {item}")
    if fidelity.get("exact"):
        lines.append("nothing known to differ from an uninterrupted run")
    return lines


def _numbered(cells: list[int]) -> str:
    """Cell indexes as papermill numbers cells (from 1), for a person to read."""
    return ", ".join(str(int(i) + 1) for i in cells)
