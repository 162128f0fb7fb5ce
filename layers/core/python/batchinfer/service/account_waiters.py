"""Requests waiting on their account (its day's quota used up, its batch access off) run again as soon as
an operator raises the quota or restores the access, not at 00:00 UTC or the next access recheck.

Why this is cheap at 50,000 waiting requests: an account that may not run batch requests claims nothing
(scheduling.lanes.AccountSlots), so its undispatched requests wait in their lanes, costing no write while
they wait, and the next claim after the change takes them. Only the requests that were already claimed when
the quota ran out (at most the account's slots in flight, a few dozen) wait as request items; the change
re-dates those, once, found by their place in `by_due`: a quota wait is due at exactly the next 00:00 UTC,
an access wait within `access_recheck_seconds`. Reading those keys is one query per model (keys only, every
account's waits at that instant), and nothing is polled while nobody changes anything.
"""

from __future__ import annotations

from ..domain import next_utc_midnight, utc_day
from ..records import Account, Batch, Request
from ..runtime import Services
from ..scheduling.config import scheduler_config
from ..storage.dynamo import ConditionFailed


def wake_account(svc: Services, account_id: str) -> int:
    """Make the account's waiting requests due now if it may run batch requests; returns how many."""
    t = svc.table
    now = svc.now()
    account, usage = Account.with_usage(t, account_id, utc_day(now))
    if account is None or not Account.may_run_batches(account, usage):
        return 0
    batches = {b["pk"] for b in Batch.unfinished_of_owner(t, account_id)}
    if not batches:
        return 0
    midnight = next_utc_midnight(now)
    recheck = now + scheduler_config(svc.settings).access_recheck_seconds
    woken = 0
    for model in svc.catalog.runnable:
        for key in Request.waiting_later(t, model.id, now, max(midnight, recheck)):
            due = int(key["due_at"])
            if key["pk"] not in batches or (due != midnight and due > recheck):
                continue  # another account's, or a retry's own back-off
            try:
                Request.redate(t, key, now)
                woken += 1
            except ConditionFailed:
                pass  # claimed or settled meanwhile
    return woken
