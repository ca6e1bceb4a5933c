"""scrapbook both ways: what ``spotbook.record`` keeps, scrapbook's ``read_notebook``
reads as scraps; what scrapbook's ``glue`` keeps (and papermill's older ``record``),
``sweep status`` and ``sweep results`` gather as a point's results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import cli, write_notebook

pytestmark = pytest.mark.slow


def test_scrapbook_reads_what_spotbook_recorded(tmp_path: Path) -> None:
    import scrapbook as sb

    write_notebook(
        tmp_path / "nb.ipynb",
        "import spotbook\nspotbook.record('acc', 0.91)\nspotbook.record('cfg', {'lr': [1, 2]})",
        "spotbook.record('acc', 0.93)\nspotbook.record('nothing', None)",
    )
    r = cli("run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    book = sb.read_notebook(str(tmp_path / "out.ipynb"))
    # the last value of a name, as scrapbook keeps glue; a None is spotbook's alone
    assert book.scraps.data_dict == {"acc": 0.93, "cfg": {"lr": [1, 2]}}
    assert book.scrap_dataframe["name"].tolist() == ["acc", "cfg"]


def test_sweep_results_gather_scrapbooks_glue(tmp_path: Path) -> None:
    write_notebook(
        tmp_path / "sweep.ipynb",
        "lr = 0.1",
        "import scrapbook as sb\nsb.glue('loss', round(lr * 2, 6))\n"
        "sb.glue('curve', [lr, lr / 2])\nsb.glue('label', 'lr=' + str(lr))",
        parameters=True,
    )
    r = cli("sweep", "sweep.ipynb", "--run-dir", "sw", "-p", "lr", "0.1,0.5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = cli("sweep", "results", "sw", "-o", "results.jsonl", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(x["lr"], x["loss"], x["curve"], x["label"]) for x in rows] == [
        (0.1, 0.2, [0.1, 0.05], "lr=0.1"),
        (0.5, 1.0, [0.5, 0.25], "lr=0.5"),
    ]
    status = cli("sweep", "status", "sw", "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert "loss" in status.stdout


def test_papermills_older_record_is_a_result_too(tmp_path: Path) -> None:
    """``papermill.record`` (papermill 1.x) wrote ``application/papermill.record+json``;
    notebooks still carry it."""
    write_notebook(
        tmp_path / "sweep.ipynb",
        "lr = 0.1",
        "from IPython.display import display\n"
        "display({'application/papermill.record+json': {'score': lr * 10}}, raw=True)",
        parameters=True,
    )
    r = cli("sweep", "sweep.ipynb", "--run-dir", "sw", "-p", "lr", "0.2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = cli("sweep", "results", "sw", "-o", "r.jsonl", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "r.jsonl").read_text())["score"] == 2.0
