"""The order a batch's work runs in, so that a backend's prompt cache evaluates each shared prefix once.

Two parts, both pure, each where the work is put in order already:

- **Waves, at intake** (`prefix_waves`): a lane's requests are stored in an order that takes `width` prefixes
  at a time (the model's `batch_budget`: as many as it runs requests at once) and goes round them, one request
  of each in turn; a prefix that runs out gives its place to the next. The first wave is the primers of
  `width` different prefixes, and every claim, whatever its size, brings the work of several prefixes to a
  runner, not the next few requests of one prefix (the submission order of a file written prefix by prefix).
  Results keep their submission order: only the lane's order of positions changes.
- **The pick, in a pump** (`pick`): of a batch's queued requests, a free runner takes the next of the prefix
  it has just run (affinity: its backend slot holds that prefix); else one of a prefix no call is running
  (a prefix's primer, or one whose runner moved on); else one of a prefix that has answered once already
  (primed: its cache is written); only else, never idle, one whose primer is still running. Which batch a
  runner serves is decided first, as before (`policy.next_to_run`), so fair turns and priorities hold.

A model whose `prompt_cache` is `off` keeps submission order and first-queued-first.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence


def prefix_waves(prefixes: Sequence[str | None], width: int) -> list[int]:
    """The places of a lane's requests (their `prefixes` in submission order; None: one that shares nothing)
    in wave order: round the first `width` prefixes (in order of first appearance), a request of each in turn,
    the next prefix taking the place of one that ran out. A request without a prefix is a prefix of its own."""
    groups: dict[object, list[int]] = {}
    for i, prefix in enumerate(prefixes):
        groups.setdefault(prefix if prefix is not None else ("alone", i), []).append(i)
    pending = iter(groups.values())
    active: list[tuple[list[int], int]] = []
    for group in pending:
        active.append((group, 0))
        if len(active) >= max(1, width):
            break
    order: list[int] = []
    while active:
        after_round: list[tuple[list[int], int]] = []
        for group, taken in active:  # a round: one request of each prefix in the wave
            order.append(group[taken])
            if taken + 1 < len(group):
                after_round.append((group, taken + 1))
            elif (following := next(pending, None)) is not None:  # the next prefix takes its place
                after_round.append((following, 0))
        active = after_round
    return order


def worth_ordering(prefixes: Sequence[str | None]) -> bool:
    """Whether a lane has a prefix shared by two requests or more (else its order stays as it came)."""
    seen: set[str] = set()
    for prefix in prefixes:
        if prefix is not None:
            if prefix in seen:
                return True
            seen.add(prefix)
    return False


def pick(prefixes: Sequence[str | None], after: str | None, running: Mapping[str, int], primed: Container[str],
         affinity: bool = True) -> int:
    """Which of a batch's queued requests (their prefix keys, in queue order) a free runner starts: the first
    of the prefix `after` it has just run (with `affinity`), else the first whose prefix no call is `running`
    (or that has none), else the first of a `primed` prefix (one that answered once: its cache is written),
    else the first (a runner never idles for a primer). 0 for an empty queue."""
    free = primed_at = None
    for i, prefix in enumerate(prefixes):
        if affinity and after is not None and prefix == after:
            return i
        if free is None and (prefix is None or not running.get(prefix)):
            free = i
            if not affinity or after is None:
                return i
        elif primed_at is None and prefix in primed:
            primed_at = i
    if free is not None:
        return free
    return primed_at if primed_at is not None else 0
