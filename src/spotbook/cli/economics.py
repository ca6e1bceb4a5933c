"""spotbook cost / simulate / chaos: what runs cost, and what preemptions add."""

from __future__ import annotations

import argparse
import json
import sys

from .._errors import UsageError
from .._models import parse_rate
from ..economics.cost import CostReport, Machine, cost_of
from ..economics.prices import load_prices
from ..ops.runs import open_run


def _say(line: str) -> None:
    print(f"spotbook: {line}", file=sys.stderr, flush=True)


def _cmd_cost(args: argparse.Namespace) -> int:
    prices = load_prices(args.prices)
    given = Machine(args.provider, args.region, args.machine_type, args.capacity)
    store = open_run(args.run, context=args.context, namespace=args.namespace)
    summary = cost_of(store, prices, given)
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
        return 0
    for r in summary.reports:
        _show(r)
    if summary.sweep:
        t = summary.totals()
        currency = summary.reports[0].currency if summary.reports else "USD"
        print(
            f"sweep    {len(summary.reports)} points: {t.get('node_hours', 0.0):.4f} "
            f"node-hours, {t.get('gpu_hours', 0.0):.4f} GPU-hours, cost "
            f"{_money(t.get('cost'), currency)}"
        )
    return 0


def _money(value: float | None, currency: str) -> str:
    return "unknown" if value is None else f"{value:.4f} {currency}"


def _show(r: CostReport) -> None:
    t = r.totals()
    print(f"run      {r.run_id}  ({r.url})")
    print(f"prices   {r.prices_source}, {r.prices_date}")
    for a in r.attempts:
        m = a.machine
        where = (
            " ".join(x for x in (m.provider, m.machine_type, m.region) if x) or "unknown machine"
        )
        print(
            f"  #{a.attempt} {a.outcome:<10} {a.node_seconds / 3600:.4f} h on {where} "
            f"({m.capacity or 'spot?'}), {a.gpus} GPU: {_money(a.cost, r.currency)}"
            + (
                f"; lost {a.lost_seconds:.1f} s, restart {a.restart_seconds:.1f} s, "
                f"redone {a.redone_seconds:.1f} s, waited {a.waiting_seconds:.1f} s for a node"
                if a.lost_seconds or a.restart_seconds or a.redone_seconds or a.waiting_seconds
                else ""
            )
        )
    print(
        f"total    {t['node_hours']:.4f} node-hours, {t['gpu_hours']:.4f} GPU-hours, "
        f"{t['overhead_hours'] * 3600:.1f} s lost or redone to preemptions, "
        f"{t['waiting_hours'] * 3600:.1f} s waiting for nodes"
    )
    print(
        f"cost     {_money(t['cost'], r.currency)} as run; all spot "
        f"{_money(t['cost_all_spot'], r.currency)}, all on demand "
        f"{_money(t['cost_all_on_demand'], r.currency)}; preemptions added "
        f"{_money(t['preemptions_added'], r.currency)}"
    )
    for line in r.unknown:
        print(f"unknown  {line}")


def _duration(text: str | None) -> float | None:
    if text is None:
        return None
    from ..kube.manifest import parse_duration

    return float(parse_duration(text, "--duration"))


def _rate(text: str) -> float:
    """A hazard rate, zero allowed (no preemptions)."""
    return parse_rate(text, "--hazard", allow_zero=True)


def _trace(path: str | None) -> list[float] | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            words = fh.read().replace(",", " ").split()
        return sorted(float(w) for w in words)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--trace {path}: a file of preemption times in seconds ({exc})") from exc


def _cmd_simulate(args: argparse.Namespace) -> int:
    from ..economics.simulate import simulate_run

    hazard = _rate(args.hazard)
    result = simulate_run(
        open_run(args.run),
        hazard_per_hour=hazard,
        delay=args.delay,
        trials=args.trials,
        seed=args.seed,
        interval=args.interval,
        trace=_trace(args.trace),
        duration=_duration(args.duration),
    )
    doc = result.to_json()
    check = result.interval_check
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    p = doc["profile"]
    print(
        f"profile  {p['cells']} cells, {p['compute_hours']} h of compute; snapshot "
        f"{p['snapshot_seconds']} s, start {p['start_seconds']} s, restore "
        f"{p['restore_seconds']} s ({p['source']})"
    )
    if not p["snapshot_measured"]:
        print(
            "note     the run took no snapshot: its cost is auto's first estimate; run the "
            "notebook with --snapshot every-cell to measure it"
        )
    print(f"hazard   {hazard:g} preemptions per node-hour; {args.delay:g} s to a new node")
    print(f"{'strategy':<32} {'interval s':>10} {'cost ratio':>10} {'finish h':>9} {'preempt.':>8}")
    for name, row in doc["strategies"].items():
        iv = "-" if row["interval_seconds"] is None else f"{row['interval_seconds']:.1f}"
        print(
            f"{name:<32} {iv:>10} {row['cost_ratio']:>10.4f} {row['finish_hours']:>9.3f} "
            f"{row['preemptions']:>8.2f}"
        )
    if check:
        print(
            f"interval Young/Daly {check['young_daly_seconds']:.1f} s (cost ratio "
            f"{check['cost_at_young_daly']:.4f}); best simulated "
            f"{check['best_simulated_seconds']:.1f} s ({check['cost_at_best']:.4f})"
        )
    return 0


def _cmd_chaos(args: argparse.Namespace) -> int:
    from ..economics.chaos import chaos
    from ..notebook.parameters import collect_parameters

    params = collect_parameters(
        yaml_strings=args.parameters_yaml,
        files=args.parameters_file,
        typed=[tuple(p) for p in args.parameters],
        raw=[tuple(p) for p in args.parameters_raw],
    )
    report = chaos(
        args.input,
        args.work,
        parameters=params,
        hazard_per_hour=None if args.hazard is None else _rate(args.hazard),
        trace=_trace(args.trace),
        delay=args.delay,
        signal=args.signal,
        grace=args.grace,
        seed=args.seed,
        strategies=tuple(args.strategy or ("resume", "restart")),
        say=_say,
    )
    doc = report.to_json()
    failed = report.failed
    for name, code in failed.items():
        print(
            f"spotbook: error: the {name} run failed (exit {code}; its error is above): "
            "its cost compares nothing. Fix the notebook or the store, then run chaos again",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(doc, indent=2))
        return 1 if failed else 0
    print(
        f"baseline {doc['baseline_seconds']:.2f} s uninterrupted; {args.signal} at node time "
        + ", ".join(f"{t:.1f}" for t in doc["preemption_times"])
        + f" s; {args.delay:g} s to a new node"
    )
    print(
        f"{'strategy':<10} {'billed s':>9} {'finish s':>9} {'preempt.':>8} "
        f"{'cost ratio':>10} {'simulated':>10} {'simulated billed s':>19}"
    )
    for name, row in doc["strategies"].items():
        sim = row["predicted_cost_ratio"]
        print(
            f"{name:<10} {row['billed_seconds']:>9.2f} {row['finish_seconds']:>9.2f} "
            f"{row['preemptions']:>8} {row['cost_ratio']:>10.4f} "
            + (f"{sim:>10.4f}" if sim is not None else f"{'-':>10}")
            + (
                f" {band[0]:>8.2f} to {band[1]:<7.2f}"
                if (band := row["predicted_billed_seconds"])
                else ""
            )
        )
    print(
        "(simulated: for the same times, at the median start this machine showed; billed: "
        "at its fastest and slowest start, restore, finish, snapshot pause and write, the "
        "snapshots where auto would place them and where the runs took them)"
    )
    return 1 if failed else 0
