"""spotbook sweep: one notebook over a grid of parameters (``ops.sweep``)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from typing import Any

from .._api import notebook_parameters
from .._errors import UsageError
from .._models import EXIT_OK, EXIT_USAGE, RunRequest
from ..notebook.grid import expand, read_rows, typed_values
from ..notebook.parameters import collect_parameters
from ..ops.sweep import (
    SweepTable,
    prepare_sweep,
    run_points,
    submit_sweep,
    sweep_status,
    write_results,
)
from ..store.runstore import read_url
from .run import _check_engine, _show_parameters, run_request


def _say(line: str) -> None:
    print(f"spotbook: {line}", file=sys.stderr, flush=True)


def _points(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The grid from the flags: -b/-f/-y YAML (lists swept), -p with commas, -r as is,
    --rows."""
    params = collect_parameters(
        base64_yaml=args.parameters_base64,
        files=args.parameters_file,
        yaml_strings=args.parameters_yaml,
        raw=[tuple(p) for p in args.parameters_raw],
    )
    for name, value in args.parameters:
        params[name] = typed_values(value)
    rows = read_rows(read_url(args.rows).decode("utf-8"), args.rows) if args.rows else []
    return expand(params, rows)


def _cmd_sweep(args: argparse.Namespace) -> int:
    _check_engine(args)
    if args.help_notebook:  # as `spotbook run --help-notebook`: nothing is run or written
        _show_parameters(args.input, notebook_parameters(args.input, {}))
        return 0
    if args.input == "-":
        raise UsageError("a sweep reads its notebook from a path or URL, not stdin")
    if not args.run_dir:
        raise UsageError(
            "spotbook sweep needs --run-dir URL: the sweep's points are kept in URL/points/<i>"
        )
    if args.output == "-":
        raise UsageError("OUTPUT - does not apply to a sweep; give a template like out_{lr}.ipynb")
    points = _points(args)
    # every point is this request with its own parameters and store (prepare_sweep)
    common = run_request(args, args.input, {})
    if args.submit or args.dry_run:
        return _submit(args, points, common)
    prepare_sweep(common, args.run_dir, points)
    if args.prepare_only:  # each point frozen with its parameters (and OUTPUT written)
        _say(
            f"sweep of {len(points)} points prepared in {args.run_dir}, none run; "
            f"`spotbook sweep resume {args.run_dir}` runs them"
        )
        return EXIT_OK
    _say(f"sweep of {len(points)} points in {args.run_dir}")
    table = run_points(args.run_dir, parallel=args.parallel, grace=args.grace, say=_say)
    _show(table, as_json=args.json)
    return table.exit_code()


def _submit(args: argparse.Namespace, points: list[dict[str, Any]], common: RunRequest) -> int:
    from ..ops.runs import wait_for_job
    from ..ops.submit import check_locations
    from .cluster import _print_manifest, job_options

    if not args.image:
        raise UsageError("spotbook sweep --submit needs --image (submit's flags apply)")
    check_locations(args.run_dir, args.output)  # before the other flags: the first need
    done = submit_sweep(
        common,
        job_options(args),
        points,
        parallelism=args.parallel,
        max_failed_points=args.max_failed_points,
        context=args.context,
        namespace=args.namespace,
        dry_run=args.dry_run,
        warn=lambda line: _say(f"warning: {line}"),
    )
    if args.dry_run:  # the notebook took the first point's parameters; nothing written
        _print_manifest(done.manifest, args.output_format)
        return 0
    _say(
        f"submitted sweep {done.run_id} ({len(points)} points) as Indexed Job {done.job} in "
        f"namespace {done.namespace} (context {done.context}); store {done.url}\n"
        f"  spotbook sweep status {done.url}"
    )
    if not args.wait:
        return 0
    return wait_for_job(done, say=_say)


def _cmd_sweep_resume(args: argparse.Namespace) -> int:
    table = run_points(args.url, parallel=args.parallel, grace=args.grace, say=_say)
    _show(table, as_json=args.json)
    return table.exit_code()


def _cmd_sweep_status(args: argparse.Namespace) -> int:
    table = sweep_status(args.url)
    if args.csv:
        sys.stdout.write(_csv(table))
        return 0
    _show(table, as_json=args.json)
    return 0


def _cmd_sweep_results(args: argparse.Namespace) -> int:
    table = sweep_status(args.url)
    if not args.output:
        sys.stdout.write(_csv(table))
    else:
        kind = write_results(table, args.output)
        _say(f"wrote {len(table.rows)} points to {args.output} ({kind})")
    refused = [r for r in table.rows if r.refused]
    for r in refused:  # the rest are written; these points' results are left empty
        _say(f"point {r.index}: {r.message}")
    return EXIT_USAGE if refused else EXIT_OK  # exit 2, as for any store that fails its check


def _csv(table: SweepTable) -> str:
    rows = table.records()
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["point"])
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in row.items()}
        )
    return out.getvalue()


def _show(table: SweepTable, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps({"url": table.url, "points": table.records()}, indent=2))
        return
    names = table.result_names()
    head = ["POINT", *(n.upper() for n in table.varying), "STATUS", "CELLS", "TRIES", "PREEMPT"]
    head += ["SECONDS", *names]
    lines = [head]
    for r in table.rows:
        lines.append(
            [
                str(r.index),
                *(_short(r.parameters.get(k)) for k in table.varying),
                r.status,
                f"{r.cells_done}/{r.cells_total}",
                str(r.attempts),
                str(r.preemptions),
                "-" if r.duration is None else f"{r.duration:.1f}",
                *(_short(r.results.get(n)) for n in names),
            ]
        )
    widths = [max(len(row[c]) for row in lines) for c in range(len(head))]
    for row in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    counts = ", ".join(f"{n} {s}" for s, n in sorted(table.counts().items()))
    print(f"{len(table.rows)} points: {counts}")


def _short(value: Any) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 24 else text[:21] + "..."
