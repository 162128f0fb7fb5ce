"""The slots a slot pump holds: its SlotLease in the model's budget and how many of them its runners hold,
must give back (the budget shrank) or are giving back. The pump decides when to take, grow and give back;
this keeps the lease and the counts in step, one change of the lease at a time (each is fenced on the last).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..ledger import give_back_slots, grow_slots, take_slots
from ..runtime import Services
from ..storage.dynamo import ConditionFailed, Throttled

log = logging.getLogger(__name__)


class HeldSlots:
    """A pump's SlotLease (None until it takes or adopts one) and its counts of slots."""

    def __init__(self, svc: Services, model_id: str) -> None:
        self.svc, self.model_id = svc, model_id
        self.lease: dict | None = None
        self.slots = 0  # runners (and slots) still held
        self.release = 0  # runners that must stop and give their slot back (the budget shrank)
        self.releasing = 0  # slots on their way back (the give-back not yet written)
        self.lock = asyncio.Lock()  # one change of the lease at a time: each is fenced on the last

    @property
    def open(self) -> int:
        """Slots whose runners may go on starting calls: those held, less those told to go back."""
        return self.slots - self.release

    @property
    def kept(self) -> int:
        """Slots held and not on their way back."""
        return self.slots - self.releasing

    def idle(self, busy: int) -> int:
        """Slots whose runners could start a call now, with `busy` calls in flight."""
        return self.slots - self.release - self.releasing - busy

    def adopt(self, lease: dict, slots: int) -> None:
        """A lease made of the slots a dispatched group's members hold."""
        self.lease, self.slots = lease, slots

    async def take(self, parts: list[tuple[int, int]]) -> bool:
        """A new lease of these shards' slots ((shard, how many)); False when another claimant took them
        first."""
        try:
            self.lease = await asyncio.to_thread(take_slots, self.svc, self.model_id, parts)
        except (ConditionFailed, Throttled):
            return False
        self.slots = sum(n for _, n in parts)
        return True

    async def grow(self, parts: list[tuple[int, int]],
                   write: Callable[..., Awaitable[dict]]) -> int:
        """Holding `lock`: add these shards' slots to the lease (`write` runs the fenced write); how many were
        added: none when others took them meanwhile or the lease was recovered (the next poll looks again)."""
        n = sum(m for _, m in parts)
        if n <= 0 or self.lease is None:
            return 0
        try:
            self.lease = await write(grow_slots, self.svc, self.lease, parts)
        except (ConditionFailed, Throttled):
            return 0
        self.slots += n
        return n

    async def give_back(self, n: int) -> None:
        async with self.lock:
            if n <= 0 or self.lease is None:
                return
            try:
                self.lease = await asyncio.to_thread(give_back_slots, self.svc, self.lease, n)
            except ConditionFailed:  # the sweeper recovered the lease (its slots went back then)
                self.lease = None
            except Throttled:
                log.warning("could not give %d slots back now; the lease's recovery will", n)

    async def release_one(self) -> None:
        """A runner told to stop gives its slot back. Counted as on its way back until the budget says so,
        lest the pump's poll see the budget still over its cap and stop one runner more."""
        self.release -= 1
        self.releasing += 1
        await self.give_back(1)
        self.releasing -= 1
        self.slots -= 1
