"""What a pump knows of its model's budget: the last read of it, how fresh that is, and since when the
model has been over its cap.

The budget is read on a thread of its own (never behind a claim or a write): a slow claim must not hold
back the read that stops runners when interactive load arrives.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from ..catalog import Model
from ..runtime import Services
from . import policy
from .capacity import InteractiveMemory, effective_budget
from .clock import Clock
from .config import SchedulerConfig
from .threads import on_pool


class BudgetWatch:
    """The budget as last read, when that read was sent, and the over-cap state the pump's runners obey."""

    def __init__(self, svc: Services, model: Model, config: SchedulerConfig, clock: Clock) -> None:
        self.svc, self.model, self.clock = svc, model, clock
        self.item: dict | None = None  # as the last read found it
        self.read_at = clock.monotonic()  # when the read behind `item` was sent
        # The watch's own (the dispatcher's is read in the claim thread).
        self.interactive = InteractiveMemory(config.interactive_window_seconds, clock)
        self.over_since: float | None = None  # when the last reads began to find the model over its cap
        self.over_share = 0.0  # this lease's part of what was in flight then: it keeps that part of the cap
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="pump-poll")
        self.stop = asyncio.Event()

    async def on_thread(self, fn, *args):  # noqa: ANN001, ANN201 - a thin wrapper of run_in_executor
        """`fn` on the watch's own thread."""
        return await on_pool(self.pool, fn, *args)

    def seen(self, item: dict | None, read_at: float) -> None:
        self.item, self.read_at = item, read_at

    def cap(self, item: dict | None, yield_per_request: float) -> int:
        """What the model may run now by `item`, with the interactive load the watch remembers."""
        return effective_budget(self.model, item, yield_per_request, self.interactive.level(self.model.id, item))

    def stale(self, stale_cap_seconds: float) -> bool:
        """The last read is too old to start a call on."""
        return self.clock.monotonic() - self.read_at > stale_cap_seconds

    def over(self, in_flight: int, cap: int, mine: int) -> bool:
        """Note whether the model is over its cap; True when it has just come back within it."""
        if in_flight > cap and self.over_since is None:
            self.over_since = self.clock.monotonic()
            self.over_share = mine / in_flight
        elif in_flight <= cap and self.over_since is not None:
            self.over_since = None
            return True
        return False

    def holding(self, backend_timeout_seconds: float) -> bool:
        """Over the cap: the slots kept start nothing new (`policy.holding`)."""
        return policy.holding(self.over_since, self.clock.monotonic(), backend_timeout_seconds)

    def noted_call_seconds(self, latency_fresh_seconds: float) -> float | None:
        """The call time on the budget as the last read found it, if fresh enough to count."""
        item = self.item or {}
        if item.get("call_seconds") is None:
            return None
        age = self.svc.now() - int(item.get("call_seconds_at", 0))
        return float(item["call_seconds"]) if age <= latency_fresh_seconds else None
