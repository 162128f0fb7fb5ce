"""The slot pump's claimed work: how the service runs it (`RunsRequests`, handed in by the worker's entry
point, service.running.run_request, so the scheduler stays below the service), a claimed group as its members'
outcomes come in, and a claimed request as it waits in the pump's queue for a slot."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..catalog import Model
from ..domain import Attempt


class RunsRequests(Protocol):
    """How the service runs claimed work, for the pump: each method is one step of running a request or a
    group that the pump schedules but does not define. The synchronous ones run on the pump's threads."""

    async def call(self, model: Model, batch: dict, body: dict, api_key: str | None) -> Attempt:
        """One backend call for a group member (a batch's first attempt)."""

    async def run_retry(self, retry: dict) -> Counter:
        """A claimed retry, run alone on the single-request path (its checks, start, call, settle)."""

    def start_retry(self, retry: dict) -> Any:
        """A claimed retry's checks and start, before its call: it started (what `finish_retry` takes, with
        `batch` and `body` for its call), or a str saying what happened instead."""

    def start_claimed_retries(self, running: list[dict], batch: dict,
                              account_read: tuple[str, dict | None, dict | None] | None = None) -> tuple[list, Counter]:
        """Retries of one batch claimed running (their start in their claim): the checks before their calls,
        once for them all, and their bodies. (Those that may run, started as `start_retry` starts one; what
        happened to the others.)"""

    def finish_retries(self, answered: list[tuple[Any, Attempt]]) -> Counter:
        """Write started retries' answered attempts (of one batch together); what they became."""

    def api_key(self, model: Model) -> str | None:
        """The model's backend key."""

    def close_without_running(self, group: dict, batch: dict | None,
                              account_read: tuple[str, dict | None, dict | None] | None = None) -> Counter:
        """Close a group that must not run now (its batch stopped, its owner lost access, ...): what happened
        to its members, or an empty Counter when it may run. `account_read`: (day, account, usage) as the
        claim that made the group has just read them, so the checks need not read them again."""

    def start_or_close(self, group: dict, starts: Callable[..., Any]) -> Any:
        """Start a dispatched group with `starts(svc, group)` (what it returns), or close it when its batch
        refuses the start after a fresh look; a Counter of what happened instead."""

    def bodies(self, group: dict) -> list[dict]:
        """The group members' request bodies."""

    def record(self, group: dict, position: list, model: Model, attempt: Attempt) -> dict | None:
        """Write a member's outcome: its item, or None when the group's lease was recovered first."""

    def hand_back_retry(self, retry: dict) -> None:
        """A claimed retry that never started: waiting again, due at once."""

    def close_group(self, group: dict, written: list[dict], handed_back: tuple[dict, ...]) -> None:
        """Close a group whose members were all written or handed back (ConditionFailed: recovered)."""

    def stop_at_cap(self, batch_id: str) -> None:
        """Stop a capped batch that can start nothing more (its next request does not fit, nothing of it
        runs), and settle it."""

    def settle_batch(self, batch_id: str) -> None:
        """Give a batch whose last claimed work is done its final status, if it has one now."""


@dataclass
class GroupRun:
    """A group the pump claimed: its members' outcomes as they are written, until every member is accounted
    for (ran and written, or handed back) and the group closes."""

    group: dict
    batch: dict
    left: int
    written: list[dict] = field(default_factory=list)
    handed_back: list[dict] = field(default_factory=list)
    lost: bool = False  # a write lost its condition: the sweeper recovered the group first


@dataclass
class Member:
    """One claimed request waiting in the pump's queue for a slot: a group member, or a retry (`started`: one
    claimed running and checked, as `RunsRequests.start_retry` returns it, ready for its call)."""

    run: GroupRun | None = None
    position: list | None = None
    body: dict | None = None
    retry: dict | None = None
    started: Any = None
