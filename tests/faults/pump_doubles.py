"""Doubles a pump test moves by hand: a clock that moves only when the test says, and a backend whose calls
wait at a gate until the test releases them. A pump test then says "this call is held; advance a poll; the
pump must have grown" instead of sleeping and hoping the machine kept up.

The clock is moved only once the pump is quiet: no work of the event loop on a thread (its pools and
asyncio.to_thread all go through the loop's run_in_executor, which counts it), no call on its way to the
backend, and the event loop run dry. What the pump does at a moment on its clock then never depends on how
fast the machine got there, however loaded it is: the clock waits for the slowest claim. A thread the test
stalls on purpose (a store that does not answer) is counted in `Work.parked` while it is stalled: it is the
test's to release, not work to wait for.

Several pumps (several workers) may share one clock, each its calls through a gate of its own (long calls
at one, short at another): `drive` then moves the clock once all of them are quiet."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from batchinfer.scheduling.pump import SlotPump
from batchinfer.service.running import run_request
from tests.fake_clock import FakeClock
from tests.faults.harness import GLM

__all__ = ["FakeClock", "Gate", "GatedRequests", "drive", "gated_pump", "quiet", "run_gated"]


class Work:
    """The event loop's work on threads (`run_in_executor`, which asyncio.to_thread and the pump's pools go
    through) not answered yet, counted on the loop: a piece ends once its answer has reached the loop, before
    the coroutine awaiting it runs."""

    def __init__(self) -> None:
        self.pending = 0
        self.parked = 0  # pieces the test stalls on purpose (a store that does not answer), counted by their thread
        self.finished = asyncio.Event()  # set whenever a piece of work ends

    def count_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Count the work `loop` hands to threads from now on."""
        real = loop.run_in_executor

        def run_in_executor(executor, fn, *args):  # noqa: ANN001, ANN002, ANN202
            answer = real(executor, fn, *args)
            self.pending += 1
            answer.add_done_callback(self._ended)
            return answer

        loop.run_in_executor = run_in_executor

    def _ended(self, _: asyncio.Future) -> None:
        self.pending -= 1
        self.finished.set()
        self.finished = asyncio.Event()


