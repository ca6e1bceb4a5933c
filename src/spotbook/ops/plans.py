"""Run a cloud plan's steps (``spotbook gke up``, ``gke down``): each step's check first,
so a plan run again after a failure skips what is done."""

from __future__ import annotations

import logging
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._errors import CommandFailedError, UsageError
from ..kube.plans import Step, shell_join

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanRun:
    """What running a plan did: the steps run, and those its checks found done."""

    total: int
    ran: tuple[int, ...]
    skipped: tuple[int, ...]


def steps_from(steps: Sequence[Step], start: int) -> list[tuple[int, Step]]:
    """The steps from number ``start`` (1-based) on, numbered; a UsageError past the end."""
    todo = list(enumerate(steps, 1))[start - 1 :]
    if start < 1 or not todo:
        raise UsageError(f"--from {start}: the plan has {len(steps)} steps")
    return todo


def run_plan(
    steps: Sequence[Step],
    *,
    start: int = 1,
    again: Callable[[int], str] | None = None,
    say: Callable[[str], None] | None = None,
) -> PlanRun:
    """Run ``steps`` from number ``start`` on, in order, stopping at the first that fails
    (a CommandFailedError naming it, and ``again(n)``: the command that continues from
    there). A step whose ``done_if`` check passes is skipped."""
    tell = say or log.info
    ran: list[int] = []
    skipped: list[int] = []
    for n, step in steps_from(steps, start):
        tell(f"step {n}/{len(steps)}: {step.what}")
        if step.done_if and _succeeds(step.done_if):
            tell(f"step {n}: already done (`{shlex.join(step.done_if)}` found it); skipped")
            skipped.append(n)
            continue
        # a "$(...)" argument is a lookup the shell does, as in the printed plan
        lookup = any("$(" in a for a in step.argv)
        argv = ["bash", "-c", shell_join(step.argv)] if lookup else list(step.argv)
        try:
            code = subprocess.run(argv, input=step.stdin, text=True, check=False).returncode
        except FileNotFoundError:
            code = 127
        if code != 0:
            raise CommandFailedError(
                f"step {n} failed (exit {code}): {shlex.join(step.argv)}; fix the cause and "
                + (f"continue with `{again(n)}`" if again else f"run the plan again from step {n}")
                + (f" (steps 1-{n - 1} are done)" if n > 1 else "")
            )
        ran.append(n)
    tell(f"all {len(steps)} steps done")
    return PlanRun(total=len(steps), ran=tuple(ran), skipped=tuple(skipped))


def _succeeds(argv: Sequence[str]) -> bool:
    """Whether a read-only check command exits 0 (its output is not shown)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, check=False, timeout=120)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
