"""A pump's queue of claimed work, and the bookkeeping that shares its runners fairly between batches.

Each batch with work here counts the calls started for it, from where its arrival put it
(`policy.served_at_arrival`: owed the calls the others ran since it came); a free runner takes the
request `policy.next_to_run` picks by those counts, an account's higher-priority batches first; of that
batch's queued requests, the one `prefix_order.pick` picks by their prefix keys, where the model has a prompt
cache (the next of the prefix the runner has just run, else a new prefix, never a prefix whose primer is
still running while other work waits).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator

from ..layout import owner_sort_created_us
from . import policy, prefix_order
from .claimed_work import Member
from .clock import Clock

PRIMED_KEPT = 4096  # prefixes a pump remembers as answered (the least recently answered go first)


def prefix_of(member: Member) -> str | None:
    """A queued request's prefix key: fifth in its group's position, or its item's (a retry)."""
    if member.position is not None:
        return member.position[4] if len(member.position) > 4 else None
    return (member.retry or {}).get("prefix")


def created_us(batch: dict) -> int:
    """When a batch came to the turns, in microseconds: when it was created, to the microsecond its list key
    holds (its `created_at` is in seconds, and a batch created just after another is most often in the same
    second); or, for a batch retried in place since, when it was retried (`retried_at`, in seconds): its
    rejoin is an arrival, owed the calls the others run then as a new batch is."""
    created = (owner_sort_created_us(batch["owner_sk"]) if batch.get("owner_sk")
               else int(batch.get("created_at", 0)) * 1_000_000)
    return max(created, int(batch.get("retried_at", 0)) * 1_000_000)


