"""The README's commands work as written, so the README cannot drift from the program.

The "Use" block is walked line by line: every `spotbook` command in it runs, with each
`[optional part]` left out and then put in, each `a | b` as two commands, against a
bucket named `bucket` on the GCS emulator (as `gs://bucket/runs/r1` is written) and the
README's own `examples/train.ipynb` as `train.ipynb`. A line this test does not know
fails it: a new command in the README needs a step here. The Quick start's two commands
are checked to be what CI runs (they set up a virtual environment from the package
registry, minutes on a fresh machine, so the suite does not run them itself; CI's
`.ci/run` is the second one).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from spotbook.store.runstore import RunStore

from .conftest import cli, kill, start_cli, wait_for
from .servers import Storage

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

pytestmark = pytest.mark.slow


def _block_after(heading: str) -> list[str]:
    """The lines of the first fenced block after ``heading``."""
    text = README.split(f"\n{heading}\n", 1)[1]
    block = text.split("```\n", 2)[1]
    return [line for line in block.splitlines() if line.strip()]


def _variants(line: str) -> list[list[str]]:
    """One README line as the commands it stands for: comment dropped, `a | b` split,
    each `[...]` left out and then put in (placeholders: `S` after --status)."""
    line = line.split("  #", 1)[0].strip()
    out = []
    for part in line.split(" | "):
        words = part.split()
        if words[0] != "spotbook":
            words = ["spotbook", *words]
        text = " ".join(words)
        short = re.sub(r"\s*\[[^\]]*\]", "", text)
        full = text.replace("[", "").replace("]", "")
        for form in dict.fromkeys([short, full]):
            argv = form.split()[1:]
            argv = [
                "succeeded" if i and argv[i - 1] == "--status" and a == "S" else a
                for i, a in enumerate(argv)
            ]
            out.append(argv)
    return out


def test_the_quick_start_is_two_commands_and_ci_runs_the_second() -> None:
    lines = _block_after("## Quick start")
    commands = [line.split("#", 1)[0].strip() for line in lines]
    assert commands == ["bash scripts/demo.sh", "bash scripts/check.sh"], commands
    assert "exec bash scripts/check.sh" in (ROOT / ".ci" / "run").read_text()
    # after the demo, the README says how to get spotbook on PATH
    assert ". .venv/bin/activate" in README.split("## Use", 1)[0]


def test_the_use_block_runs_as_written(
    tmp_path: Path, storages: dict[str, Storage], state_env: dict[str, str]
) -> None:
    lines = _block_after("## Use")
    gs = storages["gs"]
    env = {**gs.direct_env, **state_env}
    saved = dict(os.environ)
    os.environ.update(gs.direct_env)
    try:
        import fsspec

        fs = fsspec.filesystem("gs", skip_instance_cache=True)
        if not fs.exists("bucket"):
            fs.mkdir("bucket")
        elif fs.exists("bucket/runs"):  # an earlier walk's run
            fs.rm("bucket/runs", recursive=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    shutil.copy(ROOT / "examples" / "train.ipynb", tmp_path / "train.ipynb")

    done: set[str] = set()

    def step(prefix: str) -> list[list[str]]:
        (line,) = [ln for ln in lines if ln.startswith(prefix)]
        done.add(line)
        return _variants(line)

    def ok(argv: list[str]) -> str:
        r = cli(*argv, cwd=tmp_path, env=env)
        assert r.returncode == 0, (argv, r.stderr)
        return r.stdout

    for argv in step("spotbook run train.ipynb out.ipynb"):
        ok(argv)
    assert "final loss" in (tmp_path / "out.ipynb").read_text()

    (argv,) = step("spotbook run train.ipynb --run-dir gs://bucket/runs/r1")
    proc = start_cli(*argv, cwd=tmp_path, env=env)
    try:
        os.environ.update(gs.direct_env)
        try:
            store = RunStore("gs://bucket/runs/r1")
            # the data step done; three one-second stages still to run
            wait_for(lambda: len(store.cell_records()) >= 3, timeout=120, what="3 cells")
        finally:
            os.environ.clear()
            os.environ.update(saved)
        (kill_line,) = [ln for ln in lines if ln.startswith("kill -9 <pid>")]
        done.add(kill_line)
        code, _ = kill(proc)  # `kill -9 <pid>`: the node is gone
        assert code == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            kill(proc)
    (logs_f,) = step("spotbook logs -f r1")
    logged = ok(logs_f)  # what was saved, and it ends: the runner is gone
    assert logged.startswith("Executing Cell ") and logged.count("Ending Cell") >= 3, logged

    for argv in step("spotbook resume gs://bucket/runs/r1"):
        ok(argv)
    for argv in step("spotbook status r1"):  # a run's name, from the index
        out = ok(argv)
        assert "succeeded" in out, out
    run_id = json.loads(ok(["status", "r1", "--json"]))["run_id"]
    for argv in step("spotbook runs ["):
        assert run_id in ok(argv), argv
    (cancel,) = step("spotbook cancel r1")
    r = cli(*cancel, cwd=tmp_path, env=env)  # it has finished: nothing to stop
    assert r.returncode == 2 and "is not running" in r.stderr, r.stderr
    for argv in step("spotbook runs rm r1"):
        ok(argv)
    assert run_id not in ok(["runs", "--json"])

    unknown = [ln for ln in lines if ln not in done]
    assert not unknown, f"the README shows commands this test does not run: {unknown}"
