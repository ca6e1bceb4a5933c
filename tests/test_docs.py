"""The commands in docs/kubernetes.md work: every `spotbook ... plan` runs as written, and
every `spotbook submit` produces a schema-valid Job when run with --dry-run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import utils as kv

from .conftest import cli

PAGE = Path(__file__).parent.parent / "docs" / "kubernetes.md"


def _commands(prefix: str) -> list[list[str]]:
    text = PAGE.read_text()
    out = []
    for block in re.findall(r"```\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("#", 1)[0].split(" > ", 1)[0].strip()  # no redirection
            if line.startswith(prefix):
                out.append(shlex.split(line))
    return out


PLANS = _commands("spotbook ")
SUBMITS = [c for c in PLANS if c[1] == "submit" or (c[1] == "sweep" and "--submit" in c)]
SETUPS = [c for c in PLANS if len(c) > 2 and c[2] == "plan"]


def test_the_page_has_commands_to_check() -> None:
    assert len(SUBMITS) >= 4 and {c[1] for c in SETUPS} == {"gke", "eks", "aks"}
    assert any(c[1] == "sweep" for c in SUBMITS)
    assert any("--recover" in c or c[1] == "recover" for c in PLANS)


@pytest.mark.parametrize("argv", SETUPS, ids=lambda a: a[1])
def test_plan_commands_run_as_written(argv: list[str], tmp_path: Path) -> None:
    r = cli(*argv[1:], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n# ") >= 2


@pytest.mark.parametrize("argv", SUBMITS, ids=lambda a: " ".join(a[3:6]))
def test_submit_commands_give_valid_jobs(argv: list[str], work: Path) -> None:
    args = [a for a in argv[1:] if a not in ("--wait", "--dry-run")]
    assert args[1] == "train.ipynb"
    args[1] = "params.ipynb"  # a test notebook in place of the page's
    r = cli(*args, "--dry-run", cwd=work)
    assert r.returncode == 0, (args, r.stderr)
    kv.validate(yaml.safe_load(r.stdout), kv.latest_version(), strict=True)
