"""A run's bill: per attempt, node- and GPU-hours, what preemptions made it redo or
lose, time waiting for a node, and money at the attempt's capacity (spot or on demand)
and at both, from the price table. For a sweep, every point's bill and their sum."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .._models import INTERRUPTED_OUTCOMES
from .._status import RunReport, describe
from ..store.runstore import JOB_RECORD, RunStore, point_url
from .prices import Price, PriceTable

HOUR = 3600.0


@dataclass(frozen=True)
class Machine:
    """Where an attempt ran, as far as known (overrides fill what the record lacks)."""

    provider: str | None = None
    region: str | None = None
    machine_type: str | None = None
    capacity: str | None = None  # "spot" or "on-demand"


@dataclass(frozen=True)
class AttemptCost:
    """One attempt's node time and its price."""

    attempt: int
    outcome: str
    machine: Machine
    gpus: int
    node_seconds: float  # the attempt's process ran this long (billed)
    gpu_seconds: float
    # preemption overhead billed to this attempt: compute lost at its end (since its last
    # saved cell), and at its start the kernel start, the state restore and the cells
    # run again to rebuild state
    lost_seconds: float
    restart_seconds: float
    redone_seconds: float
    waiting_seconds: float  # before it: no node yet (not billed)
    price: Price | None
    cost: float | None  # at its own capacity
    cost_spot: float | None
    cost_on_demand: float | None


@dataclass(frozen=True)
class CostReport:
    """A run's bill: every attempt's cost and the totals."""

    run_id: str
    url: str
    attempts: list[AttemptCost]
    prices_date: str
    prices_source: str
    currency: str
    unknown: list[str] = field(default_factory=list)  # what could not be priced, and why

    def totals(self) -> dict[str, Any]:
        a = self.attempts
        overhead = sum(x.lost_seconds + x.restart_seconds + x.redone_seconds for x in a)
        priced = all(x.price is not None for x in a) and bool(a)

        def money(attr: str) -> float | None:
            return round(sum(getattr(x, attr) for x in a), 4) if priced else None

        # what preemptions added: their overhead at each attempt's own price
        added = (
            round(
                sum(
                    (x.lost_seconds + x.restart_seconds + x.redone_seconds)
                    / HOUR
                    * x.price.per_hour(x.machine.capacity or "spot")
                    for x in a
                    if x.price is not None
                ),
                4,
            )
            if priced
            else None
        )
        return {
            "attempts": len(a),
            "preemptions": sum(1 for x in a if x.outcome in INTERRUPTED_OUTCOMES),
            "node_hours": round(sum(x.node_seconds for x in a) / HOUR, 6),
            "gpu_hours": round(sum(x.gpu_seconds for x in a) / HOUR, 6),
            "overhead_hours": round(overhead / HOUR, 6),
            "redone_hours": round(sum(x.redone_seconds for x in a) / HOUR, 6),
            "waiting_hours": round(sum(x.waiting_seconds for x in a) / HOUR, 6),
            "cost": money("cost"),
            "cost_all_spot": money("cost_spot"),
            "cost_all_on_demand": money("cost_on_demand"),
            "preemptions_added": added,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "url": self.url,
            "prices": {"date": self.prices_date, "source": self.prices_source},
            "currency": self.currency,
            "attempts": [
                {**asdict(x), "price": None if x.price is None else asdict(x.price)}
                for x in self.attempts
            ],
            "totals": self.totals(),
            "unknown": self.unknown,
        }


def _machine(record: dict[str, Any], job: dict[str, Any], given: Machine) -> Machine:
    found = record.get("machine") or {}
    return Machine(
        provider=found.get("provider") or given.provider or job.get("provider"),
        region=found.get("region") or found.get("zone") or given.region,
        machine_type=found.get("machine_type") or given.machine_type,
        capacity=found.get("capacity") or given.capacity or ("spot" if job else None),
    )


