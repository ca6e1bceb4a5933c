"""spotbook drill: preempt a run on purpose and follow its recovery (``ops.drill``)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from ..ops.drill import drill
from .run import runner_options, say_result
from .status import _print_downtime


def _say(line: str) -> None:
    print(f"spotbook: {line}", file=sys.stderr, flush=True)


def _cmd_drill(args: argparse.Namespace) -> int:
    report = drill(
        args.run,
        how=args.how,
        yes=args.yes,
        resume=not args.no_resume,
        timeout=args.timeout,
        context=args.context,
        namespace=args.namespace,
        options=runner_options(args),
        say=_say,
    )
    if report.command:
        print(shlex.join(report.command))
    if not report.disrupted:
        _say("printed the command above; run it (or pass --yes) to cause the event")
        return 0
    if report.resumed is not None:
        say_result(report.resumed)
    if report.event is not None:
        _print_downtime(
            {"preemptions": [report.event], "totals": {"preemptions": 0, "gpu_seconds": 0}}
        )
        print(json.dumps({"drill": report.event}, indent=2))
    return 0
