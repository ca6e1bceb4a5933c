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
        self._installed: list[signal.Signals] = []
        self._watchdog: threading.Timer | None = None

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

    def install(self, on_signal: Callable[[str], None]) -> None:
        """SIGTERM and SIGINT call ``on_signal`` with the signal's name (main thread
        only: elsewhere the caller's own handlers stay)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, on_signal, signal.Signals(sig).name)
                self._installed.append(sig)
            except (RuntimeError, ValueError):  # not the main thread
                break

    def arm_watchdog(self, seconds: float, on_overrun: Callable[[], None]) -> None:
        """Call ``on_overrun`` from a thread if the attempt is still here ``seconds``
        after now (the event loop may be stuck in a request that never returns)."""
        self._watchdog = threading.Timer(seconds, on_overrun)
        self._watchdog.daemon = True
        self._watchdog.start()

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._installed:
            loop.remove_signal_handler(sig)
        if self._watchdog is not None:
            self._watchdog.cancel()
        for path in (self.path, self.seen_path):
            with contextlib.suppress(OSError):
                os.unlink(path)
