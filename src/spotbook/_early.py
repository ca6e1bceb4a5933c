"""The first instants of a ``spotbook`` command that runs an attempt: SIGTERM and SIGINT
are recorded from spotbook's first statement on (the package's ``__init__``, before
anything else is imported) until the attempt installs its own handlers, which take a
recorded one as the notice at once: the run stops with exit 75, its store either absent
(the same command starts it) or complete and resumable. Only the standard library.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

# commands that run an attempt (a run's notebook in a kernel)
ATTEMPTS = ("run", "resume", "worker")
# the signals that came before the attempt's handlers, in order
EARLY: list[int] = []


def catch() -> None:
    """Record SIGTERM and SIGINT from now on (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: EARLY.append(signum))


def catch_if_command() -> None:
    """:func:`catch` when this process is the ``spotbook`` command running an attempt
    (``python -m spotbook run ...``: ``sys.argv[0]`` is ``-m`` while the package is
    imported; or the installed ``spotbook`` script), never in a library user's process."""
    argv = sys.argv
    if len(argv) < 2 or argv[1] not in ATTEMPTS:
        return
    if argv[0] == "-m" or os.path.basename(argv[0]) == "spotbook":
        catch()
