"""The scheduler's knobs, each documented once with why it has its value.

Most are fixed by measurement (docs/benchmarks.md); a few come from the service's settings (`settings.py`
reads the environment, nothing here does). The dispatcher and the slot pump read them through
`scheduler_config(svc.settings)`, at the moment they use them, so a change of settings reaches them at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ledger import GROUP_MAX
from ..settings import Settings


@dataclass(frozen=True)
class SchedulerConfig:
    """Every knob of the dispatcher, the lanes, the slot pump and the budget, with its default and why."""

    # --- Lanes: how batches share a model's slots -------------------------------------------------------

    # Slots a lane is given per turn while more lanes wait than there are free slots. Each group pays a claim
    # and a close whatever its size; one slot per turn over many lanes made every group a single request (and
    # wrote the budget and account items twice per request). Turns still rotate over every lane, so every
    # batch gets its share, a quantum at a time. Half of a 16-slot budget: at 200 lanes, groups of 8 wrote 4.4
    # write units per request against 5.6 for groups of 4, with the same fairness (docs/benchmarks.md).
    lane_quantum: int = 8
    # Pages of lanes one claim reads at most when lanes it reads cannot take work (their accounts at their
    # tier limit, their batches stopping): it stays O(1); the next claim goes on from where this one ended.
    quanta_pages: int = 4
    # The most one claim takes from a lane: ten groups keep the lane, the slots and the group items of the
    # claim's transaction well inside DynamoDB's 100 items.
    claim_max: int = 10 * GROUP_MAX

    # --- The slot pump --------------------------------------------------------------------------------

    # The budget is read this often (interactive load, 429 back-off), on the pump's own thread and clock; the
    # claimer's beat too (it looks for stopped batches on it, `stop_look_seconds`).
    poll_seconds: float = 0.25
    # No work claimed for this long: the pump ends and gives its slots back.
    idle_seconds: float = 1.0
    # Four polls: no new call starts on a cap read longer ago than this (a stalled poll must not let calls
    # start on what the budget said before interactive load came).
    stale_cap_seconds: float = 1.0
    # A claim is sized for the slots free by the time it lands: those whose calls answer within twice the
    # average claim and this margin.
    soon_margin_seconds: float = 0.05
    # Claimed work queued beyond the slots never takes them longer than this to run: fairness between
    # batches (the claims' turns) holds to within that much work.
    ahead_seconds: float = 1.0
    # A batch with queued work is looked at again (was it stopped or paused?) this often, between claims; and no
    # queued request starts on a look at its batch older than `stale_stop_seconds` (it looks again first), so a
    # cancel or a pause stops what a pump has queued within that time, however slow its claims.
    stop_look_seconds: float = 0.5
    stale_stop_seconds: float = 1.0
    # The moving averages of a claim's and a call's duration start here and move this much of the way to
    # each new measurement.
    first_claim_seconds: float = 0.05
    first_call_seconds: float = 1.0
    average_weight: float = 0.2
    # A pump writes what its calls took on the model's budget (estimates read it) at most this often while it
    # runs, and also at once when the budget has no fresh figure, and when it stops: a batch shorter than
    # this still leaves its calls' time.
    latency_note_seconds: float = 5.0
    # A noted call time older than this says little about the backend now: estimates use `first_call_seconds`
    # and the next pump notes its calls at once.
    latency_fresh_seconds: float = 24 * 3600
    # A pump stops claiming this long before its invocation must have ended, beyond the longest call (the
    # backend timeout): its last calls answer and its slots go back in time.
    end_margin_seconds: float = 10.0

    # --- The budget -------------------------------------------------------------------------------------

    # No 429 for this long: the adaptive cap may grow again, one slot a second.
    probe_after_seconds: int = 2
    # Interactive clients send back to back: between one call's end and the next one's start the count dips,
    # and a dispatcher reading it then would start batch work that runs for a whole request. Batch work gives
    # way at once and takes the room back once the load has stayed lower this long. It must outlast a
    # client's turn-around (its answer back, its next call through the API and its lease begun): on the local
    # stack under load that took up to ~1 s, and with 1 s batch calls started over the floor in one cycle of
    # 20 (the pumps' polls had seen 9 of 16 calls counted for a whole second). 2 s: none did in two runs of
    # 20; load that has gone gives its room back ~1 s later than with 1 s (docs/benchmarks.md).
    interactive_window_seconds: float = 2.0
    # A request whose owner lost batch access waits this long before it is looked at again.
    access_recheck_seconds: int = 60

    # --- From the settings (documented there) ------------------------------------------------------------

    interactive_yield_per_request: int = 1  # Settings.interactive_yield_per_request
    # Settings.backend_timeout_seconds: the longest a running call can take. Slots still held over the cap
    # past it are a dead worker's, so a pump holds its own calls back at most this long.
    backend_timeout_seconds: float = 120.0
    idle_sleep_seconds: float = 0.25  # Settings.dispatcher_idle_sleep_seconds

    @classmethod
    def from_settings(cls, settings: Settings) -> SchedulerConfig:
        return cls(interactive_yield_per_request=settings.interactive_yield_per_request,
                   backend_timeout_seconds=settings.backend_timeout_seconds,
                   idle_sleep_seconds=settings.dispatcher_idle_sleep_seconds)


_last: tuple[Settings, SchedulerConfig] | None = None


def scheduler_config(settings: Settings) -> SchedulerConfig:
    """The scheduler's config for these settings (built once per settings object: read on hot paths)."""
    global _last
    last = _last
    if last is not None and last[0] is settings:
        return last[1]
    config = SchedulerConfig.from_settings(settings)
    _last = (settings, config)
    return config
