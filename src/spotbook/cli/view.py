"""spotbook report / ui: a run as an HTML page, and the local dashboard."""

from __future__ import annotations

import argparse
import os
import sys

from .._errors import UsageError
from ..store.backends import atomic_write


def _needs(what: str, module: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{what} needs {module}: pip install '.[ui]' in the spotbook folder")


def _cmd_report(args: argparse.Namespace) -> int:
    _needs("spotbook report", "nbconvert")
    from ..view.report import render_report

    html = render_report(
        args.run, prices=args.prices, context=args.context, namespace=args.namespace
    )
    if args.output == "-":
        sys.stdout.write(html)
        return 0
    try:  # whole, under a name no one can foresee, never through a link
        atomic_write(os.path.abspath(args.output), html.encode("utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from exc
    print(f"spotbook: report of {args.run} in {args.output}", file=sys.stderr)
    return 0


def _cmd_ui(args: argparse.Namespace) -> int:
    _needs("spotbook ui", "flask")
    _needs("spotbook ui", "nbconvert")
    from ..view.dashboard import Sources, serve

    if args.refresh <= 0:
        raise UsageError("--refresh must be a number of seconds above 0")
    served = serve(
        Sources(
            stores=list(args.store or []),
            local=not args.no_local,
            cluster=args.cluster,
            context=args.context,
            namespace=args.namespace,
            all_namespaces=args.all_namespaces,
        ),
        host=args.host,
        port=args.port,
        token=args.token or os.environ.get("SPOTBOOK_UI_TOKEN") or None,
        allow_remote=args.allow_remote,
        refresh=args.refresh,
    )
    print(f"spotbook: dashboard at {served.url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        served.server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        served.server.server_close()
    return 0
