"""Doubles a pump test moves by hand: a clock that moves only when the test says, and a backend whose calls
wait at a gate until the test releases them. A pump test then says "this call is held; advance a poll; the
pump must have grown" instead of sleeping and hoping the machine kept up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from batchinfer.scheduling.pump import SlotPump
from batchinfer.service.running import run_request
from tests.fake_clock import FakeClock
from tests.faults.harness import GLM


class Gate:
    """A backend double: calls `held` picks wait until the test releases them; the others go through at
    once. Either way the call then runs on the simulated backend, so its outcome is a real one."""

    def __init__(self, held: Callable[[dict], bool] = lambda body: True) -> None:
        self.held = held
        self.waiting: list[tuple[dict, asyncio.Event]] = []  # held calls, in the order they came
        self.answered: list[dict] = []  # bodies of calls that answered, in order
        self.changed = asyncio.Event()  # set whenever a call arrives or answers
        self.passing = 0  # calls let through (or released) that have not answered yet
        self.peak = 0  # the most calls held or past the gate at once (the test may reset it)

    @property
    def in_flight(self) -> int:
        """Calls the pump has started that have not answered."""
        return len(self.waiting) + self.passing

    def release(self, n: int | None = None) -> None:
        """Let the first `n` held calls (all if None) go on to the backend."""
        go, self.waiting = (self.waiting, []) if n is None else (self.waiting[:n], self.waiting[n:])
        for _, event in go:
            event.set()

    async def call(self, real, model, batch: dict, body: dict, key):  # noqa: ANN001, ANN201
        if self.held(body):
            event = asyncio.Event()
            self.waiting.append((body, event))
            self.peak = max(self.peak, self.in_flight)
            self._changed()
            await event.wait()
        self.passing += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            answer = await real(model, batch, body, key)
        finally:
            self.passing -= 1
        self.answered.append(body)
        self._changed()
        return answer

    def _changed(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def until(self, condition: Callable[[], bool], seconds: float = 60.0) -> None:
        """Wait for `condition`, checked at each call's arrival or answer (`seconds`: a bound for a broken
        pump, never a timing the test relies on)."""
        async with asyncio.timeout(seconds):
            while not condition():
                await self.changed.wait()


class GatedRequests:
    """The service's way of running a request (`service.run_request.BatchRequests`), its backend calls
    through a gate."""

    def __init__(self, svc, gate: Gate) -> None:  # noqa: ANN001
        self.real, self.gate = run_request.BatchRequests(svc), gate

    async def call(self, model, batch: dict, body: dict, key):  # noqa: ANN001, ANN201
        return await self.gate.call(self.real.call, model, batch, body, key)

    def __getattr__(self, name: str):  # noqa: ANN204 - the rest is the service's own
        return getattr(self.real, name)


def gated_pump(svc, gate: Gate, clock: FakeClock, seconds: float = 3_600.0) -> SlotPump:  # noqa: ANN001
    """A pump on GLM whose calls go through `gate`, on `clock`, until `seconds` on it (long: the tests end it
    by running out of work)."""
    return SlotPump(svc, svc.catalog.get(GLM), clock.monotonic() + seconds, GatedRequests(svc, gate), clock=clock)


async def drive(pump_task: asyncio.Task, clock: FakeClock, gate: Gate, step: float,
                until: Callable[[], bool] | None = None, most_steps: int = 2000) -> None:
    """Move the clock a step at a time, each once the pump has had its chance to act on the last (a call came
    or answered, or it finished, or a moment passed), until `until` holds or else the pump has stopped. Use
    it where how far the pump's clock moves is not what the test asserts: a slow machine takes more steps."""
    done = until or pump_task.done
    for _ in range(most_steps):
        if done():
            return
        clock.advance(step)
        changed = asyncio.ensure_future(gate.changed.wait())
        await asyncio.wait({pump_task, changed}, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
        changed.cancel()
    raise AssertionError(f"after {most_steps} steps of {step} s the pump had not got there")
