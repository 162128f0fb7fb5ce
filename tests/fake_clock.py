"""A clock a test moves by hand, for code that takes its clock as an argument (`scheduling.clock.Clock`)."""

from __future__ import annotations

import asyncio
import time


class FakeClock:
    """The pump's clock (`scheduling.clock.Clock`), moved only by `advance`: waits bounded by it end when the
    test moves it past their bound, or when their event is set."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.start = self.now = start
        self.wall_offset = time.time() - start  # its wall clock reads as the real one did when it started
        self._moved = asyncio.Event()

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + self.wall_offset

    async def sleep(self, seconds: float) -> None:
        await self.wait(asyncio.Event(), seconds)

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        until = self.now + seconds
        while not event.is_set() and self.now < until:
            moved = self._moved
            waits = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(moved.wait())}
            _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
        return event.is_set()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()
