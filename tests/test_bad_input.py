"""Bad input, table-driven: every case gets a clear message, its documented exit code, and
leaves either no run store or a complete one — never a half-made one, never a traceback.

Each row: what to put in the working directory, the command line, the exit code, a
fragment of the message, and what must be left at ``rd`` ("none": nothing; "complete":
a sealed run.json and the frozen notebook). Most cases fail before a kernel starts, so
the table is cheap; the accepted-input rows run a real kernel.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import cli

BASE: dict[str, Any] = {
    "nbformat": 4,
    "nbformat_minor": 5,
    "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    },
    "cells": [
        {
            "cell_type": "code",
            "id": "p",
            "metadata": {"tags": ["parameters"]},
            "source": "d = None\nlr = 0.1",
            "outputs": [],
            "execution_count": None,
        },
        {
            "cell_type": "code",
            "id": "c",
            "metadata": {},
            "source": "print(repr(d), lr)",
            "outputs": [],
            "execution_count": None,
        },
    ],
}


def nb(change: Callable[[dict[str, Any]], Any] | None = None) -> str:
    """The base notebook's JSON, after ``change`` (which edits it in place)."""
    doc = copy.deepcopy(BASE)
    if change:
        change(doc)
    return json.dumps(doc)


def cell(i: int, **kw: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["cells"][i].update(kw)


def meta(**kw: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["metadata"].update(kw)


def tags(value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["cells"][0]["metadata"].update(tags=value)


RUN = ["run", "in.ipynb", "out.ipynb", "--run-dir", "rd"]
DRY = ["submit", "in.ipynb", "--run-dir", "gs://b/runs/x", "--image", "img:1", "--dry-run"]

# (id, files, argv, code, fragment, left)
# fmt: off
CASES: list[tuple[str, dict[str, str | bytes], list[str], int, str, str]] = [
    # -- the notebook ---------------------------------------------------------------
    ("missing input", {}, RUN, 2, "does not exist", "none"),
    ("input is a directory", {"in.ipynb/x": "1"}, RUN, 2, "is a directory", "none"),
    ("empty file", {"in.ipynb": ""}, RUN, 2, "not a notebook", "none"),
    ("not JSON", {"in.ipynb": "hello"}, RUN, 2, "not a notebook", "none"),
    ("truncated JSON", {"in.ipynb": nb()[:-30]}, RUN, 2, "truncated", "none"),
    ("JSON list", {"in.ipynb": "[1, 2]"}, RUN, 2, "not a Jupyter notebook", "none"),
    ("no cells", {"in.ipynb": '{"nbformat": 4, "metadata": {}}'}, RUN, 2, "no 'cells'", "none"),
    ("nbformat 3", {"in.ipynb": nb(lambda d: d.update(nbformat=3))}, RUN, 2, "format 3", "none"),
    ("no nbformat", {"in.ipynb": nb(lambda d: d.pop("nbformat"))}, RUN, 2, "format None", "none"),
    ("cells not a list", {"in.ipynb": nb(lambda d: d.update(cells={}))}, RUN, 2, "cell_type", "none"),
    ("cell without type", {"in.ipynb": nb(lambda d: d["cells"][1].pop("cell_type"))}, RUN, 2, "cell_type", "none"),
    ("unknown cell type", {"in.ipynb": nb(cell(1, cell_type="sql"))}, RUN, 2, "cell_type", "none"),
    ("cell without source", {"in.ipynb": nb(lambda d: d["cells"][1].pop("source"))}, RUN, 2, "source", "none"),
    ("source is a number", {"in.ipynb": nb(cell(1, source=42))}, RUN, 2, "cell 1's source is int", "none"),
    ("source list with a number", {"in.ipynb": nb(cell(1, source=["a", 1]))}, RUN, 2, "cell 1's source is list", "none"),
    ("source is null", {"in.ipynb": nb(cell(1, source=None))}, RUN, 2, "cell 1's source is NoneType", "none"),
    ("cell metadata null", {"in.ipynb": nb(cell(1, metadata=None))}, RUN, 2, "cell 1's metadata is NoneType", "none"),
    ("cell metadata a list", {"in.ipynb": nb(cell(1, metadata=[]))}, RUN, 2, "cell 1's metadata is list", "none"),
    ("tags null", {"in.ipynb": nb(tags(None))}, RUN, 2, "cell 0's tags are None", "none"),
    ("tags a string", {"in.ipynb": nb(tags("parameters"))}, RUN, 2, "cell 0's tags are 'parameters'", "none"),
    ("tags with a number", {"in.ipynb": nb(tags(["parameters", 3]))}, RUN, 2, "not a list of strings", "none"),
    ("notebook metadata null", {"in.ipynb": nb(lambda d: d.update(metadata=None))}, RUN, 2, "its metadata is NoneType", "none"),
    ("kernelspec a string", {"in.ipynb": nb(meta(kernelspec="python3"))}, RUN, 2, "metadata.kernelspec is 'python3'", "none"),
    ("language_info a string", {"in.ipynb": nb(meta(language_info="python"))}, RUN, 2, "metadata.language_info", "none"),
    ("outputs not a list", {"in.ipynb": nb(cell(1, outputs={}))}, RUN, 2, "outputs are not a list", "none"),
    ("outputs of numbers", {"in.ipynb": nb(cell(1, outputs=[1]))}, RUN, 2, "outputs are not a list", "none"),
    ("binary garbage", {"in.ipynb": b"\x89PNG\r\n\x1a\n\x00\x00"}, RUN, 2, "not a notebook", "none"),
    ("latin-1 bytes in JSON", {"in.ipynb": b'{"cells": [], "x": "\xe9"}'}, RUN, 2, "not a notebook", "none"),
    ("unknown URL scheme", {}, ["run", "nope://b/in.ipynb", "out.ipynb", "--run-dir", "rd"], 2, "nope://", "none"),
    ("unknown kernel in the notebook", {"in.ipynb": nb(meta(kernelspec={"name": "no-such-k", "display_name": "x"}))}, RUN, 2, "no Jupyter kernel named 'no-such-k'", "none"),
    ("unknown kernel flag", {"in.ipynb": nb()}, [*RUN, "-k", "no-such-k"], 2, "no Jupyter kernel named 'no-such-k'", "none"),
    # -- parameters -------------------------------------------------------------------
    ("-p name starts with a digit", {"in.ipynb": nb()}, [*RUN, "-p", "1x", "1"], 2, "not a valid Python variable", "none"),
    ("-p keyword", {"in.ipynb": nb()}, [*RUN, "-p", "class", "1"], 2, "not a valid Python variable", "none"),
    ("-p name with a dash", {"in.ipynb": nb()}, [*RUN, "-p", "a-b", "1"], 2, "not a valid Python variable", "none"),
    ("-r keyword", {"in.ipynb": nb()}, [*RUN, "-r", "def", "x"], 2, "not a valid Python variable", "none"),
    ("-y a list", {"in.ipynb": nb()}, [*RUN, "-y", "[1, 2]"], 2, "YAML mapping", "none"),
    ("-y not YAML", {"in.ipynb": nb()}, [*RUN, "-y", "a: [1"], 2, "not valid YAML", "none"),
    ("-y a number key", {"in.ipynb": nb()}, [*RUN, "-y", "{1: 2}"], 2, "not a valid Python variable", "none"),
    ("-f missing", {"in.ipynb": nb()}, [*RUN, "-f", "p.yaml"], 2, "does not exist", "none"),
    ("-f a directory", {"in.ipynb": nb(), "p.yaml/x": "1"}, [*RUN, "-f", "p.yaml"], 2, "cannot read parameters file", "none"),
    ("-f not YAML", {"in.ipynb": nb(), "p.yaml": "a: [1"}, [*RUN, "-f", "p.yaml"], 2, "not valid YAML", "none"),
    ("-f a list", {"in.ipynb": nb(), "p.yaml": "- 1\n- 2\n"}, [*RUN, "-f", "p.yaml"], 2, "YAML mapping", "none"),
    ("-f binary", {"in.ipynb": nb(), "p.yaml": b"\xff\xfe\x00"}, [*RUN, "-f", "p.yaml"], 2, "parameters file", "none"),
    ("-p missing value", {"in.ipynb": nb()}, [*RUN, "-p", "lr"], 2, "expected 2 arguments", "none"),
    # -- parameters papermill accepts: they must work ------------------------------------
    ("-y date", {"in.ipynb": nb()}, [*RUN, "-y", "d: 2024-01-01"], 0, "", "complete"),
    ("-y datetime", {"in.ipynb": nb()}, [*RUN, "-y", "d: 2024-01-01 10:00:00"], 0, "", "complete"),
    ("-y binary", {"in.ipynb": nb()}, [*RUN, "-y", "d: !!binary aGVsbG8="], 0, "", "complete"),
    ("-y set", {"in.ipynb": nb()}, [*RUN, "-y", "d: !!set {a}"], 0, "", "complete"),
    ("-y nested date", {"in.ipynb": nb()}, [*RUN, "-y", "d: {when: [2024-01-01]}"], 0, "", "complete"),
    ("-f with dates", {"in.ipynb": nb(), "p.yaml": "d: 2024-02-03\nlr: 0.5\n"}, [*RUN, "-f", "p.yaml"], 0, "", "complete"),
    ("-p nan", {"in.ipynb": nb()}, [*RUN, "-p", "lr", "nan"], 0, "", "complete"),
    ("-p inf", {"in.ipynb": nb()}, [*RUN, "-p", "lr", "inf"], 0, "", "complete"),
    # -- limits --------------------------------------------------------------------------
    ("--timeout nan", {"in.ipynb": nb()}, [*RUN, "--timeout", "nan"], 2, "--timeout must be a positive, finite", "none"),
    ("--timeout inf", {"in.ipynb": nb()}, [*RUN, "--timeout", "inf"], 2, "--timeout must be a positive, finite", "none"),
    ("--timeout negative", {"in.ipynb": nb()}, [*RUN, "--timeout", "-1"], 2, "--timeout must be", "none"),
    ("--timeout zero", {"in.ipynb": nb()}, [*RUN, "--timeout", "0"], 2, "--timeout must be", "none"),
    ("--timeout text", {"in.ipynb": nb()}, [*RUN, "--timeout", "soon"], 2, "--timeout", "none"),
    ("--execution-timeout zero", {"in.ipynb": nb()}, [*RUN, "--execution-timeout", "0"], 2, "--execution-timeout must be", "none"),
    ("--execution-timeout nan", {"in.ipynb": nb()}, [*RUN, "--execution-timeout", "nan"], 2, "--execution-timeout must be", "none"),
    ("--start-timeout zero", {"in.ipynb": nb()}, [*RUN, "--start-timeout", "0"], 2, "--start-timeout must be", "none"),
    ("--start-timeout inf", {"in.ipynb": nb()}, [*RUN, "--start-timeout", "inf"], 2, "--start-timeout must be", "none"),
    ("--grace negative", {"in.ipynb": nb()}, [*RUN, "--grace", "-1"], 2, "--grace must be", "none"),
    ("--grace nan", {"in.ipynb": nb()}, [*RUN, "--grace", "nan"], 2, "--grace must be", "none"),
    ("--max-preemptions negative", {"in.ipynb": nb()}, [*RUN, "--max-preemptions", "-1"], 2, "--max-preemptions must be", "none"),
    ("--max-output-bytes zero", {"in.ipynb": nb()}, [*RUN, "--max-output-bytes", "0"], 2, "--max-output-bytes must be", "none"),
    ("--checkpoint-interval zero", {"in.ipynb": nb()}, [*RUN, "--checkpoint-interval", "0"], 2, "--checkpoint-interval must be", "none"),
    ("--snapshot unknown", {"in.ipynb": nb()}, [*RUN, "--snapshot", "sometimes"], 2, "--snapshot", "none"),
    # -- places ----------------------------------------------------------------------------
    ("output directory missing", {"in.ipynb": nb()}, ["run", "in.ipynb", "nodir/out.ipynb", "--run-dir", "rd"], 2, "does not exist", "none"),
    ("output is a directory", {"in.ipynb": nb(), "out.ipynb/x": "1"}, RUN, 2, "is a directory", "none"),
    ("--cwd missing", {"in.ipynb": nb()}, [*RUN, "--cwd", "nodir"], 2, "--cwd", "none"),
    ("--run-dir is a file", {"in.ipynb": nb(), "rd": "x"}, RUN, 2, "give --run-dir a directory", "file"),
    ("--run-dir under a file", {"in.ipynb": nb(), "f": "x"}, ["run", "in.ipynb", "out.ipynb", "--run-dir", "f/rd"], 2, "give --run-dir a directory", "none"),
    ("corrupt run.json", {"in.ipynb": nb(), "rd/run.json": "{"}, RUN, 2, "run.json is not valid JSON", "kept"),
    ("missing file:// input", {}, ["run", "file:///nonexistent/in.ipynb", "out.ipynb", "--run-dir", "rd"], 2, "does not exist", "none"),
    ("resume of no run", {}, ["resume", "rd"], 2, "no spotbook run", "none"),
    ("resume of an empty directory", {"rd/x": ""}, ["resume", "rd"], 2, "no spotbook run", "kept"),
    ("status of no run", {}, ["status", "no-such-run"], 2, "no-such-run", "none"),
    # -- submit (its checks come before any cluster is asked) --------------------------
    ("submit without --run-dir", {"in.ipynb": nb()}, ["submit", "in.ipynb", "--image", "i"], 2, "needs --run-dir URL", "none"),
    ("submit to a local run dir", {"in.ipynb": nb()}, ["submit", "in.ipynb", "--run-dir", "rd", "--image", "i"], 2, "needs --run-dir URL", "none"),
    ("submit with a local output", {"in.ipynb": nb()}, ["submit", "in.ipynb", "out.ipynb", "--run-dir", "gs://b/r", "--image", "i"], 2, "local path", "none"),
    ("submit --cwd", {"in.ipynb": nb()}, [*DRY, "--cwd", "."], 2, "--cwd", "none"),
    ("submit --prepare-only", {"in.ipynb": nb()}, [*DRY, "--prepare-only"], 2, "--prepare-only", "none"),
    ("submit --gpu bad count", {"in.ipynb": nb()}, [*DRY, "--gpu", "nvidia-l4:x"], 2, "--gpu", "none"),
    ("submit --backoff-limit negative", {"in.ipynb": nb()}, [*DRY, "--backoff-limit", "-1"], 2, "--backoff-limit", "none"),
    ("submit --ttl bad", {"in.ipynb": nb()}, [*DRY, "--ttl", "soon"], 2, "--ttl", "none"),
    ("submit --deadline bad", {"in.ipynb": nb()}, [*DRY, "--deadline", "1y"], 2, "--deadline", "none"),
    ("submit --env without =", {"in.ipynb": nb()}, [*DRY, "--env", "NOEQ"], 2, "--env", "none"),
    ("submit --secret-env without key", {"in.ipynb": nb()}, [*DRY, "--secret-env", "A=s"], 2, "--secret-env", "none"),
    ("submit --secret-env bad secret", {"in.ipynb": nb()}, [*DRY, "--secret-env", "A=Bad_S:k"], 2, "not a valid Secret name", "none"),
    ("submit --image empty", {"in.ipynb": nb()}, [*DRY[:-3], "--image", "", "--dry-run"], 2, "is not an image reference", "none"),
    ("submit --image with a newline", {"in.ipynb": nb()}, [*DRY[:-3], "--image", "img:1\nx", "--dry-run"], 2, "is not an image reference", "none"),
    ("submit --cpu lots", {"in.ipynb": nb()}, [*DRY, "--cpu", "lots"], 2, "--cpu 'lots' is not a positive Kubernetes quantity", "none"),
    ("submit --memory in words", {"in.ipynb": nb()}, [*DRY, "--memory", "16 GB please"], 2, "--memory '16 GB please' is not a positive", "none"),
    ("submit --service-account not a name", {"in.ipynb": nb()}, [*DRY, "--service-account", "My Account"], 2, "--service-account 'My Account' is not a valid name", "none"),
    ("submit --gpu beyond any node", {"in.ipynb": nb()}, [*DRY, "--gpu", "nvidia-l4:99999999999999999999999"], 2, "more than any node has", "none"),
    ("submit --env trusting unsealed stores", {"in.ipynb": nb()}, [*DRY, "--env", "SPOTBOOK_TRUST_LEGACY_STORE=1"], 2, "a pod never trusts a store without seals", "none"),
    ("submit --env naming the run store", {"in.ipynb": nb()}, [*DRY, "--env", "SPOTBOOK_RUN_DIR=gs://b/other"], 2, "spotbook sets SPOTBOOK_RUN_DIR in the pod itself", "none"),
    ("submit --env HOME", {"in.ipynb": nb()}, [*DRY, "--env", "HOME=/root"], 2, "spotbook sets HOME in the pod itself", "none"),
    ("submit --secret-env the key", {"in.ipynb": nb()}, [*DRY, "--secret-env", "SPOTBOOK_SNAPSHOT_KEY=s:k"], 2, "the run key goes in --key-secret", "none"),
    ("submit --env twice", {"in.ipynb": nb()}, [*DRY, "--env", "A=1", "--secret-env", "A=s:k"], 2, "A is given twice", "none"),
    ("submit --env-from-secret bad", {"in.ipynb": nb()}, [*DRY, "--env-from-secret", "Bad_S"], 2, "not a valid Secret name", "none"),
    ("submit --key-secret bad", {"in.ipynb": nb()}, [*DRY, "--key-secret", "Bad_S"], 2, "--key-secret", "none"),
    ("submit --namespace bad", {"in.ipynb": nb()}, [*DRY, "--namespace", "Bad_NS"], 2, "--namespace", "none"),
    ("submit --queue bad", {"in.ipynb": nb()}, [*DRY, "--queue", "a b"], 2, "--queue", "none"),
    ("submit --provider unknown", {"in.ipynb": nb()}, [*DRY, "--provider", "ibm"], 2, "--provider", "none"),
    ("submit bad notebook", {"in.ipynb": nb(cell(1, source=42))}, DRY, 2, "cell 1's source is int", "none"),
    ("submit bad parameter", {"in.ipynb": nb()}, [*DRY, "-p", "1x", "1"], 2, "not a valid Python variable", "none"),
    # -- the command line ----------------------------------------------------------------
    ("unknown command", {}, ["frobnicate"], 2, "invalid choice", "none"),
    ("run without input", {}, ["run"], 2, "the following arguments are required", "none"),
    ("--log-level unknown", {"in.ipynb": nb()}, [*RUN, "--log-level", "LOUD"], 2, "--log-level", "none"),
    ("worker without a run", {}, ["worker"], 2, "SPOTBOOK_RUN_DIR", "none"),
    ("worker with half the classic variables", {}, ["worker"], 2, "DOWNLOAD_FILE_PATH is not set", "none"),
    # -- numbers and paths checked before anything is written ---------------------
    ("--snapshot-interval nan", {"in.ipynb": nb()}, [*RUN, "--snapshot-interval", "nan"], 2, "--snapshot-interval must be a finite", "none"),
    ("simulate --trials 1e9", {}, ["simulate", "--from", "rd", "--trials", "1000000000"], 2, "--trials must be 1 to 100000", "none"),
    ("simulate --trials 0", {}, ["simulate", "--from", "rd", "--trials", "0"], 2, "--trials must be 1 to 100000", "none"),
    ("simulate --delay nan", {}, ["simulate", "--from", "rd", "--delay", "nan"], 2, "--delay must be a finite", "none"),
    ("simulate --interval inf", {}, ["simulate", "--from", "rd", "--interval", "inf"], 2, "--interval must be a positive, finite", "none"),
    ("--stdout-file in a missing folder", {"in.ipynb": nb()}, [*RUN, "--stdout-file", "missing/x.txt"], 2, "does not exist; make it first", "none"),
    ("--stderr-file a folder", {"in.ipynb": nb(), "d/x": "1"}, [*RUN, "--stderr-file", "d"], 2, "is a folder", "none"),
    ("--name with a slash", {"in.ipynb": nb()}, ["run", "in.ipynb", "out.ipynb", "--name", "../x"], 2, "--name '../x': letters, digits", "none"),
    ("--name and --run-dir", {"in.ipynb": nb()}, [*RUN, "--name", "x"], 2, "give --name or --run-dir, not both", "none"),
    ("key file /dev/zero", {"in.ipynb": nb()}, RUN, 2, "is not a plain file (a directory, FIFO, socket or device)", "none"),
    ("--run-dir others can write", {"in.ipynb": nb(), "rd/.keep": ""}, RUN, 2, "can be changed by other users (mode 777)", "kept"),
    ("key file a FIFO", {"in.ipynb": nb()}, RUN, 2, "is not a plain file (a directory, FIFO, socket or device)", "none"),
    ("key file past 64 KiB", {"in.ipynb": nb(), "key": "k" * 70_000}, RUN, 2, "larger than 64 KiB: it holds no key", "none"),
    ("key file others can change", {"in.ipynb": nb(), "key": "k" * 64}, RUN, 2, "can be changed by other users (mode 666)", "none"),
    ("key of 3 letters", {"in.ipynb": nb()}, RUN, 2, "has 3 characters; a key needs at least 32", "none"),
    ("-f /dev/zero", {"in.ipynb": nb()}, [*RUN, "-f", "/dev/zero"], 2, "larger than 64 MiB", "none"),
    ("-y alias bomb", {"in.ipynb": nb()}, [*RUN, "-y", "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b, *b, *b, *b, *b]"], 2, "uses a YAML alias", "none"),
    ("-f nested past the parser", {"in.ipynb": nb(), "deep.yaml": "[" * 100_000 + "]" * 100_000}, [*RUN, "-f", "deep.yaml"], 2, "nested too deeply", "none"),
    ("cost --prices nested past the parser", {"deep.json": "[" * 100_000 + "]" * 100_000}, ["cost", "rd", "--prices", "deep.json"], 2, "--prices deep.json is not a price table", "none"),
    ("--run-dir where no folder can be made", {"in.ipynb": nb()}, ["run", "in.ipynb", "out.ipynb", "--run-dir", "/proc/self/x"], 2, "give --run-dir a directory", "none"),
    ("notebook nested past the parser", {"in.ipynb": "[" * 100_000 + "]" * 100_000}, RUN, 2, "nested too deeply to be one", "none"),
    ("notebook of objects nested past the parser", {"in.ipynb": '{"a":' * 100_000 + "1" + "}" * 100_000}, RUN, 2, "nested too deeply to be one", "none"),
    ("submit a notebook nested past the parser", {"in.ipynb": "[" * 100_000 + "]" * 100_000}, DRY, 2, "nested too deeply to be one", "none"),
    ("sweep --rows nested past the parser", {"in.ipynb": nb(), "g.jsonl": "[" * 100_000 + "]" * 100_000 + "\n"}, ["sweep", "in.ipynb", "--run-dir", "rd", "--rows", "g.jsonl"], 2, "g.jsonl line 1 is nested too deeply", "none"),
    ("submit --ttl past 68 years", {"in.ipynb": nb()}, [*DRY, "--ttl", "99999999999999d"], 2, "--ttl: 8639999999999913600 s is out of Kubernetes' range", "none"),
    ("submit --deadline 0 (the API server takes none)", {"in.ipynb": nb()}, [*DRY, "--deadline", "0"], 2, "--deadline: 0 s is out of Kubernetes' range (1 s", "none"),
    ("submit --deadline past 68 years", {"in.ipynb": nb()}, [*DRY, "--deadline", "99999999999999h"], 2, "--deadline: 359999999999996400 s is out of Kubernetes' range", "none"),
    ("submit --backoff-limit past int32", {"in.ipynb": nb()}, [*DRY, "--backoff-limit", "99999999999"], 2, "--backoff-limit 99999999999 is out of range (0 to 2147483647)", "none"),
]
# fmt: on

ENVS = {
    "worker with half the classic variables": {"BUCKET_NAME": "b"},
    "key file /dev/zero": {"SPOTBOOK_SNAPSHOT_KEY_FILE": "/dev/zero"},
    "key file a FIFO": {"SPOTBOOK_SNAPSHOT_KEY_FILE": "{tmp}/fifo"},
    "key file past 64 KiB": {"SPOTBOOK_SNAPSHOT_KEY_FILE": "{tmp}/key"},
    "key file others can change": {"SPOTBOOK_SNAPSHOT_KEY_FILE": "{tmp}/key"},
    "key of 3 letters": {"SPOTBOOK_SNAPSHOT_KEY": "abc"},
}


@pytest.mark.parametrize(
    ("files", "argv", "code", "fragment", "left"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_bad_input(
    files: dict[str, str | bytes],
    argv: list[str],
    code: int,
    fragment: str,
    left: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    before = {p for p in (tmp_path / "rd").rglob("*")} if (tmp_path / "rd").is_dir() else set()
    case = request.node.callspec.id
    env = {k: v.format(tmp=tmp_path) for k, v in ENVS.get(case, {}).items()}
    if case == "key file a FIFO":
        os.mkfifo(tmp_path / "fifo")
    if case == "--run-dir others can write":
        (tmp_path / "rd").chmod(0o777)
    if case == "key file others can change":
        (tmp_path / "key").chmod(0o666)
    r = cli(*argv, cwd=tmp_path, env=env)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert fragment in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    rd = tmp_path / "rd"
    if left == "none":
        assert not rd.exists(), sorted(rd.rglob("*"))
        assert not (tmp_path / ".spotbook").exists()
    elif left == "complete":
        run = json.loads((rd / "run.json").read_text())
        assert run["seal"]["mac"] and (rd / "input.ipynb").exists()
    elif left == "kept":  # what was there stays as it was: nothing added
        assert set(rd.rglob("*")) == before
    elif left == "file":
        assert rd.is_file() and rd.read_text() == "x"


def test_the_table_is_large_enough() -> None:
    """The issue asks for at least 80 cases (each a real command)."""
    assert len(CASES) >= 80
    assert len({c[0] for c in CASES}) == len(CASES)


def test_parameters_papermill_takes_reach_the_notebook(tmp_path: Path) -> None:
    (tmp_path / "in.ipynb").write_text(nb())
    r = cli(*RUN, "-y", "d: 2024-01-01", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "out.ipynb").read_text())
    injected = "".join(out["cells"][1]["source"])
    assert 'd = "2024-01-01"' in injected
    assert "'2024-01-01' 0.1" in "".join(out["cells"][2]["outputs"][0]["text"])


def test_a_cell_failing_in_its_display_names_the_exception(tmp_path: Path) -> None:
    doc = copy.deepcopy(BASE)
    doc["cells"][1]["source"] = (
        "class A:\n    def _repr_html_(self):\n        raise AttributeError('boom')\nA()"
    )
    (tmp_path / "in.ipynb").write_text(json.dumps(doc))
    r = cli(*RUN, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "raised AttributeError: boom" in r.stderr and "NoneType" not in r.stderr


def test_spotbook_errors_survive_pickling() -> None:
    """As nbclient's do: a multiprocessing pool of execute_notebook passes them back."""
    import pickle

    from spotbook import (
        CellExecutionError,
        CellTimeoutError,
        KernelDiedError,
        StoreIntegrityError,
        Terminated,
    )

    for err in (
        CellExecutionError(cell_index=2, execution_count=3, ename="ValueError", evalue="x"),
        KernelDiedError(cell_index=1, execution_count=None),
        CellTimeoutError(cell_index=4, timeout=1.5),
        Terminated("SIGTERM", "resume it"),
        StoreIntegrityError("gs://b/r/run.json failed"),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)
        assert back.__dict__ == err.__dict__


@pytest.mark.parametrize("argv", [["runs"], ["inspect", "in.ipynb", "--json"]], ids=" ".join)
def test_a_reader_that_stops_reading_is_no_error(tmp_path: Path, argv: list[str]) -> None:
    """`spotbook runs | head`: the pipe's reader is gone before the command writes; it
    ends quietly (exit 0), with no traceback and no 'Exception ignored' at exit."""
    (tmp_path / "in.ipynb").write_text(nb())
    read, write = os.pipe()
    os.close(read)  # the reader has gone: every write gets EPIPE
    try:
        r = subprocess.run(
            [sys.executable, "-m", "spotbook", *argv],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


def test_simulating_a_run_with_no_finished_cell_says_so(tmp_path: Path) -> None:
    (tmp_path / "in.ipynb").write_text(nb())
    assert cli(*RUN, "--prepare-only", cwd=tmp_path).returncode == 0  # frozen, never run
    r = cli("simulate", "--from", "rd", cwd=tmp_path)
    assert r.returncode == 2 and "no finished cells to measure" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_simulate_refuses_what_would_never_end(tmp_path: Path) -> None:
    """A day-long job simulates in seconds; a billion hours or a preemption every
    microsecond would run for hours or without end: refused, exit 2."""
    (tmp_path / "in.ipynb").write_text(nb())
    assert cli(*RUN, cwd=tmp_path).returncode == 0
    for flags, said in (
        (["--duration", "99999999h"], "at most a year"),
        (["--hazard", "1000000000/h"], "at most 3600 preemptions an hour"),
    ):
        r = cli("simulate", "--from", "rd", *flags, cwd=tmp_path)
        assert r.returncode == 2 and said in r.stderr, (flags, r.stderr)


def test_attempt_fields_of_the_wrong_type_are_named_not_a_traceback(tmp_path: Path) -> None:
    """status and cost read attempt records before any seal check (they show what they
    can): a field of the wrong type is refused by name, exit 2; resume refuses the seal."""
    (tmp_path / "in.ipynb").write_text(nb())
    assert cli(*RUN, cwd=tmp_path).returncode == 0
    rec_path = tmp_path / "rd" / "attempts" / "0001.json"
    rec = json.loads(rec_path.read_text())
    for field, bad in (("started", [1]), ("pid", "y"), ("outcome", 3), ("replayed", "x")):
        rec_path.write_text(json.dumps({**rec, field: bad}))
        for argv in (["status", "rd"], ["cost", "rd"], ["status", "rd", "--json"]):
            r = cli(*argv, cwd=tmp_path)
            assert r.returncode == 2, (field, argv, r.stderr)
            assert f"attempts/0001.json: field {field!r} is" in r.stderr, r.stderr
            assert "Traceback" not in r.stderr


# -- what a writer of the run store can put there ---------------------------------------
def _write(rel: str, text: str) -> Callable[[Path], None]:
    return lambda rd: (rd / rel).write_text(text)


def _field(rel: str, key: str, value: Any) -> Callable[[Path], None]:
    def change(rd: Path) -> None:
        doc = json.loads((rd / rel).read_text())
        doc[key] = value
        (rd / rel).write_text(json.dumps(doc))  # a lone surrogate is written escaped

    return change


def _special(rel: str, kind: str) -> Callable[[Path], None]:
    def change(rd: Path) -> None:
        (rd / rel).unlink()
        if kind == "fifo":
            os.mkfifo(rd / rel)
        elif kind == "dir":
            (rd / rel).mkdir()
        else:
            os.symlink("/dev/zero", rd / rel)

    return change


def _sparse(rel: str) -> Callable[[Path], None]:
    def change(rd: Path) -> None:
        with (rd / rel).open("r+b") as fh:
            fh.truncate(2 << 30)  # past the 1 GiB limit, costing no disk

    return change


DEEP = "[" * 100_000 + "]" * 100_000
# (id, change to a finished run's store, command, code, fragment)
# fmt: off
STORE_CASES: list[tuple[str, Callable[[Path], None], list[str], int, str]] = [
    ("run.json nested 100000 deep", _write("run.json", DEEP), ["status", "rd"], 2, "run.json is not valid JSON (nested too deeply)"),
    ("run.json nested, resumed", _write("run.json", DEEP), ["resume", "rd"], 2, "run.json is not valid JSON (nested too deeply)"),
    ("run.json a list", _write("run.json", "[1]"), ["resume", "rd"], 2, "holds no run (a JSON list, not an object)"),
    ("run.json a list, its cost", _write("run.json", "[1]"), ["cost", "rd"], 2, "holds no run (a JSON list, not an object)"),
    ("a lone \\ud800 in run.json", _field("run.json", "notebook", "\ud800"), ["cost", "rd"], 2, "not text"),
    ("a lone \\ud800, resumed", _field("run.json", "notebook", "\ud800"), ["resume", "rd"], 2, "not text"),
    ("run.json a FIFO", _special("run.json", "fifo"), ["status", "rd"], 2, "is a FIFO, socket or device"),
    ("run.json a FIFO, resumed", _special("run.json", "fifo"), ["resume", "rd"], 2, "is a FIFO, socket or device"),
    ("run.json a link to /dev/zero", _special("run.json", "link"), ["resume", "rd"], 2, "is a symbolic link"),
    ("run.json a directory", _special("run.json", "dir"), ["status", "rd"], 2, "cannot read run.json: Is a directory"),
    ("records past 1 GiB", _sparse("cells/a0001.jsonl"), ["status", "rd"], 2, "larger than the 1024 MiB"),
    ("records past 1 GiB, resumed", _sparse("cells/a0001.jsonl"), ["resume", "rd"], 2, "larger than the 1024 MiB"),
    ("an attempt record a list", _write("attempts/0001.json", "[]"), ["cost", "rd"], 2, "is not an attempt record (not a JSON object)"),
    ("an attempt's pid a string", _field("attempts/0001.json", "pid", "y"), ["status", "rd"], 2, "field 'pid' is"),
    ("an attempt record nested", _write("attempts/0001.json", DEEP), ["status", "rd", "--json"], 2, "attempts/0001.json"),
    ("run.json's status a number", _field("run.json", "status", 3), ["status", "rd"], 2, "run.json"),
    # fields outside the seal (issue 61): null where a value must be, a status no run has
    ("an attempt's resumed_from null", _field("attempts/0001.json", "resumed_from", None), ["status", "rd"], 2, "field 'resumed_from' is null, not int"),
    ("an attempt's resumed_from null, --json", _field("attempts/0001.json", "resumed_from", None), ["status", "rd", "--json"], 2, "field 'resumed_from' is null"),
    ("an attempt's resumed_from null, its cost", _field("attempts/0001.json", "resumed_from", None), ["cost", "rd"], 2, "field 'resumed_from' is null"),
    ("run.json's status unknown", _field("run.json", "status", "weird"), ["status", "rd"], 2, "status 'weird' is not a run status"),
]
# fmt: on


def _shape(rd: Path) -> dict[str, tuple[int, int, int]]:
    """Every object of the store by (type bits, size, mtime): what a command changed."""
    return {
        str(p.relative_to(rd)): (p.lstat().st_mode, p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in rd.rglob("*")
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("finished")
    (work / "in.ipynb").write_text(nb())
    r = cli(*RUN, "--snapshot", "every-cell", cwd=work)
    assert r.returncode == 0, r.stderr
    return work / "rd"


@pytest.mark.parametrize(
    ("change", "argv", "code", "fragment"),
    [pytest.param(*case[1:], id=case[0]) for case in STORE_CASES],
)
def test_bad_store_contents(
    change: Callable[[Path], None],
    argv: list[str],
    code: int,
    fragment: str,
    finished_run: Path,
    tmp_path: Path,
) -> None:
    """Each is refused by name with exit 2, never a traceback or a hang, and the store
    is left as it was (a refused resume claims no attempt)."""
    import shutil

    rd = tmp_path / "rd"
    shutil.copytree(finished_run, rd, symlinks=True)
    change(rd)
    before = _shape(rd)
    r = cli(*argv, cwd=tmp_path)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert fragment in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert _shape(rd) == before


def test_a_run_that_cannot_be_read_does_not_hide_the_others(tmp_path: Path) -> None:
    """`spotbook runs` names a store it cannot read (a FIFO for run.json hung it once)
    and lists the rest, exit 0."""
    (tmp_path / "in.ipynb").write_text(nb())
    for _ in range(2):
        assert cli("run", "in.ipynb", "out.ipynb", cwd=tmp_path).returncode == 0
    runs = sorted((tmp_path / ".spotbook" / "runs").iterdir())
    _special("run.json", "fifo")(runs[0])
    r = cli("runs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"cannot read {runs[0]}" in r.stderr and "is a FIFO" in r.stderr, r.stderr
    assert runs[1].name in r.stdout and runs[0].name not in r.stdout


def test_a_key_file_that_is_no_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    """The user's key as a FIFO hung `spotbook run`; the key file's variable naming a
    directory was a traceback (issue 61). Both are refused by name (exit 2), no store."""
    (tmp_path / "in.ipynb").write_text(nb())
    config = tmp_path / "config"
    config.mkdir()
    os.mkfifo(config / "key")
    r = cli(*RUN, cwd=tmp_path, env={"SPOTBOOK_CONFIG_DIR": str(config)}, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "is not a plain file" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "keydir").mkdir()
    r = cli(*RUN, cwd=tmp_path, env={"SPOTBOOK_SNAPSHOT_KEY_FILE": str(tmp_path / "keydir")})
    assert r.returncode == 2, r.stderr
    assert "is not a plain file (a directory" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "rd").exists()


def test_a_replaced_cut_output_is_refused_by_resume(tmp_path: Path) -> None:
    """A cell's output past --max-output-bytes is kept whole in outputs/, its hash in the
    sealed record; one replaced there was taken up by resume without a look (issue 61)."""
    doc = json.loads(nb())
    doc["cells"][1]["source"] = "print('x' * 5000)"
    doc["cells"].append({**doc["cells"][1], "id": "z", "source": "raise SystemExit(3)"})
    (tmp_path / "in.ipynb").write_text(json.dumps(doc))
    r = cli(*RUN, "--max-output-bytes", "100", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    spilled = tmp_path / "rd" / "outputs" / "00001-a0001.txt"
    spilled.write_text("y" * 5000)
    r = cli("resume", "rd", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert spilled.name in r.stderr and "Traceback" not in r.stderr
