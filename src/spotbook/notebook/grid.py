"""A sweep's grid: the parameters of every point, from papermill-style flags.

In a sweep a list is the values to sweep over: ``-p lr 0.1,0.01`` (each value typed as
``-p`` types it), ``lr: [0.1, 0.01]`` in ``-y``/``-f`` YAML. Axes combine as a product,
the last one varying fastest; the lists under a ``zip:`` key go together instead (equal
lengths, one point per position); rows of a CSV or JSONL file are points of their own,
combined with the other axes. A parameter whose value is itself a list is written as a
list of lists (``layers: [[64, 64], [128]]``). Pure: no I/O.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._errors import ParameterError
from .parameters import check_name, resolve_type

ZIP_KEY = "zip"


def typed_values(text: str) -> Any:
    """A ``-p`` value of a sweep: ``a,b,c`` is a list of typed values, else one value."""
    if "," not in text:
        return resolve_type(text)
    return [resolve_type(v.strip()) for v in text.split(",")]


def read_rows(text: str, name: str) -> list[dict[str, Any]]:
    """The points of a CSV (a header row of names; values typed as ``-p`` types them) or
    JSONL file (one JSON object per line), by ``name``'s extension."""
    if name.endswith((".jsonl", ".ndjson")):
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ParameterError(f"{name} line {n} is not JSON: {exc}") from exc
            except RecursionError:  # nested past the parser's stack
                raise ParameterError(f"{name} line {n} is nested too deeply") from None
            if not isinstance(row, dict):
                raise ParameterError(f"{name} line {n} is not a JSON object of parameters")
            rows.append(row)
    elif name.endswith(".csv"):
        reader = csv.DictReader(io.StringIO(text))
        rows = []
        for n, raw in enumerate(reader, 2):
            if None in raw or any(v is None for v in raw.values()):
                raise ParameterError(f"{name} line {n} has not one value per column")
            rows.append({k: resolve_type(v) for k, v in raw.items()})
    else:
        raise ParameterError(f"--rows {name}: give a .csv or .jsonl file")
    if not rows:
        raise ParameterError(f"--rows {name} holds no rows")
    return rows


def expand(
    params: Mapping[str, Any], rows: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """Every point's parameters, in order."""
    fixed: dict[str, Any] = {}
    axes: list[list[dict[str, Any]]] = []
    if rows:
        axes.append([dict(r) for r in rows])
    for name, value in params.items():
        if name == ZIP_KEY and isinstance(value, Mapping):
            axes.append(_zipped(value))
        elif isinstance(value, list):
            if not value:
                raise ParameterError(f"parameter {name!r} sweeps over an empty list")
            axes.append([{name: v} for v in value])
        else:
            fixed[name] = value
    points = []
    for combo in itertools.product(*axes):
        point = dict(fixed)
        for part in combo:
            point.update(part)
        points.append(point)
    for point in points[:1]:
        for name in point:
            check_name(name)
    return points


def _zipped(lists: Mapping[str, Any]) -> list[dict[str, Any]]:
    bad = [k for k, v in lists.items() if not isinstance(v, list)]
    if bad or not lists:
        raise ParameterError(
            f"`{ZIP_KEY}:` takes lists of equal length to sweep together"
            + (f"; {', '.join(bad)} is not a list" if bad else "")
        )
    lengths = {k: len(v) for k, v in lists.items()}
    if len(set(lengths.values())) != 1:
        shown = ", ".join(f"{k} has {n}" for k, n in lengths.items())
        raise ParameterError(f"`{ZIP_KEY}:` lists must be of equal length: {shown}")
    names = list(lists)
    return [dict(zip(names, values, strict=True)) for values in zip(*lists.values(), strict=True)]


def describe_point(params: Mapping[str, Any], keys: Iterable[str]) -> str:
    """``lr=0.1 seed=2``: the parameters that vary, for a table or a log line."""
    return " ".join(
        f"{k}={params[k]!r}" if isinstance(params[k], str) else f"{k}={params[k]}"
        for k in keys
        if k in params
    )


def varying(points: Sequence[Mapping[str, Any]]) -> list[str]:
    """The parameter names whose values differ between points, in first-seen order."""
    names: dict[str, None] = {}
    for p in points:
        names.update(dict.fromkeys(p))
    return [n for n in names if len({json.dumps(p.get(n), sort_keys=True) for p in points}) > 1]
