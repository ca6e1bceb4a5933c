"""The run's time line as inline SVG: one bar per attempt, and under them the downtime of
each preemption split as the downtime report splits it.

Drawn from the status document alone (``run_status``). Each shape carries its times as
``data-`` attributes (seconds since the epoch) and a ``<title>`` a browser shows on hover.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field
from typing import Any

from .._models import INTERRUPTED_OUTCOMES, Outcome
from .._status import RunReport

WIDTH = 900  # drawing width in px, labels included
LEFT = 70  # room for the lane names
BAR_Y, BAR_H = 22, 22
GAP_Y, GAP_H = 56, 14
HEIGHT = 100

# the downtime report's four stretches, in order, and the colour each is drawn in
SPLIT = (
    ("until_stopped", "#d62728", "until the attempt stopped (compute lost)"),
    ("scheduling_and_node", "#bbbbbb", "waiting for a node"),
    ("image_and_kernel_start", "#ff7f0e", "image and kernel start"),
    ("state_restore", "#9467bd", "state restore"),
)
OUTCOME_COLOUR = {
    Outcome.COMPLETED.value: "#2ca02c",
    Outcome.FAILED.value: "#d62728",
    Outcome.RUNNING.value: "#1f77b4",
}


@dataclass
class Bar:
    """One attempt as a bar of the timeline."""

    attempt: int
    outcome: str
    start: float
    end: float
    kernel_ready: float | None = None
    resumed_at: float | None = None
    redone: float = 0.0
    where: str = ""


@dataclass
class Gap:
    """The time between two attempts, split by what it was spent on."""

    attempt: int
    next_attempt: int
    start: float
    end: float
    split: dict[str, float] = field(default_factory=dict)
    redone: float = 0.0


@dataclass
class Timeline:
    """A run's attempts and gaps, ready to draw."""

    bars: list[Bar]
    gaps: list[Gap]
    start: float
    end: float


def timeline(doc: RunReport, now: float | None = None) -> Timeline:
    """The bars and gaps of ``doc``: an attempt runs from its process's start to its end;
    one killed without notice to its last progress (when it died is unknown); the one
    running now, to ``now``."""
    now = time.time() if now is None else now
    events = {int(e["attempt"]): e for e in doc["downtime"]["preemptions"]}
    bars = []
    for a in doc["attempts"]:
        if not a.get("started"):
            continue
        n = int(a.get("attempt") or 0)
        start = float(a.get("process_started") or a["started"])
        ev = events.get(n)
        end: float
        if a.get("ended"):
            end = float(a["ended"])
        elif ev is not None:
            end = float(ev["stopped_at"] or ev["last_progress_at"])
        elif a.get("outcome") == Outcome.RUNNING.value:
            end = now
        else:
            end = float(a["started"])
        kernel = float(a["started"]) + float(a.get("kernel_start_seconds") or 0.0)
        bars.append(
            Bar(
                attempt=n,
                outcome=str(a.get("outcome") or ""),
                start=start,
                end=max(end, start),
                kernel_ready=kernel if a.get("kernel_start_seconds") else None,
                resumed_at=float(a["resumed_at"]) if a.get("resumed_at") else None,
                redone=float(a.get("redone_seconds") or 0.0),
                where=str(a.get("node") or a.get("host") or ""),
            )
        )
    gaps = [
        Gap(
            attempt=int(e["attempt"]),
            next_attempt=int(e["next_attempt"]),
            start=float(e["last_progress_at"]),
            end=float(e["running_new_cells_at"]),
            split={k: float(v) for k, v in e["split"].items()},
            redone=float(e["redone_seconds"]),
        )
        for e in doc["downtime"]["preemptions"]
    ]
    times = [b.start for b in bars] + [b.end for b in bars] + [g.end for g in gaps]
    return Timeline(bars, gaps, min(times, default=now), max(times, default=now))


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _rect(
    cls: str, x: float, y: float, w: float, h: float, fill: str, title: str, **data: Any
) -> str:
    attrs = "".join(f' data-{k.replace("_", "-")}="{_esc(v)}"' for k, v in data.items())
    return (
        f'<rect class="{cls}" x="{x:.2f}" y="{y}" width="{max(w, 1.0):.2f}" height="{h}" '
        f'fill="{fill}"{attrs}><title>{_esc(title)}</title></rect>'
    )


