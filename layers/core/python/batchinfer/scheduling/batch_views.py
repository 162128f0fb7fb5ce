"""The batches of a slot pump's queued work as its members go by them: one dict a batch, which its claims make
current and which looks between claims keep current (a stop, a deletion, a pause, a resume), with when each was
last looked at, so that no queued request starts on a view of its batch older than `stale_stop_seconds`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from concurrent.futures import Executor

from ..records import Batch
from ..runtime import Services
from .clock import Clock
from .config import SchedulerConfig
from .threads import on_pool


class BatchViews:
    """A pump's views of the batches of its queued work, and when each was last looked at."""

    def __init__(self, svc: Services, clock: Clock, config: Callable[[], SchedulerConfig]) -> None:
        self.svc, self.clock, self.config = svc, clock, config
        self.shared: dict[str, dict] = {}  # batch id -> the one dict its queued work here goes by
        self.looked_at: dict[str, float] = {}  # batch id -> when the last look at it (or the claim's read) began
        self.locks: dict[str, asyncio.Lock] = {}  # one look at a batch at a time for the runners

    def claimed(self, batch_id: str, read: dict | None, began: float) -> dict:
        """The view of a batch, made current with the batch as a claim begun at `began` has just read it
        (`read`): a copy kept from before a pause or a resume must not decide the new work's fate."""
        shared = self.shared.setdefault(batch_id, {})
        if read is not None:
            shared.clear()
            shared.update(read)
            self._looked(batch_id, began)
        return shared

    def refresh(self, batch_ids: set[str]) -> None:
        """Look again at those of `batch_ids` not looked at for `stop_look_seconds` (on the claim's thread,
        between claims: so that a start seldom waits for a look of its own)."""
        now = self.clock.monotonic()
        for batch_id in batch_ids:
            if now - self.looked_at.get(batch_id, -math.inf) >= self.config().stop_look_seconds:
                self.look(batch_id)

    def look(self, batch_id: str) -> None:
        """Read the batch (strongly consistent) into its view."""
        began = self.clock.monotonic()
        current = Batch.get(self.svc.table, batch_id) or {"deleting": True}
        shared = self.shared[batch_id]
        if current.get("stop") or current.get("deleting"):
            shared["stop"] = current.get("stop") or "deleting"
        if current.get("paused_at"):
            shared["paused_at"] = current["paused_at"]
        else:
            shared.pop("paused_at", None)
        self._looked(batch_id, began)

    def seen_lately(self, batch_id: str) -> bool:
        """Whether a look at the batch began at most `stale_stop_seconds` ago."""
        return self.clock.monotonic() - self.looked_at.get(batch_id, -math.inf) <= self.config().stale_stop_seconds

    async def look_unless_seen_lately(self, batch_id: str, pool: Executor) -> None:
        """A look at the batch on `pool` unless one began lately: runners that ask at once share one."""
        if self.seen_lately(batch_id):
            return
        async with self.locks.setdefault(batch_id, asyncio.Lock()):
            if not self.seen_lately(batch_id):
                await on_pool(pool, self.look, batch_id)

    def _looked(self, batch_id: str, began: float) -> None:
        self.looked_at[batch_id] = max(self.looked_at.get(batch_id, -math.inf), began)
