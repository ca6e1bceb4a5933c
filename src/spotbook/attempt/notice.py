"""The termination notice: SIGTERM/SIGINT, visible to the kernel through a file, and the
exit watchdog that bounds the time from the notice to the process's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _early
from .._models import NoticeCell

log = logging.getLogger(__name__)


class Notice:
    """The termination notice of one attempt."""

    def __init__(self, path: str) -> None:
        self.path = path
        # the kernel creates this when spotbook.preempted() first returns True
        self.seen_path = path + ".seen"
        self.event = asyncio.Event()
        # one future for the whole attempt: racing each cell against it costs nothing
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.signame = ""
        self.at = 0.0
        # what the work running at the notice did
        self.cell = NoticeCell.NONE
        self._previous: dict[signal.Signals, Any] = {}  # the handlers before ours
        self._signalled = False
        self._watchdog: threading.Thread | None = None
        self._armed = threading.Event()
        self._closed = threading.Event()
        self._overrun: tuple[float, Callable[[], None]] | None = None

    @property
    def given(self) -> bool:
        return self.event.is_set()

    def seen_by_cell(self) -> bool:
        """Whether the running cell saw ``spotbook.preempted()`` return True."""
        return os.path.exists(self.seen_path)

    def fire(self, signame: str) -> bool:
        """Record the notice; True the first time."""
        if self.event.is_set():
            return False
        self.signame = signame
        self.at = time.monotonic()
        log.info("received %s: finishing the current cell, then saving progress", signame)
        with contextlib.suppress(OSError), open(self.path, "w") as fh:
            fh.write(signame)
        self.event.set()
        self.future.set_result(None)
        return True

    def install(
        self, on_signal: Callable[[str], None], at_once: Callable[[str], None] | None = None
    ) -> None:
        """SIGTERM and SIGINT call ``on_signal`` with the signal's name from the event loop,
        and ``at_once`` (the first time) from the signal handler itself: the loop may be
        stuck in a store request that never returns, and what bounds the time to exit must
        not wait for it. Main thread only: elsewhere the caller's own handlers stay."""
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()

        def handler(signum: int, frame: object) -> None:
            name = signal.Signals(signum).name
            if at_once is not None and not self._signalled:
                self._signalled = True
                at_once(name)
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(on_signal, name)

        if at_once is not None:
            self._start_watchdog()  # never started from a signal handler
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, handler)
        while _early.EARLY:  # a signal that came before these handlers: the notice at once
            handler(_early.EARLY.pop(0), None)

    def arm_watchdog(self, seconds: float, on_overrun: Callable[[], None]) -> None:
        """Call ``on_overrun`` from a thread if the attempt is still here ``seconds``
        after now (the event loop may be stuck in a request that never returns). Safe in
        a signal handler: the thread was started beforehand, and this only wakes it."""
        self._start_watchdog()
        self._overrun = (time.monotonic() + seconds, on_overrun)
        self._armed.set()

    def _start_watchdog(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="exit-watchdog")
            self._watchdog.daemon = True
            self._watchdog.start()

    def _watch(self) -> None:
        self._armed.wait()
        if self._overrun is None:  # closed without a notice
            return
        at, on_overrun = self._overrun
        if not self._closed.wait(max(0.0, at - time.monotonic())):
            on_overrun()

    def close(self) -> None:
        for sig, previous in self._previous.items():  # None: not set from Python
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()
        self._closed.set()
        self._armed.set()
        for path in (self.path, self.seen_path):
            with contextlib.suppress(OSError):
                os.unlink(path)
