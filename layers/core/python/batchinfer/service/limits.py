"""Per-account limits on calls: what one account's calls may hold of what every account shares.

- **Request rate**, by tier (`TIER_REQUESTS_PER_MINUTE`): a token bucket per account in DynamoDB
  (`records.RequestRate`), so every API instance counts the same calls; one conditional write a call. Every
  authenticated call takes a token, interactive ones too: what a call costs the others is the API concurrency
  it takes, whatever it does, and the daily quota bounds dollars, not calls.
- **Long polls held at once** (`MAX_LONG_POLLS_PER_ACCOUNT`): a results page held open (`wait`) takes a hold
  (`records.LongPolls`) for as long as it waits; one past the limit is refused at once.

Both answer as the OpenAI and Anthropic APIs answer a rate limit: 429 with `retry-after`; the rate's state
goes out on every call as OpenAI's `x-ratelimit-*-requests` headers (the API layer writes them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..domain import new_token
from ..errors import RateLimited
from ..records import LongPolls, RequestRate
from ..runtime import Services

# The holds' end: a poll waits 25 s at most (feed.MAX_WAIT_SECONDS) and a Lambda answers within 30 s; a hold
# whose instance died is cleared after this.
LONG_POLL_HOLD_SECONDS = 60
LONG_POLL_RETRY_AFTER_SECONDS = 5  # a refused long poll may try again then (or read without `wait` now)
MAX_RETRY_AFTER_SECONDS = 60
_GUESSES = 10_000  # accounts whose last take this instance remembers (to pick the bucket's form)
_last_full_at: dict[str, int] = {}


@dataclass(frozen=True)
class RateState:
    """The account's bucket after a call, as OpenAI's `x-ratelimit-*-requests` headers say it."""

    limit: int  # calls the full bucket holds
    per_minute: int  # the rate it refills at
    remaining: int  # calls it holds now
    reset_seconds: float  # until it is full again
    retry_after: int | None = None  # whole seconds until a token is there: set when this call was refused

    def headers(self) -> dict[str, str]:
        return {"x-ratelimit-limit-requests": str(self.limit),
                "x-ratelimit-remaining-requests": str(self.remaining),
                "x-ratelimit-reset-requests": duration(self.reset_seconds)}


def duration(seconds: float) -> str:
    """A duration as OpenAI's reset headers write one: `1s`, `6m0s`, `120ms`."""
    if seconds < 1:
        return f"{max(0, int(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def bucket_of(svc: Services, tier: str) -> tuple[int, int] | None:
    """(interval between tokens in ms, capacity) of a tier's bucket; None when the tier has no rate limit."""
    per_minute = svc.settings.tier_requests_per_minute.get(tier, 0)
    if per_minute <= 0:
        return None
    capacity = max(1, per_minute * svc.settings.request_burst_seconds // 60)
    return max(1, 60_000 // per_minute), capacity


def take_request(svc: Services, account: dict) -> RateState | None:
    """One call of `account` against its tier's rate: the bucket after it (`retry_after` set when it was
    refused: no token left), or None when its tier has no rate limit."""
    bucket = bucket_of(svc, account.get("tier", "free"))
    if bucket is None:
        return None
    interval, capacity = bucket
    per_minute = svc.settings.tier_requests_per_minute[account.get("tier", "free")]
    now = svc.now_ms()
    account_id = account["id"]
    taken, full_at = RequestRate.take(svc.table, account_id, now, interval, capacity,
                                      expect_idle=_last_full_at.get(account_id, 0) <= now)
    if len(_last_full_at) >= _GUESSES:
        _last_full_at.clear()
    _last_full_at[account_id] = full_at
    ahead = max(0, full_at - now)
    if not taken:
        wait_ms = full_at + interval - capacity * interval - now  # until a take fits again
        # At most a minute: the SDKs honour a retry-after up to 60 s (newer openai ones give up past their cap).
        retry_after = min(MAX_RETRY_AFTER_SECONDS, max(1, math.ceil(wait_ms / 1000)))
        return RateState(capacity, per_minute, 0, ahead / 1000, retry_after=retry_after)
    return RateState(capacity, per_minute, max(0, (capacity * interval - ahead) // interval), ahead / 1000)


def refuse_rate(state: RateState, tier: str) -> RateLimited:
    """The 429 of a call over its account's rate."""
    return RateLimited(f"Rate limit reached for requests: this account's tier ({tier}) allows {state.per_minute} "
                       f"requests per minute, {state.limit} at once. Try again in {state.retry_after} s.",
                       code="rate_limit_exceeded", retry_after=state.retry_after)


class LongPollHold:
    """One long poll held by an account while it waits: `take()` before waiting (a 429 past the account's
    limit), `give_back()` once it answers. Both are one DynamoDB write, blocking: run them in a thread."""

    def __init__(self, svc: Services, account_id: str) -> None:
        self.svc, self.account_id, self.token = svc, account_id, new_token()

    def take(self) -> None:
        most = self.svc.settings.max_long_polls_per_account
        until = self.svc.now() + LONG_POLL_HOLD_SECONDS
        for _ in range(2):
            held = LongPolls.hold(self.svc.table, self.account_id, self.token, until, most)
            if held is None:
                return
            if not LongPolls.clear_stale(self.svc.table, self.account_id, held, self.svc.now()):
                break
        raise RateLimited(f"Too many long polls: this account already holds {most} results pages waiting "
                          f"(`wait`) at once. Wait for one to answer, or read without `wait`.",
                          code="too_many_long_polls", retry_after=LONG_POLL_RETRY_AFTER_SECONDS)

    def give_back(self) -> None:
        LongPolls.release(self.svc.table, self.account_id, self.token)
