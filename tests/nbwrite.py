"""One way the tests write a notebook (importable without pytest's fixtures)."""

from __future__ import annotations

from pathlib import Path


def write_notebook(path: Path, *sources: str, parameters: bool = False) -> None:
    """A Python 3 notebook with one code cell per source; ``parameters``: the first is
    tagged as papermill's parameters cell."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    if parameters:
        nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)
