"""papermill's progress bar: tqdm on stderr, one step per cell of the notebook.

The only module that imports tqdm. ``tqdm.auto`` draws a widget when the caller is a
Jupyter kernel with ipywidgets and a text bar elsewhere, as papermill does. The bar
goes to stderr, never through ``logging``, so a log file never holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from .._errors import UsageError

_DESCRIPTION_MARK = "papermill_description="
_WIDTH = 40  # characters of a cell's first line shown as the bar's description


class Progress(Protocol):
    """What the runner tells whoever shows progress (the bar, or a test's recorder)."""

    def begin(self, total: int, done: int) -> None:
        """The attempt starts with ``done`` of ``total`` cells already behind it."""

    def cell(self, index: int, source: str) -> None:
        """Cell ``index`` starts running."""

    def advance(self, done: int) -> None:
        """The first ``done`` cells are finished (and committed)."""

    def close(self) -> None:
        """The attempt is over, whatever its outcome."""


def description(source: str, *, first_line: bool) -> str | None:
    """papermill's ``papermill_description=NAME`` marker; else, where asked, the first
    non-blank line of the cell, shortened."""
    if _DESCRIPTION_MARK in source:
        words = source.split(_DESCRIPTION_MARK, 1)[1].split()
        if words:
            return words[0]
    if not first_line:
        return None
    line = next((ln.strip() for ln in source.splitlines() if ln.strip()), "")
    if not line:
        return None
    return line if len(line) <= _WIDTH else line[: _WIDTH - 1] + "…"


class ProgressBar:
    """tqdm's bar as papermill draws it: ``Executing: 40%|████  | 4/10 [00:02<00:03,
    1.9cell/s]``. ``setting`` is papermill's ``progress_bar``: a bool, or a dict of tqdm
    arguments. ``describe_cells`` shows each cell's first line as the description
    (meant for when cell output is not echoed: the line then says what is running)."""

    def __init__(self, setting: bool | Mapping[str, Any], *, describe_cells: bool) -> None:
        if not isinstance(setting, bool | Mapping):
            raise UsageError(
                f"progress_bar must be True, False or a dict of tqdm arguments, not "
                f"{type(setting).__name__}"
            )
        self.kwargs: dict[str, Any] | None = None
        if setting:
            self.kwargs = {"unit": "cell", "desc": "Executing"}
            if isinstance(setting, Mapping):
                self.kwargs.update(setting)
        self.describe_cells = describe_cells
        self._bar: Any = None

    def begin(self, total: int, done: int) -> None:
        if self.kwargs is None or self._bar is not None:
            return
        from tqdm.auto import tqdm

        self._bar = tqdm(total=total, initial=done, **self.kwargs)

    def cell(self, index: int, source: str) -> None:
        if self._bar is None:
            return
        text = description(source, first_line=self.describe_cells)
        if text is not None:
            assert self.kwargs is not None
            self._bar.set_description(f"{self.kwargs['desc']} {text}")

    def advance(self, done: int) -> None:
        if self._bar is not None and done != self._bar.n:
            self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