class FairQueue:
    """Claimed requests waiting for a runner, with per batch what is queued, running and served here.

    `memory` says how far back the ends of calls count for a newcomer's arrival (two calls and a claim's
    round trip, as the pump's call timing has it now)."""

    def __init__(self, clock: Clock, memory: Callable[[], float], cache: str = "off") -> None:
        self.clock, self.memory = clock, memory
        # The model's prompt cache (catalog `prompt_cache`): off, queued work runs first-queued-first.
        self.cache = cache
        self.prefix_running: Counter = Counter()  # prefix key -> calls of it running here
        self.primed: OrderedDict[str, None] = OrderedDict()  # prefix keys a call has answered here
        self.keyed = 0  # queued requests with a prefix key: none, and the order is first-queued-first
        self.members: deque[Member] = deque()
        self.running_of: Counter = Counter()  # batch id -> its group members' calls in flight here
        self.queued_of: Counter = Counter()  # batch id (None: retries) -> its requests in the queue
        # batch id -> calls started here, counted from where its arrival put it (`policy.served_at_arrival`),
        # while it has work queued or running here.
        self.served: dict[str, int] = {}
        # When this pump's recent calls ended (wall clock, as batches' creation times are) and their batch:
        # the calls that ended since a newer batch was created are service the older ones had after it came.
        self.ends: deque[tuple[float, str]] = deque(maxlen=1024)
        self.left_with: dict[str, int] = {}  # batch id -> its count when its work here last ran out

    def __len__(self) -> int:
        return len(self.members)

    def __bool__(self) -> bool:
        return bool(self.members)

    def __iter__(self) -> Iterator[Member]:
        return iter(self.members)

    def add(self, members: list[Member], batches: dict[str, dict]) -> None:
        """Queue claimed work; a batch new here (or back) is counted from its arrival. `batches`: the
        batches of queued work, by id."""
        # A batch with nothing queued or running here has left: its count goes, and comes back with its work.
        for gone in [b for b in self.served if not self.queued_of[b] and not self.running_of[b]]:
            self.left_with[gone] = self.served.pop(gone)
        created = {batch_id: created_us(batch) for batch_id, batch in batches.items()}
        now = self.clock.time()
        for batch_id in {m.run.batch.get("id") for m in members if m.run is not None} - self.served.keys():
            came = policy.arrival_moment(created.get(batch_id, 0) / 1e6, now, batch_id not in self.left_with,
                                         self.memory())
            self.served[batch_id] = policy.served_at_arrival(self.served, self.running_of, created, batch_id,
                                                             policy.ended_since(self.ends, came),
                                                             self.left_with.pop(batch_id, None))
        self.members.extend(members)
        self.queued_of.update(None if m.run is None else m.run.batch.get("id") for m in members)
        self.keyed += sum(prefix_of(m) is not None for m in members)

    def take_next(self, after: str | None = None) -> Member:
        """The queued request a free runner starts (`policy.next_to_run`): the batches whose work is queued
        share the runners evenly, an account's higher-priority batches first, whatever order it was claimed in;
        then, with a prompt cache, of that batch's work the request `prefix_order.pick` picks (`after`: the
        prefix of the call the runner has just run)."""
        if len(self.members) == 1 or len(+self.queued_of) <= 1:  # one batch's work (or retries alone)
            if not self._by_prefixes() or len(self.members) == 1:
                return self._dequeued(self.members.popleft())
            return self._taken(self._by_prefix(range(len(self.members)), after))
        queued = [policy.Queued(batch=None, account=None) if m.run is None
                  else policy.Queued(batch=m.run.batch.get("id"), account=m.run.batch.get("account_id"),
                                     rank=policy.rank(m.run.batch.get("priority"))) for m in self.members]
        i = policy.next_to_run(queued, self.running_of, self.served)
        if self._by_prefixes() and queued[i].batch is not None:
            i = self._by_prefix([j for j, q in enumerate(queued) if q.batch == queued[i].batch], after)
        return self._taken(i)

    def _by_prefixes(self) -> bool:
        return self.cache != "off" and self.keyed > 0

    def _by_prefix(self, places: range | list[int], after: str | None) -> int:
        """Of the queued requests at `places` (one batch's, or all when one batch's work is queued), the one a
        runner that has just run `after` takes (`prefix_order.pick`)."""
        chosen = prefix_order.pick([prefix_of(self.members[j]) for j in places], after, self.prefix_running,
                                   self.primed, affinity=self.cache == "slot")
        return places[chosen]

    def _taken(self, i: int) -> Member:
        member = self.members[i]
        del self.members[i]
        return self._dequeued(member)

    def _dequeued(self, member: Member) -> Member:
        self.queued_of[None if member.run is None else member.run.batch.get("id")] -= 1
        self.keyed -= prefix_of(member) is not None
        return member

    def leftover(self) -> Member:
        """The next request never started (the pump is stopping): out of the queue, as it was claimed."""
        member = self.members.popleft()
        self.keyed -= prefix_of(member) is not None
        return member

    def started(self, member: Member) -> None:
        """A call of the queue's work started: its batch is served one more."""
        if (prefix := prefix_of(member)) is not None:
            self.prefix_running[prefix] += 1
        if member.run is not None:
            batch_id = member.run.batch.get("id")
            self.running_of[batch_id] += 1
            self.served[batch_id] = self.served.get(batch_id, 0) + 1

    def ended(self, member: Member) -> None:
        """A call ended: its prefix is primed (its cache written); a group member's end is remembered, for the
        batches that arrive after it."""
        if (prefix := prefix_of(member)) is not None:
            self.prefix_running[prefix] -= 1
            if self.prefix_running[prefix] <= 0:
                del self.prefix_running[prefix]
            self.primed[prefix] = None
            self.primed.move_to_end(prefix)
            if len(self.primed) > PRIMED_KEPT:
                self.primed.popitem(last=False)
        if member.run is None:
            return
        self.running_of[member.run.batch.get("id")] -= 1
        self.ends.append((self.clock.time(), member.run.batch.get("id")))
        while self.ends[0][0] < self.clock.time() - self.memory():
            self.ends.popleft()
