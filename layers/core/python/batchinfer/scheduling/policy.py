"""The scheduler's arithmetic, as pure functions: no clock, no store, no randomness but what is passed in.

What the dispatcher, the lanes and the slot pump decide (how much to claim and when, how far ahead, what
can start before a deadline, how many slots to give back, how lanes share free slots, how the budget's
shards share a take, what a model's cap is) is computed here from numbers they read; they do the reading
and the writing. tests/unit/test_scheduling_policy_lanes.py (the cap, lanes' shares, priority) and
tests/unit/test_scheduling_policy_pump.py (the slot pump's claims and turns) hold these functions to their
invariants.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

_SHORTEST_CALL = 1e-3  # seconds: a moving average of call times is never taken as 0


# --- The model's cap -------------------------------------------------------------------------------------

def effective_cap(budget: int, floor: int, interactive: int, yield_per_request: int,
                  adaptive_cap: int | None = None) -> int:
    """The batch requests a model may have in flight: its budget less what interactive load takes
    (`yield_per_request` slots per interactive call), within the adaptive cap the backend's 429s set, and
    never below the floor (itself never above the budget)."""
    cap = budget - interactive * yield_per_request
    if adaptive_cap is not None:
        cap = min(cap, adaptive_cap)
    return max(min(floor, budget), cap)


def backed_off_cap(budget: int, floor: int, in_flight: int) -> int:
    """The adaptive cap after a 429: half of what was in flight (multiplicative decrease), not below the
    floor."""
    return max(min(floor, budget), in_flight // 2)


def may_probe(now: int, throttled_at: int, probed_at: int, probe_after: int) -> bool:
    """Whether the adaptive cap may grow now: no 429 for `probe_after` seconds, and not grown this second."""
    return now - throttled_at >= probe_after and now > probed_at


def probed_cap(adaptive_cap: int, budget: int) -> int | None:
    """The adaptive cap one slot up (additive increase); None once that reaches the budget (no cap then)."""
    grown = adaptive_cap + 1
    return None if grown >= budget else grown


def split_take(rooms: Sequence[int], k: int, tiebreak: Callable[[], float] = random.random) -> list[tuple[int, int]]:
    """Up to k slots from the budget's shards, the roomiest first and as few shards as will do: (shard, how
    many). Ties go at random (`tiebreak`), so that takers that read together spread out rather than race for
    one shard."""
    parts: list[tuple[int, int]] = []
    for shard in sorted(range(len(rooms)), key=lambda s: (-rooms[s], tiebreak())):
        if k <= 0 or rooms[shard] <= 0:
            break
        parts.append((shard, min(k, rooms[shard])))
        k -= parts[-1][1]
    return parts


# --- Lanes: how batches share free slots ------------------------------------------------------------------

def lanes_to_read(free: int, quantum: int) -> int:
    """How many lanes a claim of `free` slots reads: one per quantum it can give, and one more (a short lane
    leaves its quantum to the next)."""
    return -(-free // quantum) + 1


def by_quanta(complete: bool, free: int, quantum: int, lanes: int) -> bool:
    """Whether free slots go a quantum per lane in turn (more lanes than the free slots give each a quantum,
    or not all lanes read), rather than a slot at a time to the batches holding fewest (`water_fill`)."""
    return not complete or free < quantum * lanes


@dataclass(frozen=True)
class LaneWant:
    """A lane as the water-fill sees it: its key, its account, the slots its batch holds, the requests it
    could dispatch now, its rank among its account's lanes (`rank`: higher goes first), and, in a pump's
    claim, where its batch stands there (`standing`, see `standing_in_pump`: lower goes first; None outside
    a pump, where the slots held decide)."""

    key: Hashable
    account: Hashable
    held: int
    room: int
    rank: int = 1
    standing: int | None = None

    @property
    def level(self) -> int:
        """What the turns and the water-fill go by: the standing in the claiming pump, else the slots held."""
        return self.held if self.standing is None else self.standing


# A batch's priority among its account's batches, as a rank: higher is served first. Lanes written before
# priorities existed carry none and rank as `normal`.
PRIORITY_RANKS = {"high": 2, "normal": 1, "low": 0}


def rank(priority: object) -> int:
    """The rank of a lane's priority (`normal` when it has none)."""
    return PRIORITY_RANKS.get(priority, 1) if isinstance(priority, str) else 1