def _seconds(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def timeline_svg(doc: RunReport, now: float | None = None) -> str:
    """The time line of ``doc`` as an ``<svg>`` element (no scripts, no external refs)."""
    t = timeline(doc, now)
    span = max(t.end - t.start, 1e-3)
    scale = (WIDTH - LEFT - 10) / span

    def x(when: float) -> float:
        return LEFT + (when - t.start) * scale

    parts = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'data-start="{t.start:.3f}" data-end="{t.end:.3f}">',
        f"<title>{len(t.bars)} attempts, {len(t.gaps)} preemptions over {_seconds(span)}</title>",
        f'<text x="4" y="{BAR_Y + 15}" font-size="12">attempts</text>',
        f'<text x="4" y="{GAP_Y + 11}" font-size="12">downtime</text>',
    ]
    for b in t.bars:
        other = "#8c564b" if b.outcome in INTERRUPTED_OUTCOMES else "#7f7f7f"
        colour = OUTCOME_COLOUR.get(b.outcome, other)
        parts.append(
            _rect(
                "attempt",
                x(b.start),
                BAR_Y,
                (b.end - b.start) * scale,
                BAR_H,
                colour,
                f"attempt {b.attempt}: {b.outcome}, {_seconds(b.end - b.start)}"
                + (f" on {b.where}" if b.where else ""),
                attempt=b.attempt,
                outcome=b.outcome,
                start=f"{b.start:.3f}",
                end=f"{b.end:.3f}",
            )
        )
        if b.resumed_at and b.kernel_ready and b.resumed_at > b.kernel_ready:
            parts.append(
                _rect(
                    "restore",
                    x(b.kernel_ready),
                    BAR_Y + 4,
                    (b.resumed_at - b.kernel_ready) * scale,
                    BAR_H - 8,
                    "#9467bd",
                    f"attempt {b.attempt}: state restored in "
                    f"{_seconds(b.resumed_at - b.kernel_ready)}",
                    attempt=b.attempt,
                    start=f"{b.kernel_ready:.3f}",
                    end=f"{b.resumed_at:.3f}",
                )
            )
        if b.redone > 0 and b.resumed_at:
            parts.append(
                _rect(
                    "redone",
                    x(b.resumed_at - b.redone),
                    BAR_Y + 8,
                    b.redone * scale,
                    BAR_H - 16,
                    "#e377c2",
                    f"attempt {b.attempt}: {_seconds(b.redone)} of finished compute run "
                    "again to rebuild state",
                    attempt=b.attempt,
                    seconds=f"{b.redone:.3f}",
                )
            )
        parts.append(
            f'<text x="{x(b.start) + 2:.2f}" y="{BAR_Y - 4}" font-size="11">#{b.attempt}</text>'
        )
    for g in t.gaps:
        parts.append(
            f'<g class="gap" data-attempt="{g.attempt}" data-next-attempt="{g.next_attempt}" '
            f'data-start="{g.start:.3f}" data-end="{g.end:.3f}" '
            f'data-seconds="{g.end - g.start:.3f}">'
        )
        at = g.start
        for key, colour, what in SPLIT:
            width = g.split.get(key, 0.0)
            if width > 0:
                parts.append(
                    _rect(
                        f"split {key.replace('_', '-')}",
                        x(at),
                        GAP_Y,
                        width * scale,
                        GAP_H,
                        colour,
                        f"preemption after attempt {g.attempt}: {_seconds(width)} {what}",
                        seconds=f"{width:.3f}",
                    )
                )
            at += width
        parts.append("</g>")
    # the axis: where the line starts and how long it is
    parts.append(
        f'<line x1="{LEFT}" y1="{HEIGHT - 18}" x2="{WIDTH - 10}" y2="{HEIGHT - 18}" stroke="#444"/>'
    )
    for i in range(5):
        at = t.start + span * i / 4
        parts.append(
            f'<text x="{x(at):.2f}" y="{HEIGHT - 4}" font-size="10" '
            f'text-anchor="{"start" if i == 0 else "end" if i == 4 else "middle"}">'
            f"{_esc('+' + _seconds(at - t.start))}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)
