"""The checkpoint directory of a run in an object store, kept in sync during an attempt:
every ``--checkpoint-interval``, at once on a notice (while the cell uses its grace),
and once more when the attempt ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from .._errors import StorageError, SupersededError
from ..store.checkpoints import CheckpointDir
from .journal import Journal

log = logging.getLogger(__name__)


class FilesSync:
    """Uploads of one attempt's checkpoint directory, and what they cost."""

    def __init__(self, files: CheckpointDir, journal: Journal, interval: float) -> None:
        self.files = files
        self.journal = journal
        self.interval = interval
        self._periodic: asyncio.Future[None] | None = None
        self._early: asyncio.Future[None] | None = None

    async def restore(self, manifest: dict[str, Any] | None) -> int:
        """Fill the local directory from the newest manifest; bytes fetched."""
        return await asyncio.to_thread(self.files.restore, manifest)

    def start(self) -> None:
        self._periodic = asyncio.ensure_future(self._periodically())

    def on_notice(self) -> None:
        """Upload now, while the cell uses its grace: the sync after the cell then only
        sends what the cell saved since."""
        self._early = asyncio.ensure_future(self._quietly())

    def cancel(self) -> None:
        if self._periodic is not None:
            self._periodic.cancel()

    async def final(self) -> None:
        if self._periodic is not None:
            self._periodic.cancel()
            with contextlib.suppress(BaseException):
                await self._periodic
        if self._early is not None:
            await self._early
        try:
            await self._sync()
        except (SupersededError, StorageError) as exc:
            log.error("could not save the checkpoint directory: %s", exc)

    async def now(self) -> None:
        """Upload what changed, now (a cell wrote into the directory): its record commits
        after this, so a kill never leaves a committed cell without its files."""
        await self._sync()

    async def _sync(self) -> None:
        self.journal.fence()
        result = await asyncio.to_thread(self.files.sync)
        rec = self.journal.attempt_rec
        rec["checkpoint_syncs"] = rec.get("checkpoint_syncs", 0) + 1
        rec["checkpoint_uploaded_bytes"] = self.files.uploaded_bytes
        rec["checkpoint_files"] = result.files
        rec["checkpoint_last_sync_seconds"] = round(result.seconds, 3)

    async def _periodically(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self._quietly()

    async def _quietly(self) -> None:
        try:
            await self._sync()
        except SupersededError:
            pass  # the next commit stops the attempt
        except StorageError as exc:
            log.warning("checkpoint directory sync failed (%s); trying again later", exc)