def by_priority(lanes: Sequence[LaneWant], shares: dict) -> dict:
    """Hand each account's slots (the sum of its lanes' `shares`, computed as if every lane had one priority,
    so no account's total changes) to its highest-ranked lanes first, each up to its room; lanes of one rank
    share what reaches them by the water-fill (fewest held first, ties in turn). An account whose lanes all
    have one rank keeps its shares as they are. Returns the new shares (lanes given none left out)."""
    out = dict(shares)
    accounts: dict = {}
    for lane in lanes:
        accounts.setdefault(lane.account, []).append(lane)
    for account, own in accounts.items():
        if len({lane.rank for lane in own}) < 2:
            continue
        total = sum(shares.get(lane.key, 0) for lane in own)
        for lane in own:
            out.pop(lane.key, None)
        for level in sorted({lane.rank for lane in own}, reverse=True):
            if total <= 0:
                break
            tier = [lane for lane in own if lane.rank == level]
            given, _ = water_fill(tier, total, {account: total})
            out.update(given)
            total -= sum(given.values())
    return out


def turn_goes_to(lanes: Sequence[LaneWant], index: int, spent: Iterable[Hashable] = ()) -> int:
    """While slots go a quantum per lane in turn: the lane (its place in `lanes`) that the turn of
    `lanes[index]` is given to: its account's highest-ranked lane among those read, ties to the lane in turn,
    then to the next in turn. Lanes in `spent` (found with nothing to claim) are passed over. The account
    takes its turns as before; priority only says which of its lanes uses them."""
    gone = set(spent)
    own = lanes[index]
    best = index
    for step in range(1, len(lanes)):
        i = (index + step) % len(lanes)
        lane = lanes[i]
        if lane.account == own.account and lane.key not in gone and lane.rank > lanes[best].rank:
            best = i
    return best


def water_fill(lanes: Sequence[LaneWant], free: int, account_room: dict) -> tuple[dict, Hashable | None]:
    """Share `free` slots a slot at a time, each to the lane whose batch then holds the fewest (ties in the
    lanes' order: their turn), so that a batch that just arrived takes the freed slots until it holds as
    many as the others rather than half of each claim's; in a pump's claim, the lowest `standing` first
    (then the fewest held). A lane takes no more than its room, an account no more than its
    `account_room`. Returns each lane's share (lanes given none left out) and the key of the
    lane given the last slot (the next claim's turn starts after it), None when none was given."""
    shares: dict = {}
    accounts = dict(account_room)
    given_last = None
    while free > 0:
        ready = [lane for lane in lanes
                 if lane.room > shares.get(lane.key, 0) and accounts.get(lane.account, 0) > 0]
        if not ready:
            break
        lane = min(ready, key=lambda lane: (lane.level + shares.get(lane.key, 0),  # the first in turn on ties
                                            lane.held + shares.get(lane.key, 0)))
        shares[lane.key] = shares.get(lane.key, 0) + 1
        accounts[lane.account] -= 1
        free -= 1
        given_last = lane.key
    return shares, given_last


def lane_quantum(quantum: int, account_free: int, budget: float) -> tuple[int, int | float]:
    """A lane's turn while slots go a quantum at a time: (how many to ask of it, the most it may be given),
    within its account's free slots and what the claim may still take (`budget`)."""
    most = min(account_free, budget)
    return min(quantum, most), most


def lane_take(k: int, room: int, most: int | float, quantum: int, claim_max: int) -> int:
    """How many of a lane's `room` requests to claim when `k` are asked: all of them when at most half a
    quantum would be left (the lane's last group would pay a claim and a close for a stub), if `most` allows;
    never more than the lane has, nor than one claim may take (`claim_max`)."""
    if 0 < room - k <= quantum // 2:
        k = max(k, min(room, most))
    return int(min(k, room, claim_max))


def lane_most_in_pump(wave: int, here: int, shared: bool) -> float:
    """The most a pump's claim takes of one lane while other lanes could take work too (`shared`):
    what its slots run in about a wave (`wave`: its open slots, or what it claims ahead when that is more,
    for calls shorter than a claim) less what of that batch runs past the claim (`running_past`) or is
    queued there already (`here`). The
    rest stays in the lane for a pump with room: each pump is fair by its own count of starts, so a pump of
    few slots that took a newcomer's whole lane (a quantum and its last few) shared its few slots between
    the newcomer and the others over several waves, while a pump of many slots beside it ran only the
    others'. A lane alone with work (the others' accounts full, say) is not bounded here (inf): its pump
    claims ahead of its slots, or it would idle a claim's round trip at every call's end."""
    if not shared:
        return math.inf
    return max(0, wave - here)


