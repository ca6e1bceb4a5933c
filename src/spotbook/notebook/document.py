"""Notebook documents: parse and check input, inject parameters, assemble output.

The only module that imports nbformat. Pure functions over dicts/NotebookNodes;
the bytes come from and go to the store layer.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import logging
import uuid
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import nbformat

from .._errors import NotebookFormatError
from .._models import CellStatus
from .languages import parameters_cell

Notebook = Any  # nbformat.NotebookNode; untyped upstream
log = logging.getLogger(__name__)
_CELL_TYPES = frozenset({"code", "markdown", "raw"})
PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"
# the tag spotbook's own banners carried before they became papermill's alone: an
# output notebook of an older spotbook has them, and they are stale on a rerun
ERROR_TAG = "spotbook-error"
# papermill's tag on its error banner and anchor: tools find (and remove) them by it
PAPERMILL_ERROR_TAG = "papermill-error-cell-tag"
_BANNER_STYLE = (
    'style="color:red; font-family:Helvetica Neue, Helvetica, Arial, sans-serif; font-size:2em;"'
)
SKIP_TAG = "skip-execution"


def load_frozen(text: str | bytes) -> Notebook:
    """A notebook spotbook itself wrote and checked (the run store's input.ipynb)."""
    return nbformat.from_dict(json.loads(text))


def parse(text: str | bytes, where: str) -> Notebook:
    """Parse notebook JSON and check it is a runnable nbformat 4 notebook."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NotebookFormatError(
            f"{where} is not a notebook: its JSON does not parse ({exc}); "
            "the file may be truncated or not an .ipynb at all"
        ) from exc
    except RecursionError:  # nested past the parser's stack: no notebook is
        raise NotebookFormatError(
            f"{where} is not a notebook: its JSON is nested too deeply to be one"
        ) from None
    if not isinstance(data, dict) or ("cells" not in data and "worksheets" not in data):
        raise NotebookFormatError(
            f"{where} is JSON but not a Jupyter notebook (no 'cells'); pass an .ipynb file"
        )
    major = data.get("nbformat")
    if major != 4:
        raise NotebookFormatError(
            f"{where} is in notebook format {major}, spotbook runs format 4; convert it with "
            "`jupyter nbconvert --to notebook --nbformat 4 FILE`"
        )
    cells = data.get("cells")
    if not isinstance(cells, list) or not all(
        isinstance(c, dict) and c.get("cell_type") in _CELL_TYPES and "source" in c for c in cells
    ):
        raise NotebookFormatError(
            f"{where} is not a valid notebook: every cell needs a cell_type "
            "(code, markdown or raw) and a source; open and re-save it in Jupyter to repair it"
        )
    _check_shapes(data, where)
    with warnings.catch_warnings():
        # nbformat warns (and normalises) on missing cell ids and the like.
        warnings.simplefilter("ignore")
        nb = nbformat.reads(json.dumps(data), as_version=4)
        try:
            nbformat.validate(nb)
        except nbformat.ValidationError as exc:
            # nbclient and papermill run such notebooks; so do we, and say so.
            log.warning("%s has format problems (%s); running it anyway", where, exc.message)
    return nb


def _is_text(value: Any) -> bool:
    return isinstance(value, str) or (
        isinstance(value, list) and all(isinstance(v, str) for v in value)
    )


def _check_shapes(data: dict[str, Any], where: str) -> None:
    """Refuse, as bad input, the shapes that would break later: a source that is not text,
    metadata or tags that are not a mapping or a list, a kernelspec that is a string."""
    problems = []
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        problems.append(f"its metadata is {type(metadata).__name__}, not a mapping")
    else:
        for key in ("kernelspec", "language_info"):
            value = metadata.get(key)
            if value is not None and not isinstance(value, dict):
                problems.append(f"metadata.{key} is {value!r}, not a mapping")
    for i, cell in enumerate(data["cells"]):
        if not _is_text(cell["source"]):
            problems.append(f"cell {i}'s source is {type(cell['source']).__name__}, not text")
        meta = cell.get("metadata", {})
        if not isinstance(meta, dict):
            problems.append(f"cell {i}'s metadata is {type(meta).__name__}, not a mapping")
            continue
        tags = meta.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            problems.append(f"cell {i}'s tags are {tags!r}, not a list of strings")
        outputs = cell.get("outputs", [])
        if cell["cell_type"] == "code" and not (
            isinstance(outputs, list) and all(isinstance(o, dict) for o in outputs)
        ):
            problems.append(f"cell {i}'s outputs are not a list of outputs")
    if problems:
        shown = "; ".join(problems[:3]) + (
            f" (and {len(problems) - 3} more)" if problems[3:] else ""
        )
        raise NotebookFormatError(
            f"{where} is not a valid notebook: {shown}; fix it in Jupyter or a text editor "
            "and save it again"
        )


def kernel_name(nb: Notebook, override: str | None) -> str:
    """The kernel to run ``nb`` with: ``override``, else the notebook's kernelspec."""
    if override:
        return override
    spec = nb.metadata.get("kernelspec") or {}
    return str(spec.get("name") or "python3")


def _fit_cell(nb: Notebook, cell: Any) -> Any:
    """Cell ids exist from nbformat 4.5 on; older notebooks must not have them."""
    if (nb.nbformat, nb.nbformat_minor) >= (4, 5):
        cell["id"] = uuid.uuid4().hex[:8]
    else:
        cell.pop("id", None)
    return cell


def remove_error_markers(nb: Notebook) -> Notebook:
    """``nb`` without the error banners an earlier run (papermill's or spotbook's) left."""
    stale = (ERROR_TAG, PAPERMILL_ERROR_TAG)
    kept = [c for c in nb.cells if not set(stale) & set(c.metadata.get("tags", []))]
    if len(kept) != len(nb.cells):
        nb = copy.deepcopy(nb)
        nb.cells = kept
    return nb


def kernel_language(nb: Notebook) -> str:
    """The notebook's language, as its kernelspec (or language_info) says; python when
    neither does."""
    return str(
        (nb.metadata.get("kernelspec") or {}).get("language")
        or (nb.metadata.get("language_info") or {}).get("name")
        or "python"
    )


def inject_parameters(
    nb: Notebook,
    params: Mapping[str, Any],
    kernel: str | None = None,
    language: str | None = None,
) -> Notebook:
    """A copy of ``nb`` with an ``injected-parameters`` cell, as papermill places it and
    in the kernel's language (and without an earlier run's error banners)."""
    nb = copy.deepcopy(remove_error_markers(nb))
    if not params:
        return nb
    source = parameters_cell(kernel_name(nb, kernel), language or kernel_language(nb), params)
    cells = [c for c in nb.cells if INJECTED_TAG not in c.metadata.get("tags", [])]
    new = _fit_cell(nb, nbformat.v4.new_code_cell(source=source))
    new.metadata["tags"] = [INJECTED_TAG]
    where = next(
        (i + 1 for i, c in enumerate(cells) if PARAMETERS_TAG in c.metadata.get("tags", [])),
        0,
    )
    cells.insert(where, new)
    nb.cells = cells
    return nb


def _shallow(nb: Notebook) -> Notebook:
    """A copy of ``nb`` whose own dict, metadata, cell list, cells and cells' metadata
    may be changed without touching ``nb``; everything below them is shared."""
    node = nbformat.NotebookNode
    out = node(nb)
    out.metadata = node(nb.metadata)
    out.cells = [node({**c, "metadata": node(c.get("metadata") or {})}) for c in nb.cells]
    return out


def dumps(nb: Notebook, pretty: bool = True) -> str:
    """Serialise without nbformat's validation and deep copy (they cost O(notebook)).
    ``pretty``: as nbformat writes files (indented, so Python's slower encoder); else
    compact, for the store's refreshes nobody diffs."""
    if not pretty:
        return json.dumps(nb, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"
    return json.dumps(nb, ensure_ascii=False, indent=1, sort_keys=True) + "\n"


def content_hash(nb: Notebook) -> str:
    """Hash of what decides the run's result: cell types, sources, tags, kernel."""
    parts = [{"t": c.cell_type, "s": c.source, "g": c.metadata.get("tags", [])} for c in nb.cells]
    kernel = (nb.metadata.get("kernelspec") or {}).get("name")
    blob = json.dumps({"cells": parts, "kernel": kernel}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def executable(cell: Any) -> bool:
    """Whether a runner sends this cell to the kernel (as nbclient decides)."""
    return bool(
        cell.cell_type == "code"
        and cell.source.strip()
        and SKIP_TAG not in cell.metadata.get("tags", [])
    )


def cell_sources(nb: Notebook) -> list[str]:
    """Every cell's source, as one string each."""
    return [str(c.source) for c in nb.cells]


def cell_tags(nb: Notebook) -> list[list[str]]:
    """Every cell's tags."""
    return [list(c.metadata.get("tags", [])) for c in nb.cells]


def assemble(
    nb: Notebook,
    records: Mapping[int, Mapping[str, Any]],
    *,
    run_meta: Mapping[str, Any],
    running: int | None = None,
    live: list[Any] | None = None,
) -> Notebook:
    """The output notebook: ``nb`` with each finished cell's record applied (and the
    running cell's outputs so far, ``live``).

    Every cell's ``metadata.papermill`` (and ``metadata.spotbook``) says its status and
    times, and the notebook's ``metadata.papermill`` the run's, as papermill writes them;
    cells without a record are cleared and marked pending (or running), and markdown cells
    the run got past are completed. A failed cell gets papermill's banner at the top and
    its anchor just before the cell.

    ``nb`` is not changed, and the result shares what it does not change with ``nb`` and
    ``records`` (a refresh costs no deep copy of the notebook): it is for writing out.
    """
    out = _shallow(nb)
    failed = _first_failure(records)
    frontier = _frontier(nb, records)
    for index, cell in enumerate(out.cells):
        state = _state(nb, index, records, running, frontier)
        _apply(cell, records.get(index), state, live=live if state == "running" else None)
    out.metadata.update(_run_metadata(records, run_meta, failed, nb.metadata.get("papermill")))
    if failed is not None:
        index, rec = failed
        out.cells.insert(index, _marker(out, _anchor_text()))
        banner = _marker(out, _banner_text(rec))
        err = rec.get("error") or {}
        banner.metadata["spotbook"] = {
            "failed_cell": index,
            "ename": err.get("ename", "Error"),
            "evalue": err.get("evalue", ""),
        }
        out.cells.insert(0, banner)
    return out


class CompactWriter:
    """The output notebook as compact JSON, as ``dumps(assemble(...), pretty=False)``
    writes it, at a cost that does not grow with the notebook: each cell's JSON is kept
    and encoded again only when its record or state changed since the last write."""

    def __init__(self) -> None:
        # index -> (record, state, JSON): the record is held, so its identity stays its own
        self._cells: dict[int, tuple[Any, str, str]] = {}

    def dumps(
        self,
        nb: Notebook,
        records: Mapping[int, Mapping[str, Any]],
        *,
        run_meta: Mapping[str, Any],
        running: int | None = None,
        widgets: Mapping[str, Any] | None = None,
        live: list[Any] | None = None,
    ) -> str:
        failed = _first_failure(records)
        others = {k: v for k, v in nb.items() if k != "cells"}
        if failed is not None or any(k < "cells" for k in others):
            # banners move every cell (and a key before "cells" would too): written whole
            out = assemble(nb, records, run_meta=run_meta, running=running, live=live)
            if widgets:
                out.metadata["widgets"] = dict(widgets)
            return dumps(out, pretty=False)
        frontier = _frontier(nb, records)
        parts = []
        for index, cell in enumerate(nb.cells):
            rec = records.get(index)
            state = _state(nb, index, records, running, frontier)
            kept = self._cells.get(index)
            # (the running cell's timing metadata fills in as it runs: never kept)
            if kept is None or kept[0] is not rec or kept[1] != state or state == "running":
                view = {**cell, "metadata": dict(cell.get("metadata") or {})}
                _apply(view, rec, state, share=True, live=live if state == "running" else None)
                kept = self._cells[index] = (rec, state, _compact(view))
            parts.append(kept[2])
        meta = nbformat.NotebookNode(nb.metadata)
        meta.update(_run_metadata(records, run_meta, None, nb.metadata.get("papermill")))
        if widgets:
            meta["widgets"] = dict(widgets)
        rest = _compact({**others, "metadata": meta})
        # "cells" sorts before every other key: the same bytes as the whole dumped at once
        body = rest[1:] if rest != "{}" else "}"
        sep = "," if rest != "{}" else ""
        return f'{{"cells":[{",".join(parts)}]{sep}{body}\n'


def _compact(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _first_failure(
    records: Mapping[int, Mapping[str, Any]],
) -> tuple[int, Mapping[str, Any]] | None:
    failed = [i for i, r in records.items() if r["status"] == CellStatus.FAILED]
    return (min(failed), records[min(failed)]) if failed else None


def _frontier(nb: Notebook, records: Mapping[int, Any]) -> int:
    """The first code cell the run has not finished: the cells before it are done."""
    return next(
        (i for i, c in enumerate(nb.cells) if c.cell_type == "code" and i not in records),
        len(nb.cells),
    )


def _state(
    nb: Notebook, index: int, records: Mapping[int, Any], running: int | None, frontier: int
) -> str:
    """What, besides its record, decides how cell ``index`` is written."""
    if index in records:
        return "done"
    if index == running:
        return "running"
    if index < frontier and nb["cells"][index]["cell_type"] != "code":
        return "passed"
    return "pending"


def _apply(
    cell: Any,
    rec: Mapping[str, Any] | None,
    state: str,
    *,
    share: bool = False,
    live: list[Any] | None = None,
) -> None:
    """Write a record (or its absence, as ``state``) into a shallow copy of a cell.
    ``share``: the copy is only encoded, never changed, so the record's metadata is put
    in as it is rather than copied. ``live``: the running cell's outputs so far."""
    metadata = cell["metadata"]
    if cell["cell_type"] == "code":
        cell["outputs"] = list(rec["outputs"]) if rec else list(live or [])
        cell["execution_count"] = rec.get("execution_count") if rec else None
    if rec and rec.get("metadata"):
        metadata.update(rec["metadata"] if share else copy.deepcopy(dict(rec["metadata"])))
    meta: dict[str, Any] = {"status": "pending"}
    meta.update(start_time=None, end_time=None, duration=None, exception=None)
    if rec:
        meta.update(
            status=rec["status"],
            start_time=_iso(rec.get("start")),
            end_time=_iso(rec.get("end")),
            duration=rec.get("duration"),
            exception=rec["status"] == CellStatus.FAILED,
        )
    elif state == "running":
        meta["status"] = "running"
    elif state == "passed":
        meta.update(status="completed", exception=False)
    metadata["papermill"] = meta
    metadata["spotbook"] = dict(meta)


def _run_metadata(
    records: Mapping[int, Mapping[str, Any]],
    run_meta: Mapping[str, Any],
    failed: tuple[int, Mapping[str, Any]] | None,
    given: Any = None,
) -> dict[str, Any]:
    """The notebook's ``metadata.spotbook`` and papermill's ``metadata.papermill``; what
    spotbook does not know itself is kept from ``given``, the input's ``metadata.papermill``
    (papermill's, where papermill parameterised the notebook and runs spotbook as its
    engine)."""
    starts = [r["start"] for r in records.values() if r.get("start") is not None]
    ends = [r["end"] for r in records.values() if r.get("end") is not None]
    begun, ended = (min(starts) if starts else None), (max(ends) if ends else None)
    done = bool(run_meta.get("final"))
    given = given if isinstance(given, Mapping) else {}

    def known(key: str, empty: Any) -> Any:
        ours = run_meta.get(key)
        if ours and not (isinstance(ours, str) and ours.startswith("<")):  # <NotebookNode>
            return ours
        return given.get(key, ours if ours is not None else empty)

    return {
        "spotbook": dict(run_meta),
        "papermill": {
            "default_parameters": dict(given.get("default_parameters") or {}),
            "duration": round(ended - begun, 6) if done and begun and ended else None,
            "end_time": _iso(ended) if done else None,
            "environment_variables": dict(given.get("environment_variables") or {}),
            "exception": failed is not None,
            "input_path": known("input_path", None),
            "output_path": known("output_path", None),
            "parameters": dict(known("parameters", {}) or {}),
            "start_time": _iso(begun),
            "version": run_meta.get("version"),
        },
    }


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat()


def _banner_text(rec: Mapping[str, Any]) -> str:
    """papermill's banner, word for word (tools match it): a link to the anchor. Which
    cell failed and how is in the banner cell's ``metadata.spotbook``."""
    count = rec.get("execution_count")
    return (
        f"<span {_BANNER_STYLE}>An Exception was encountered at "
        f"'<a href=\"#papermill-error-cell\">In [{count}]</a>'.</span>"
    )


def _anchor_text() -> str:
    return (
        f'<span id="papermill-error-cell" {_BANNER_STYLE}>'
        "Execution using papermill encountered an exception here and stopped:</span>"
    )


def _marker(nb: Notebook, text: str) -> Any:
    cell = _fit_cell(nb, nbformat.v4.new_markdown_cell(source=text))
    cell.metadata["tags"] = [PAPERMILL_ERROR_TAG]
    return cell


def outputs_copy(outputs: Sequence[Any]) -> list[Any]:
    """Recorded outputs as NotebookNodes a client can update in place."""
    return [nbformat.from_dict(copy.deepcopy(o)) for o in outputs]
