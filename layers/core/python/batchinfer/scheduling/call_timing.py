"""How long a pump's claims and calls take, and its calls in flight: when each started and for which batch.

The pump's claims are timed by these figures (claim just in time for the calls about to answer); the
budget's call time, which estimates of a batch's end read, is noted from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from . import policy
from .claimed_work import Member
from .clock import Clock
from .config import SchedulerConfig


class CallTiming:
    """Moving averages of a claim's and a call's seconds (the first answer replaces the first guess), the
    calls in flight, and the answers not yet noted on the budget."""

    def __init__(self, config: Callable[[], SchedulerConfig], clock: Clock) -> None:
        self._config, self.clock = config, clock
        first = config()
        self.claim_seconds = first.first_claim_seconds
        self.call_seconds = first.first_call_seconds
        self.answered = False  # a call has answered: `call_seconds` is measured, not the first guess
        self.calls_started: dict[int, float] = {}  # per call in flight: when it started (the clock's monotonic)
        self.call_batch: dict[int, str | None] = {}  # per call in flight: its batch (None: a retry)
        # The calls that answered since their time was last noted on the budget: how many, and their seconds.
        self.calls_measured = 0
        self.measured_seconds = 0.0
        self.latency_noted = clock.monotonic()

    @property
    def config(self) -> SchedulerConfig:
        return self._config()

    @property
    def busy(self) -> int:
        """Calls in flight."""
        return len(self.calls_started)

    def starts(self, member: Member) -> float:
        """A call starts: when."""
        started = self.calls_started[id(member)] = self.clock.monotonic()
        self.call_batch[id(member)] = None if member.run is None else member.run.batch.get("id")
        return started

    def ends(self, member: Member) -> bool:
        """A call ended: whether it was in flight."""
        self.call_batch.pop(id(member), None)
        return self.calls_started.pop(id(member), None) is not None

    def measured(self, started: float) -> None:
        """A call answered: how long calls take moves (the first answer replaces the guess)."""
        elapsed = self.clock.monotonic() - started
        self.call_seconds = (policy.moving_average(self.call_seconds, elapsed, self.config.average_weight)
                             if self.answered else elapsed)
        self.answered = True
        self.calls_measured += 1
        self.measured_seconds += elapsed

    def claim_took(self, seconds: float) -> None:
        self.claim_seconds = policy.moving_average(self.claim_seconds, seconds, self.config.average_weight)

    def note_due(self, stopping: bool, noted: float | None) -> float | None:
        """The call time to note on the budget now (`policy.noted_call_seconds`), or None: every few seconds,
        at once when the budget has no fresh figure, and when the pump stops. Taking it starts the next
        count."""
        if not self.calls_measured:
            return None
        due = self.clock.monotonic() - self.latency_noted >= self.config.latency_note_seconds
        if not (stopping or due or noted is None):
            return None
        mean = self.measured_seconds / self.calls_measured
        seconds = policy.noted_call_seconds(noted, mean, self.calls_measured, self.config.average_weight)
        self.latency_noted, self.calls_measured, self.measured_seconds = self.clock.monotonic(), 0, 0.0
        return seconds

    def memory(self) -> float:
        """How far back the ends of calls are remembered for a newcomer's arrival (`policy.arrival_moment`):
        two calls and a claim's round trip. A batch's work reaches a pump that serves it a call and a claim
        after its creation at most (the claim for a wave's end comes as it ends), some of it more on a busy
        machine; a batch first seen later than that is owed only the calls of that time."""
        return 2 * self.call_seconds + policy.claim_horizon(self.claim_seconds, self.config.soon_margin_seconds)

    def calls_left(self, now: float) -> list[float]:
        return policy.calls_left(self.calls_started.values(), self.call_seconds, now)

    def running_past(self) -> dict:
        """Per batch, its calls in flight expected to run past a claim made now (`policy.running_past`); all
        of them until a call has answered here (how long one takes is a guess until then)."""
        now = self.clock.monotonic()
        horizon = (policy.claim_horizon(self.claim_seconds, self.config.soon_margin_seconds) if self.answered
                   else -math.inf)
        return policy.running_past(((self.call_batch.get(key), start + self.call_seconds - now)
                                    for key, start in self.calls_started.items()), horizon)

    def ending_soon(self) -> tuple[int, float]:
        """How many calls in flight are expected to answer within the next claim's round trip (twice the
        average claim, and a margin), and in how many seconds the next of the others will be."""
        if not self.answered:
            # No call has answered here yet: how long one takes is a guess (`first_call_seconds`), and a guess
            # shorter than the calls made the first claims come a whole round early (work queued for the
            # batches there then, ahead of one that arrived meanwhile). The work queued ahead covers the first
            # answers; the claim for the others follows them.
            return 0, self.config.poll_seconds
        horizon = policy.claim_horizon(self.claim_seconds, self.config.soon_margin_seconds)
        return policy.ending_soon(self.calls_left(self.clock.monotonic()), horizon)

    def lookahead(self, slots: int) -> int:
        """Requests claimed beyond the slots (`policy.lookahead`)."""
        return policy.lookahead(slots, self.claim_seconds, self.call_seconds, self.config.ahead_seconds)

    def ahead_most(self, open_slots: int) -> int:
        """What the slots run in `ahead_seconds`: the most a claim's floor queues past what is missing."""
        return math.ceil(open_slots * self.config.ahead_seconds / max(self.call_seconds, 1e-3))

    def can_start_in_time(self, open_slots: int, deadline: float, queued: int) -> int:
        """How many more requests the slots can start before the deadline, past what is queued
        (`policy.can_start_in_time`)."""
        now = self.clock.monotonic()
        return policy.can_start_in_time(open_slots, deadline - now, self.calls_left(now), self.call_seconds, queued)