def pump_wave(open_slots: int, lookahead_: int, budget: int) -> int | None:
    """What a pump's slots run in about a wave, for `lane_most_in_pump`: its open slots, or what it claims
    ahead when that is more (calls shorter than a claim). None when the pump holds the model's whole budget:
    no other pump could take what it leaves in a lane, and a few slots' claims cut to a wave would make
    groups of a few, each paying a claim and a close."""
    return max(open_slots, lookahead_) if budget > open_slots else None


def running_past(calls: Iterable[tuple[Hashable, float]], horizon: float) -> dict:
    """Per batch, its calls in flight (each: its batch, its expected seconds left) still running when a claim
    made now lands (`horizon`: its round trip): what of a pump's wave a batch holds for `lane_most_in_pump`.
    Calls answering sooner free their slots for the claim's work: counted, a claim made as a wave ends took
    none of the batches running it, and the runners idled until the next claim."""
    out: dict = {}
    for batch, left in calls:
        if left > horizon:
            out[batch] = out.get(batch, 0) + 1
    return out


def lane_room(total: int, dispatched: int) -> int:
    """A lane's requests not yet dispatched."""
    return max(0, total - dispatched)


# --- The slot pump: how much to claim, how far ahead, when to give slots back ------------------------------

def lookahead(slots: int, claim_seconds: float, call_seconds: float, ahead_seconds: float) -> int:
    """Requests claimed beyond the slots: what the slots use up while a claim is on its way, twice (the next
    claim starts when half of it is gone). Bounded in time, not in slots: calls shorter than a claim
    (embeddings, small models) need many queued per slot, or each slot idles through every claim; and at
    most `ahead_seconds` of work queued keeps fairness between batches within that."""
    during_claim = slots * claim_seconds / max(call_seconds, _SHORTEST_CALL)
    most = max(2 * slots, math.ceil(slots * ahead_seconds / max(call_seconds, _SHORTEST_CALL)))
    return max(2, min(most, 2 * math.ceil(during_claim) + 2))


