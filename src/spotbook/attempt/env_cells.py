"""Cells that change the Python environment, and how to tell whether their effect is
still there. Pure.

A preemption gives the next attempt the image's environment as built: what a cell
installed (``%pip install``, ``!pip install``, ``%conda install``, ``!apt-get install``,
``!git clone``) is gone on a new node. Such cells are found here by their source; the
restorer replays them first, outputs suppressed, where their effect is missing — before
anything is unpickled, since the state may need the modules they installed. Tags decide
as elsewhere: ``spotbook-no-replay`` never replays a cell, ``spotbook-replay`` always does
(the planner's head).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from .replay import NO_REPLAY_TAG

_PIP = re.compile(
    r"^\s*(?:%pip|!\s*(?:\S*/)?pip3?|!\s*\S*python3?(?:\.\d+)?\s+-m\s+pip"
    r"|!\s*\{sys\.executable\}\s+-m\s+pip)\s+install\b(?P<args>.*)$"
)
_OTHER = re.compile(
    r"^\s*(?:%(?:conda|mamba)\s+install|!\s*(?:sudo\s+)?(?:conda|mamba|micromamba)\s+install"
    r"|!\s*(?:sudo\s+)?apt(?:-get)?\s+install|!\s*git\s+clone)\b"
)
_SCRIPT = re.compile(r"^\s*%%(?:bash|sh|script\s+\S+)\s*$")
_SCRIPT_LINE = re.compile(
    r"^\s*(?:(?:\S*/)?pip3?\s+install|\S*python3?\s+-m\s+pip\s+install|(?:sudo\s+)?apt(?:-get)?"
    r"\s+install|(?:sudo\s+)?(?:conda|mamba)\s+install|git\s+clone)\b"
)
# pip install options that take a value (the value is no requirement)
_PIP_VALUED = frozenset(
    {"-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url"}
    | {"--extra-index-url", "-f", "--find-links", "-t", "--target", "--prefix", "--root"}
    | {"--upgrade-strategy", "--platform", "--python-version", "--implementation", "--abi"}
    | {"--src", "--cache-dir", "--log", "--proxy", "--retries", "--timeout", "--trusted-host"}
    | {"--progress-bar", "--report", "--config-settings", "-C", "--global-option"}
)
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class EnvCell:
    """A cell that changes the environment. ``packages``: the distributions it pip-installs
    (their effect can be checked); ``checkable``: every install in it is such a name."""

    index: int
    packages: tuple[str, ...]
    checkable: bool


def _pip_names(args: str) -> tuple[list[str], bool]:
    try:
        tokens = shlex.split(args, comments=True)
    except ValueError:
        return [], False
    names: list[str] = []
    checkable = True
    skip_next = False
    for tok in tokens:
        if skip_next:
            skip_next = False
            if tok and not tok.startswith("-"):
                continue
        if tok.startswith("-"):
            opt = tok.split("=", 1)[0]
            if opt in ("-r", "--requirement", "-e", "--editable"):
                checkable = False  # what it installs is in a file or a folder
            if opt in _PIP_VALUED and "=" not in tok:
                skip_next = True
            continue
        if "{" in tok or "$" in tok:
            checkable = False  # a value filled in from Python or the shell
            continue
        base = tok.rsplit("/", 1)[-1]
        if base.endswith(".whl"):
            names.append(base.split("-", 1)[0])
            continue
        if "/" in tok or tok.startswith(".") or "://" in tok or base.endswith((".tar.gz", ".zip")):
            checkable = False  # a folder, an archive or a URL: no name to look up
            continue
        m = _NAME.match(tok)
        if m:
            names.append(m.group(1))
        else:
            checkable = False
    return names, checkable and bool(names)


def env_cell(index: int, source: str) -> EnvCell | None:
    """The cell as an environment cell, or None when it changes no environment."""
    lines = source.splitlines()
    script = bool(lines) and bool(_SCRIPT.match(lines[0]))
    packages: list[str] = []
    checkable = True
    found = False
    for line in lines[1:] if script else lines:
        m = _PIP.match(line) if not script else None
        if m is not None:
            names, ok = _pip_names(m.group("args"))
            packages += names
            checkable = checkable and ok
            found = True
        elif (_SCRIPT_LINE if script else _OTHER).match(line):
            found = True
            checkable = False
    if not found:
        return None
    return EnvCell(index, tuple(dict.fromkeys(packages)), checkable)


def env_cells(sources: Sequence[str], tags: Sequence[Sequence[str]], upto: int) -> list[EnvCell]:
    """The environment cells up to and including cell ``upto``, in order (not those
    tagged spotbook-no-replay)."""
    found = []
    for i, source in enumerate(sources[: upto + 1]):
        if NO_REPLAY_TAG in (tags[i] if i < len(tags) else ()):
            continue
        cell = env_cell(i, source)
        if cell is not None:
            found.append(cell)
    return found
