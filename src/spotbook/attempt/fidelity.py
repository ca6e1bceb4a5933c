"""The fidelity report of a resume: what came back, what was replayed, what may differ.

It goes into the attempt record (``fidelity``), ``spotbook status`` and ``--json``.
``exact`` is true when nothing may differ from an uninterrupted run (for a
deterministic notebook); ``--strict-resume`` refuses to go on when it is false.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .replay import ResumePlan

_PART = "\x00part:"


@dataclass
class FidelityReport:
    snapshot: str | None
    variables: int = 0
    process: list[str] = field(default_factory=list)
    replayed: dict[int, str] = field(default_factory=dict)
    chains: dict[str, list[int]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    may_differ: list[str] = field(default_factory=list)
    undone: list[str] = field(default_factory=list)

    def restored(
        self, doc: dict[str, Any], failed: dict[str, str], process_failed: dict[str, str]
    ) -> None:
        """What a loaded snapshot gave back, and what it could not."""
        self.variables = sum(1 for n in doc["vars"] if n not in failed)
        parts = list(doc.get("env") or {}) + [
            name[len(_PART) :] for name, _ in doc["stream"]["segments"] if name.startswith(_PART)
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
            "variables_restored": self.variables,
            "process_restored": self.process,
            "replayed": [{"cell": i, "why": why} for i, why in sorted(self.replayed.items())],
            "chains": self.chains,
            "not_restored_unused": self.dropped,
            "may_differ": list(self.may_differ),
            "files_given_back": list(self.undone),
        }


def summary_lines(fidelity: dict[str, Any]) -> list[str]:
    """The report as lines for ``spotbook status``."""
    lines = []
    if fidelity.get("fallback"):
        lines.append(f"state could not be rebuilt: ran again from cell 0 ({fidelity['fallback']})")
    restored = fidelity.get("process_restored") or []
    lines.append(
        f"restored {fidelity.get('variables_restored', 0)} variables"
        + (f" and {', '.join(restored)}" if restored else "")
        + (f" from {fidelity['snapshot']}" if fidelity.get("snapshot") else " (no snapshot)")
    )
    for name, cells in sorted((fidelity.get("chains") or {}).items()):
        lines.append(f"{name!r}: rebuilt by replaying cells {', '.join(map(str, cells))}")
    dropped = fidelity.get("not_restored_unused") or []
    if dropped:
        lines.append(f"not restored, and no later cell reads them: {', '.join(dropped)}")
    for item in fidelity.get("files_given_back") or []:
        lines.append(f"the cell that runs again: {item}")
    for item in fidelity.get("may_differ") or []:
        lines.append(f"may differ: {item}")
    if fidelity.get("exact"):
        lines.append("nothing known to differ from an uninterrupted run")
    return lines
