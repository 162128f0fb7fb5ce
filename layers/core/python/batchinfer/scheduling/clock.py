"""The clock the pump reads: time passing, and waits on events bounded by it.

Production reads the machine's (`REAL_CLOCK`); a test hands in one it moves, so what a pump does at a
moment never depends on how fast the machine gets there.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines, how long a call took)."""
        ...

    def time(self) -> float:
        """Wall-clock seconds (compared with batches' creation times)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Let `seconds` pass."""
        ...

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        """Wait for `event` at most `seconds`: whether it was set."""
        ...


class RealClock:
    """The machine's clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except TimeoutError:
            return False
        return True


REAL_CLOCK = RealClock()