class Gate:
    """A backend double: calls `held` picks wait until the test releases them (or, with `latency`, until the
    pump's clock has moved that far past their start: `drive` releases them then); the others go through at
    once. Either way the call then runs on the simulated backend, so its outcome is a real one. `before` and
    `after`, if given, run as each call comes (before it is held) and as it answers (a test's fault: a process
    dying, a recovery, a window closing, ...). Gates of pumps on one event loop share its count of work on
    threads (`gated_pump`)."""

    def __init__(self, held: Callable[[dict], bool] = lambda body: True, latency: float | None = None,
                 before: Callable[[dict], Awaitable[None]] | None = None,
                 after: Callable[[dict], Awaitable[None]] | None = None) -> None:
        self.held, self.latency, self.before, self.after = held, latency, before, after
        self.clock: FakeClock | None = None  # the pump's (gated_pump sets it): when held calls are due
        self.work = Work()
        self.waiting: list[tuple[dict, asyncio.Event, float]] = []  # held calls in the order they came, and due
        self.answered: list[dict] = []  # bodies of calls that answered, in order
        self.started_at: list[float] = []  # when each call came, on the pump's clock
        self.spans: list[tuple[float, float]] = []  # when each call that answered came and answered, in order
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
        for _, event, _ in go:
            event.set()

    def next_due(self) -> float | None:
        """When the next held call is due on the pump's clock (with `latency`), or None."""
        return min((due for _, _, due in self.waiting), default=None) if self.latency is not None else None

    def release_due(self, now: float) -> None:
        """Let the held calls due by `now` go on (with `latency`; without, only the test releases them)."""
        if self.latency is None:
            return
        go = [w for w in self.waiting if w[2] <= now]
        self.waiting = [w for w in self.waiting if w[2] > now]
        for _, event, _ in go:
            event.set()

    async def call(self, real, model, batch: dict, body: dict, api_key):  # noqa: ANN001, ANN201
        now = self._now()
        self.started_at.append(now)
        if self.before is not None:
            await self.before(body)
        if self.held(body):
            event = asyncio.Event()
            self.waiting.append((body, event, now + (self.latency or 0.0)))
            self.peak = max(self.peak, self.in_flight)
            self._changed()
            await event.wait()
        self.passing += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            answer = await real(model, batch, body, api_key)
            if self.after is not None:
                await self.after(body)
        finally:
            self.passing -= 1
        self.answered.append(body)
        self.spans.append((now, self._now()))
        self._changed()
        return answer

    def _now(self) -> float:
        return self.clock.monotonic() if self.clock else 0.0

    def _changed(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def until(self, condition: Callable[[], bool], seconds: float = 60.0) -> None:
        """Wait for `condition`, checked at each call's arrival or answer (`seconds`: a bound for a broken
        pump, never a timing the test relies on)."""
        async with asyncio.timeout(seconds):
            while not condition():
                await self.changed.wait()

    async def quiet(self, seconds: float = 60.0) -> None:
        """Wait until nothing more happens without the clock or the test (`quiet`)."""
        await quiet([self], seconds)


async def quiet(gates: Sequence[Gate], seconds: float = 60.0) -> None:
    """Wait until nothing more happens without the clock or the test: no work of the loop on a thread (but
    what the test has parked), no call on its way to the backend through any of `gates`, and the event loop
    has run dry. However long a loaded machine takes over that work, the clock waits for it; `seconds` only
    bounds a broken test (a thread that waits for the clock or the test, not parked)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    calm = 0
    while calm < 30:  # the loop's turns for a thread's answer to reach the coroutine that awaits it
        if any(gate.work.pending - gate.work.parked or gate.passing for gate in gates):
            if loop.time() > until:
                raise AssertionError(f"work on threads still out after {seconds} s: a thread waits for the "
                                     "clock or the test (one the test stalls on purpose belongs in Work.parked)")
            calm = 0
            await asyncio.sleep(0.002)  # polled: a thread's answer comes back on its own
        else:
            calm += 1
            await asyncio.sleep(0)


class GatedRequests:
    """The service's way of running a request (`service.running.run_request.BatchRequests`), its backend
    calls through a gate."""

    def __init__(self, svc, gate: Gate) -> None:  # noqa: ANN001
        self.real, self.gate = run_request.BatchRequests(svc), gate

    async def call(self, model, batch: dict, body: dict, api_key):  # noqa: ANN001, ANN201
        return await self.gate.call(self.real.call, model, batch, body, api_key)

    def __getattr__(self, name: str):  # noqa: ANN204 - the rest is the service's own
        return getattr(self.real, name)


def gated_pump(svc, gate: Gate, clock: FakeClock, seconds: float = 3_600.0) -> SlotPump:  # noqa: ANN001
    """A pump on GLM whose calls go through `gate`, on `clock`, until `seconds` on it (long: the tests end it
    by running out of work). Called in the test's event loop: the loop counts its work on threads for
    `quiet`, in one count every gate of a pump on it shares (the threads are the loop's, whichever pump
    handed them work)."""
    gate.clock = clock
    pump = SlotPump(svc, svc.catalog.get(GLM), clock.monotonic() + seconds, GatedRequests(svc, gate), clock=clock)
    loop = asyncio.get_running_loop()
    counted = getattr(loop, "counted_by", None)
    if counted is None:
        gate.work.count_on(loop)
        loop.counted_by = gate.work
    else:
        gate.work = counted
    return pump


async def drive(pump_task: asyncio.Task | Sequence[asyncio.Task], clock: FakeClock, gate: Gate | Sequence[Gate],
                step: float, until: Callable[[], bool] | None = None, most_steps: int = 4000,
                each: Callable[[], None] | None = None) -> None:
    """Move the clock a step at a time (or to the next held call's due time at any gate, if sooner: it is
    released then), each once the pumps are quiet, until `until` holds or else every pump has stopped (several
    pumps on the one clock: their tasks and gates; a pump that failed says why at once). `each`: what the
    test looks at every time the pumps are quiet."""
    tasks = [pump_task] if isinstance(pump_task, asyncio.Task) else list(pump_task)
    gates = [gate] if isinstance(gate, Gate) else list(gate)
    for _ in range(most_steps):
        await quiet(gates)
        if each is not None:
            each()
        if until is not None and until():
            return
        for task in tasks:
            if task.done():
                task.result()  # a pump that failed says why
        if all(task.done() for task in tasks):
            if until is None:
                return
            raise AssertionError("the pumps stopped before the test's condition held")
        due = min((d for d in (g.next_due() for g in gates) if d is not None), default=None)
        clock.advance(step if due is None else max(0.0, min(step, due - clock.monotonic())))
        for g in gates:
            g.release_due(clock.monotonic())
    raise AssertionError(f"after {most_steps} steps of {step} s the pumps had not got there")


def run_gated(svc, slots: int, seconds: float = 3_600.0, gate: Gate | None = None,  # noqa: ANN001
              step: float | None = None, each: Callable[[], None] | None = None) -> tuple[Counter, Gate, FakeClock]:
    """A worker invocation's pump on GLM (as `harness.run_pump`) on a fake clock, its calls through `gate`
    (by default none held), driven a poll at a time until it stops: what it did, the gate and the clock."""
    from batchinfer.scheduling.config import scheduler_config

    gate = gate or Gate(held=lambda body: False)
    clock = FakeClock()

    async def scenario() -> Counter:
        running = asyncio.create_task(gated_pump(svc, gate, clock, seconds).run(slots))
        await drive(running, clock, gate, step or scheduler_config(svc.settings).poll_seconds, each=each)
        return running.result()

    return asyncio.run(scenario()), gate, clock
