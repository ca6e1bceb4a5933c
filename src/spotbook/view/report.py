"""One run as a self-contained HTML page: its summary (status, parameters, attempts,
preemptions, the downtime split, cost when known), its time line, and its notebook
rendered by nbconvert's HTML exporter (``spotbook report``).

The page loads nothing: styles are inline, pictures are inline SVG or data URIs, and its
Content-Security-Policy forbids scripts and every other fetch, so what a notebook's
outputs hold cannot run or call out when the file is opened.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import jinja2

from .._status import RunReport
from ..notebook.document import Notebook
from ..store.runstore import RunStore
from .timeline import SPLIT, timeline_svg

# the report file: nothing but its own inline styles and data: images
# default-src does not cover where a form sends or what <base> points at: named here
REPORT_CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:; "
    "form-action 'none'; base-uri 'none'"
)


@functools.cache
def templates() -> jinja2.Environment:
    """The Jinja environment of the report's templates."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("spotbook.view", "templates"),
        autoescape=jinja2.select_autoescape(default=True),
        undefined=jinja2.StrictUndefined,
    )
    env.filters["seconds"] = _seconds
    env.filters["when"] = _when
    env.globals["started_at"] = _started_at
    env.globals["run_seconds"] = _run_seconds
    return env


def _started_at(doc: Any) -> float | None:
    from ..ops.runs import started_at

    return started_at(doc)


def _run_seconds(doc: Any) -> float | None:
    from ..ops.runs import run_seconds

    return run_seconds(doc)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    v = float(value)
    if v < 120:
        return f"{v:.1f} s"
    if v < 7200:
        return f"{v / 60:.1f} min"
    return f"{v / 3600:.2f} h"


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(ts)))


@functools.cache
def stylesheet() -> str:
    """The page's own styles and pygments' for highlighted code, as one inline sheet."""
    from importlib import resources

    from pygments.formatters import HtmlFormatter

    own = resources.files("spotbook.view").joinpath("static/spotbook.css").read_text()
    return own + "\n" + str(HtmlFormatter(style="default").get_style_defs(".highlight"))


@dataclass(frozen=True)
class Summary:
    """What heads a run's page, from its status document and cost report."""

    doc: RunReport
    downtime: list[tuple[str, str, float]]  # (key, what, seconds) summed over preemptions
    redone_seconds: float
    cost: dict[str, Any] | None  # CostReport.totals(), with currency and price date
    fidelity: list[tuple[int, list[str]]]  # (attempt, summary lines) of each resume


def summarize(doc: RunReport, cost: Any = None) -> Summary:
    """``doc`` from ``run_status``; ``cost`` a ``CostReport`` (``run_cost``) or None."""
    from ..attempt.fidelity import summary_lines

    events = doc["downtime"]["preemptions"]
    split = [(key, what, round(sum(e["split"][key] for e in events), 3)) for key, _, what in SPLIT]
    priced = None
    if cost is not None:
        priced = {
            **cost.totals(),
            "currency": cost.currency,
            "prices_date": cost.prices_date,
            "unknown": list(cost.unknown),
        }
    return Summary(
        doc=doc,
        downtime=split,
        redone_seconds=round(sum(e["redone_seconds"] for e in events), 3),
        cost=priced,
        fidelity=[
            (int(a.get("attempt") or 0), summary_lines(a["fidelity"]))
            for a in doc["attempts"]
            if a.get("fidelity")
        ],
    )


def notebook_html(nb: Notebook) -> str:
    """The notebook's cells as HTML (nbconvert's HTML exporter, its ``basic`` template:
    the cells without a page around them). Outputs' HTML is kept as the notebook has it
    (pandas' tables, styled): the page it goes into forbids scripts and fetches."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="basic")
    body, _ = exporter.from_notebook_node(nb)
    return str(body)


def run_cost_or_none(store: RunStore, prices: str | None = None) -> Any:
    """The run's ``CostReport`` at the shipped prices (or ``prices``, a file)."""
    from ..economics.cost import run_cost
    from ..economics.prices import load_prices

    return run_cost(store, load_prices(prices))


def render_report(
    run: str | RunStore,
    *,
    prices: str | None = None,
    context: str | None = None,
    namespace: str | None = None,
    now: float | None = None,
) -> str:
    """The report page of ``run`` (a run id, path or store URL), as HTML text."""
    from ..ops.runs import open_run, run_notebook, run_status

    store = (
        run if isinstance(run, RunStore) else open_run(run, context=context, namespace=namespace)
    )
    doc = run_status(store, context=context, namespace=namespace)
    summary = summarize(doc, run_cost_or_none(store, prices))
    return (
        templates()
        .get_template("report.html")
        .render(
            title=f"spotbook run {doc['run_id']}",
            csp=REPORT_CSP,
            css=stylesheet(),
            s=summary,
            timeline=timeline_svg(doc, now),
            notebook=notebook_html(run_notebook(store)),
            generated=time.time(),
        )
    )