def claim_at(lookahead_: int) -> int:
    """How many must be missing from the queue before a claim is made: half of `lookahead`."""
    return max(1, -(-lookahead_ // 2))


def calls_left(started: Iterable[float], call_seconds: float, now: float) -> list[float]:
    """Each call in flight's expected seconds left (negative once it is overdue): calls take `call_seconds`
    (the measured average) from when they `started`."""
    return [start + call_seconds - now for start in started]


def claim_horizon(claim_seconds: float, margin: float) -> float:
    """How far ahead a claim made now looks for calls that will have answered when it lands: its round trip
    (twice the average claim) and a margin."""
    return 2 * claim_seconds + margin


def ending_soon(seconds_left: Iterable[float], horizon: float) -> tuple[int, float]:
    """Of the calls in flight (each one's expected seconds left), how many answer within `horizon` (the next
    claim's round trip), and in how many seconds the next of the others comes within it (inf if none)."""
    soon, next_in = 0, math.inf
    for left in seconds_left:
        if left <= horizon:
            soon += 1
        else:
            next_in = min(next_in, left - horizon)
    return soon, next_in


def free_when_claimed(idle: int, soon: int, lookahead_: int, queued: int) -> int:
    """What a claim made now should bring: the runners idle, those whose calls answer by the time it lands,
    and `lookahead` more, less what is queued."""
    return idle + soon + lookahead_ - queued


def wanted(idle: int, soon: int, lookahead_: int, queued: int, most: int) -> int:
    """What a claim made now should bring (`free_when_claimed`), never more than can start in time
    (`most`, from `can_start_in_time`)."""
    return min(free_when_claimed(idle, soon, lookahead_, queued), most)


def waiting_for_a_runner(queued: int, slots: int, busy: int) -> int:
    """Claimed requests no runner is free for: those queued beyond the idle runners (a lease grows for
    them)."""
    return queued - (slots - busy)


def holding(over_since: float | None, now: float, longest_call: float) -> bool:
    """Whether a lease's runners start no new call: the model went over its cap at `over_since` (None while
    it is within it), and calls running then may still be running: for at most the longest a call can take
    (`longest_call`, the backend timeout); slots held over the cap past it are a dead worker's."""
    return over_since is not None and now - over_since < longest_call


def can_start_in_time(open_slots: int, seconds_to_deadline: float, calls_left: Iterable[float],
                      call_seconds: float, queued: int) -> int:
    """How many more requests the open slots can start before the deadline, past what is queued: their time
    left less what the calls in flight (each one's expected seconds left) still take of it, in calls. Work
    claimed beyond it would be handed back at the end (each one then waits as a retry, claimed and written
    alone)."""
    left = open_slots * seconds_to_deadline - sum(max(0.0, call) for call in calls_left)
    return math.floor(max(0.0, left) / max(call_seconds, _SHORTEST_CALL)) - queued


def claim_floor(open_slots: int, quantum: int, lanes_seen: int, ahead_most: float = math.inf) -> int:
    """The smallest claim worth making: claims cost the same whatever their size (each makes a group, whose
    close costs the same), so at least a batch's share of the slots (a round while one batch has work; while
    many do, the dispatcher gives each lane it serves a whole quantum whatever this asks for), but no more of
    it than `ahead_most` (what the slots run in `ahead_seconds`) past a quantum: work claimed beyond what is
    missing waits in the pump's queue, and a round of long calls queued there made a batch that arrived
    meanwhile wait a whole round before its first claim."""
    return max(1, min(quantum, open_slots), min(open_slots // max(1, lanes_seen), ahead_most))


@dataclass(frozen=True)
class Queued:
    """A claimed request waiting in a pump's queue, as the choice of the next one sees it: its batch (None
    for a retry), its account and its rank among its account's batches."""

    batch: Hashable | None
    account: Hashable
    rank: int = 1


def next_to_run(queued: Sequence[Queued], running: dict, served: dict | None = None) -> int:
    """Which queued request (its place) a runner that is free starts next: a retry first (it has waited its
    turn already); else, of each account's batches in the queue only those of its highest priority, the
    batch that has been `served` least (calls started in this pump, counted from its arrival: see
    `served_at_arrival`), then the one with the fewest calls `running`, its first queued request (ties: the
    first queued). So work claimed ahead for a large batch does not hold back the work claimed after it for
    a batch that has just arrived, and that batch is owed the starts the calls running when it came still
    take: its share since its arrival is even, not only its share from the moment its work is queued.
    Without `served`, by calls running alone. 0 for an empty queue."""
    top: dict = {}
    for item in queued:
        if item.batch is None:
            continue
        top[item.account] = max(top.get(item.account, item.rank), item.rank)
    best, best_key = 0, None
    for i, item in enumerate(queued):
        if item.batch is None:
            return i
        if item.rank < top[item.account]:
            continue
        key = (served.get(item.batch, 0) if served is not None else 0, running.get(item.batch, 0))
        if best_key is None or key < best_key:
            best, best_key = i, key
    return best


def served_at_arrival(served: dict, running: dict, created: dict, batch: Hashable,
                      ended_since: dict | None = None, left_with: int | None = None) -> int:
    """Where the count of starts (`served`: batch -> calls started in this pump) of `batch` begins when its
    work arrives in a pump: at the least any batch already there had been served before `batch` came,
    counting as service after it only for batches created before it (`created`: batch -> when; two created
    at the same moment arrived together; 0 when none is there) their calls still running and those that
    ended since it came (`ended_since`: batch -> how many; see `arrival_moment`). Those calls are service
    the older batches receive after its arrival, so a batch created later is owed that many starts before
    the runners alternate: fair queuing by service since arrival. Its work reaches a pump a claim after it
    was created, often once the calls running at its creation have ended: counted at the work's arrival
    alone, a batch created as a wave of another's calls began was owed nothing for that wave. A batch
    created earlier (its work merely reached this pump later) is owed nothing: it alternates at once. A
    batch coming back (its work here ran out a moment, and its count went) starts no lower than the count it
    `left_with`: leaving makes it owed nothing, and the starts the others are still owed stay theirs (at
    the others' level, a large batch whose queued work a newcomer's had outrun took every other start
    again)."""
    if not served:
        return 0 if left_with is None else left_with
    mine = created.get(batch, 0)
    ended = ended_since or {}
    level = min(count - ((running.get(other, 0) + ended.get(other, 0)) if created.get(other, 0) < mine else 0)
                for other, count in served.items())
    return level if left_with is None else max(level, left_with)


def arrival_moment(created: float, now: float, first_here: bool, memory: float) -> float:
    """When a batch whose work arrives in a pump now came, for `served_at_arrival`: when it was `created`, the
    first time its work reaches this pump, but no further back than the pump remembers its calls' ends
    (`memory` seconds: a batch whose work comes later than that waited for something else than the calls
    it finds, and is owed at most those of the last `memory` seconds); `now` when it comes back (its work
    here ran out and its count went): a batch that comes and goes is owed no more than what runs when it
    comes back."""
    return max(created, now - memory) if first_here else now


def ended_since(ends: Iterable[tuple[float, Hashable]], since: float) -> dict:
    """Per batch, how many of `ends` (when a call ended, its batch) came after `since`."""
    out: dict = {}
    for at, batch in ends:
        if at > since:
            out[batch] = out.get(batch, 0) + 1
    return out


def in_deficit_order(lanes: Sequence[LaneWant]) -> list[int]:
    """While slots go a quantum per lane and every lane with work was read: the order the lanes take their
    turns in (their places in `lanes`), the batches holding fewest slots first (ties: the ring's order, as
    `lanes` are given). A batch that arrived late holds none while the others hold what they run and what
    was claimed ahead for them: it takes the turns until it holds as many, as the water-fill gives it slots,
    but a quantum at a time (turns in the ring's order alone gave it every other claim: half of the model
    from the moment it was first claimed, a round late). In a pump's claim, the lowest `standing` first."""
    return sorted(range(len(lanes)), key=lambda i: (lanes[i].level, lanes[i].held))


def standing_in_pump(served: dict, queued: dict) -> dict:
    """Where each batch with work in a pump stands for its next claim: its starts there (`served`, counted
    from its arrival) and its requests queued there, which its runners start before any claimed now. A claim
    gives its turns (or slots) to the lowest first, the work the runners would pick next: by the slots a
    batch holds alone, a batch owed starts since its arrival (it holds as many as the others, or more, while
    it takes them) lost its turn to a batch with fewer slots, and the runners, finding none of its work
    queued, started the other's."""
    return {batch: count + queued.get(batch, 0) for batch, count in served.items()}


def should_claim(want: int, at: int, queued: int, idle: bool = False) -> bool:
    """Claim now: `at` or more are missing, or some are and nothing is queued (runners would idle), unless
    the pump is `idle` (nothing claimed last time: it waits for `at`)."""
    return want >= at or (want > 0 and queued == 0 and not idle)


def claim_size(want: int, floor: int, most: int) -> int:
    """How many to ask a claim for: what is wanted, at least the floor, never more than can start in time."""
    return min(max(want, floor), most)


def give_back(in_flight: int, cap: int, mine: int, over_share: float) -> int:
    """How many of its `mine` slots a lease gives back when the model holds `in_flight` over its `cap`: its
    share of the excess (every holder gives back its own), but never below its part of the cap as things
    stood when the model went over (`over_share`): the slots other leases are giving back still count in
    `in_flight` until their calls end, and a lease that read them as held would give the floor's slots back
    too. 0 when the model is within its cap."""
    if in_flight <= cap or mine <= 0:
        return 0
    share = math.ceil((in_flight - cap) * mine / in_flight)
    keep = math.floor(cap * over_share)
    return max(0, min(share, mine - keep))


def slots_to_take(wanted: int, cap: int, in_flight: int) -> int:
    """How many free slots of the budget to take for `wanted` more (a new lease, or a lease growing)."""
    return min(wanted, cap - in_flight)


def moving_average(average: float, sample: float, weight: float) -> float:
    return average + weight * (sample - average)


def noted_call_seconds(noted: float | None, mean: float, calls: int, weight: float) -> float:
    """The model's call time to note after `calls` more calls that took `mean` seconds on average: the noted
    value moved as the moving average would have moved had it taken each call in (`weight` per call), so a
    short batch teaches almost as much as its calls say, and one slow call among many moves it a little.
    Nothing noted yet (or too old to count): the calls' mean."""
    if noted is None:
        return mean
    if calls <= 0:
        return noted
    return noted + (1 - (1 - weight) ** calls) * (mean - noted)


# --- Background walks -------------------------------------------------------------------------------------

_T = TypeVar("_T")


def walk_order(items: Sequence[_T], key: Callable[[_T], str], failed_last: Iterable[str], turn: int) -> list[_T]:
    """The order a background walk (the sweeper's batches, leases, relays, purges) takes its items in: from a
    start that moves one item on each turn, with the items whose step raised the last time at the end. One
    broken item never stands in front of all the others at every run, and a run that is cut short by its
    deadline does not always leave the same items for the next."""
    failed = set(failed_last)
    if not items:
        return []
    start = turn % len(items)
    rotated = [*items[start:], *items[:start]]
    return [i for i in rotated if key(i) not in failed] + [i for i in rotated if key(i) in failed]