def run_cost(store: RunStore, prices: PriceTable, given: Machine | None = None) -> CostReport:
    """The bill of the run in ``store`` (``given`` fills what attempts did not record:
    a local run knows no provider, region or machine type)."""
    given = given or Machine()
    doc: RunReport = describe(store)
    job = store.read_json(JOB_RECORD)
    job = job if isinstance(job, dict) else {}  # (what it says is shown, never acted on)
    events = doc["downtime"]["preemptions"]
    lost = {e["attempt"]: e["split"]["until_stopped"] for e in events}
    # a killed attempt never recorded its end: bill it to its last progress (a lower
    # bound: the node may have run on until it died)
    progress = {e["attempt"]: e["last_progress_at"] for e in events}
    starting = {
        e["next_attempt"]: (
            e["split"]["image_and_kernel_start"] + e["split"]["state_restore"],
            e["split"]["scheduling_and_node"],
            e["redone_seconds"],
        )
        for e in events
    }
    out: list[AttemptCost] = []
    unknown: list[str] = []
    for a in doc["attempts"]:
        rec: dict[str, Any] = dict(a)
        n = int(rec.get("attempt") or 0)
        start = float(rec.get("process_started") or rec.get("started") or 0.0)
        end = rec.get("ended") or progress.get(n)
        if end is None:
            continue  # still running: not billed yet
        node = max(float(end) - start, 0.0)
        gpus = len(rec.get("gpus") or []) or int(job.get("gpu_count") or 0)
        machine = _machine(rec, job, given)
        price = prices.find(machine.provider, machine.region, machine.machine_type)
        if price is None:
            missing = [k for k in ("provider", "region", "machine_type") if not getattr(machine, k)]
            unknown.append(
                f"attempt {n}: "
                + (
                    f"no {', '.join(missing)} recorded (give --{missing[0].replace('_', '-')})"
                    if missing
                    else f"{machine.provider} {machine.machine_type} in {machine.region} is "
                    f"not in the price table of {prices.date} ({prices.source}); give "
                    "--prices FILE"
                )
            )
        capacity = machine.capacity or "spot"
        restart, waiting, redone = starting.get(n, (0.0, 0.0, 0.0))
        hours = node / HOUR
        out.append(
            AttemptCost(
                attempt=n,
                outcome=str(rec.get("outcome")),
                machine=machine,
                gpus=gpus,
                node_seconds=round(node, 3),
                gpu_seconds=round(node * gpus, 3),
                lost_seconds=round(lost.get(n, 0.0), 3),
                restart_seconds=round(restart, 3),
                redone_seconds=round(redone, 3),
                waiting_seconds=round(waiting, 3),
                price=price,
                cost=None if price is None else round(hours * price.per_hour(capacity), 4),
                cost_spot=None if price is None else round(hours * price.spot, 4),
                cost_on_demand=None if price is None else round(hours * price.on_demand, 4),
            )
        )
    return CostReport(
        run_id=doc["run_id"],
        url=doc["run_dir"],
        attempts=out,
        prices_date=prices.date,
        prices_source=prices.source,
        currency=prices.currency,
        unknown=unknown,
    )


@dataclass(frozen=True)
class CostSummary:
    """What ``spotbook cost`` shows: a run's bill, or (``sweep``) every point's and their
    sum."""

    reports: list[CostReport]
    sweep: bool = False

    def totals(self) -> dict[str, Any]:
        """The sum of the bills: a money total is unknown where any point's is."""
        totals = [r.totals() for r in self.reports]
        out: dict[str, Any] = {}
        for key in totals[0] if totals else []:
            values = [t[key] for t in totals]
            out[key] = None if any(v is None for v in values) else round(sum(values), 6)
        return out

    def to_json(self) -> dict[str, Any]:
        """A run's bill as ``CostReport.to_json``; a sweep's as its points and totals."""
        if not self.sweep and len(self.reports) == 1:
            return self.reports[0].to_json()
        return {"points": [r.to_json() for r in self.reports], "totals": self.totals()}


def cost_of(store: RunStore, prices: PriceTable, given: Machine | None = None) -> CostSummary:
    """The bill of the run in ``store``, or, where ``store`` is a sweep's root, of every
    point (named by its checked ``sweep.json``)."""
    points = store.sweep_points()
    if points is None:
        return CostSummary([run_cost(store, prices, given)])
    reports = [run_cost(RunStore(point_url(store.url, p.index)), prices, given) for p in points]
    return CostSummary(reports, sweep=True)
