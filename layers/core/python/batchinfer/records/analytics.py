"""A batch's analytics as stored: flat counters on the batch item, moved by the writes that already settle
its requests (a group's close, a retry's settle), so they cost no write of their own.

Flat top-level attributes rather than a map: `ADD` creates a missing top-level attribute, while a map's
path needs its parent to exist (a batch created before these counters would refuse the whole settle).

- `an_attempts`: attempts ended (answered, timed out, or abandoned by a worker that died: counted once,
  when the sweeper recovers them); `an_retries`: those that were not their request's first attempt;
- `an_finished`: requests ended by an attempt (completed, or failed after being tried);
- `an_last_finished_at`: when the last answered attempt was settled (Unix seconds);
- `an_idle_seconds`: time the batch did not run after it had started (paused; ended before a retry in place),
  and the latest such time (`an_idle_last`, ending at `an_idle_until`);
- `L<k>`: answered attempts whose backend latency fell in bucket k (`bucket`): a sketch whose buckets
  of any number of groups add up, holding at most `MAX_BUCKET + 1` small counters whatever the batch's size
  (a few hundred bytes at most: DynamoDB's 400 KB item limit is far off);
- `E_<code>`: attempts that ended in that error code, final or retried.
"""

from __future__ import annotations

import math
import re

from ..layout import batch_key
from ..storage.dynamo import Table
from .expressions import Op, _add_op

ATTEMPTS = "an_attempts"
RETRIES = "an_retries"
FINISHED = "an_finished"
LAST_FINISHED_AT = "an_last_finished_at"
IDLE_SECONDS = "an_idle_seconds"
IDLE_LAST = "an_idle_last"
IDLE_UNTIL = "an_idle_until"
# The families' names are short: every byte of the batch item is paid on each of its writes (a write unit per
# started KB, twice in a transaction), and a batch touches a few dozen buckets.
LATENCY = "L"
ERRORS = "E_"

# Buckets of latency: 4 per doubling, so a bucket's middle is within 2^(1/8) - 1 (9.1 %) of any latency in it.
STEPS_PER_DOUBLING = 4
# The last bucket holds everything from 2^19.75 ms (14.5 minutes, past any backend timeout) up: at most 81
# counters (~6 bytes each); latencies within a factor of 16 of each other take at most 17.
MAX_BUCKET = 80
RELATIVE_ERROR = 2 ** (1 / (2 * STEPS_PER_DOUBLING)) - 1
MAX_CODE_CHARS = 40  # an error code longer than this is cut (codes are the service's own, a few words)


def bucket(ms: float) -> int:
    """The bucket of a latency in milliseconds: 0 below 1 ms, then k for [2^((k-1)/4), 2^(k/4)) ms."""
    if ms < 1:
        return 0
    return min(MAX_BUCKET, 1 + int(math.floor(STEPS_PER_DOUBLING * math.log2(ms))))


def bucket_ms(k: int) -> float:
    """What a bucket stands for: its geometric middle (0.5 ms for bucket 0)."""
    if k <= 0:
        return 0.5
    return 2 ** ((k - 0.5) / STEPS_PER_DOUBLING)


def error_attribute(code: str) -> str:
    """The counter of one error code (letters, digits and `_` only, so it needs no expression name)."""
    return ERRORS + (re.sub(r"[^a-z0-9_]", "_", str(code).lower())[:MAX_CODE_CHARS] or "unknown")


def is_retry(req: dict) -> bool:
    """Whether a request's attempt under way is not its first: a retry after a backoff, or a run again of a
    retry in place (whose attempts count afresh, those used before kept in `earlier_attempts`)."""
    return int(req.get("attempt", 0)) > 1 or int(req.get("earlier_attempts", 0)) > 0


def attempt_tally(ms: float | None, code: str | None, retry: bool) -> dict:
    """What one ended attempt adds, kept with its outcome (and in a group member's item, so that a group
    recovered from its items counts it once): `ms` None for an attempt abandoned unanswered."""
    tally: dict = {}
    if ms is not None:
        tally["ms"] = max(0, int(round(ms)))
    if code:
        tally["code"] = str(code)
    if retry:
        tally["retry"] = 1
    return tally


def counters(tally: dict, finished: bool) -> dict[str, int]:
    """The counters an attempt's tally moves; `finished`: its outcome ended its request."""
    moved = {ATTEMPTS: 1}
    if tally.get("retry"):
        moved[RETRIES] = 1
    if finished:
        moved[FINISHED] = 1
    if tally.get("ms") is not None:
        moved[f"{LATENCY}{bucket(float(tally['ms']))}"] = 1
    if tally.get("code"):
        moved[error_attribute(tally["code"])] = 1
    return moved


def add_with_finish(t: Table, batch_id: str, moved: dict[str, float], finished_at: int | None,
                    condition: str | None = None) -> Op | None:
    """The batch's counters as `Batch.add` adds them, and, when an answered attempt ended, its
    `an_last_finished_at` set in the same update; `condition`: what the batch must satisfy."""
    if finished_at is None:
        return _add_op(t, batch_key(batch_id), moved, condition)
    moved = {k: v for k, v in moved.items() if v}
    adds = " ADD " + ", ".join(f"{k} :{k.lstrip('#')}" for k in moved) if moved else ""
    return t.op_update(*batch_key(batch_id), f"SET {LAST_FINISHED_AT} = :an_last" + adds,
                       vals={":an_last": finished_at, **{f":{k.lstrip('#')}": v for k, v in moved.items()}},
                       condition=condition)


def add_idle(t: Table, batch_id: str, seconds: int, until: int) -> None:
    """Time the batch did not run (a pause, an ending before a retry in place), ending at `until`: left out of
    its running time. The latest one is kept apart (`an_idle_last`, `an_idle_until`): until an attempt
    finishes after it, it lies outside the span the running time measures."""
    if seconds > 0:
        t.update(*batch_key(batch_id), f"ADD {IDLE_SECONDS} :s SET {IDLE_LAST} = :s, {IDLE_UNTIL} = :until",
                 vals={":s": int(seconds), ":until": int(until)}, condition="attribute_exists(pk)")


def stored(item: dict) -> dict:
    """The analytics counters of a batch item as plain numbers: latency buckets and error codes as maps."""
    latency: dict[int, int] = {}
    errors: dict[str, int] = {}
    for name, value in item.items():
        if name.startswith(LATENCY) and name[len(LATENCY):].isdigit():
            latency[int(name[len(LATENCY):])] = int(value)
        elif name.startswith(ERRORS):
            errors[name[len(ERRORS):]] = int(value)
    return {"attempts": int(item.get(ATTEMPTS, 0)), "retries": int(item.get(RETRIES, 0)),
            "finished": int(item.get(FINISHED, 0)),
            "last_finished_at": int(item[LAST_FINISHED_AT]) if item.get(LAST_FINISHED_AT) is not None else None,
            "idle_seconds": int(item.get(IDLE_SECONDS, 0)), "idle_last": int(item.get(IDLE_LAST, 0)),
            "idle_until": int(item.get(IDLE_UNTIL, 0)), "latency": latency, "errors": errors}
