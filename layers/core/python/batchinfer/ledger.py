"""The ledger: every change of a request's state, with the counters it moves, written atomically.

Each write is one DynamoDB transaction fenced by the request's current state and token, so a duplicate
SQS delivery, a worker that lost its lease or a second dispatcher loses the condition instead of
recording an outcome twice. Slots (model and account `in_flight`) are taken and given back in the same
transactions, so budgets can never drift from the requests that hold them.

First attempts travel in groups (a lease over up to GROUP_MAX requests of one batch): the claim, the start
and the outcome of a group are one transaction each whatever its size, and each member's result is one
plain conditional put, so a request costs a few write units rather than one transaction per change.
Retries travel alone, request by request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .domain import RequestState, Stop, counts_as_failed_unstarted, new_token, unstarted_error
from .layout import (
    LEASE_DUE,
    account_key,
    batch_key,
    group_key,
    lane_key,
    model_budget_key,
    request_key,
    retry_due,
    usage_key,
)
from .runtime import Services
from .service.accounts import utc_day

SLOT_HOLDERS = (RequestState.DISPATCHED, RequestState.RUNNING)
GROUP_MAX = 25  # requests per group (the outcome transaction of a group that never ran writes each of them)


@dataclass
class Position:
    """One undispatched request read from a batch's index."""

    index: int
    custom_id: str
    offset: int
    length: int


@dataclass
class Settlement:
    """What an ended attempt (or a decision not to run) adds to the batch."""

    to: RequestState
    error: dict | None = None
    response: dict | None = None
    response_object: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    cost_unknown: int = 0
    retry_at: int | None = None  # for WAITING
    result_bytes: int = 0  # size of a stored result, so the export knows when to go through S3
    extra: dict = field(default_factory=dict)


# The Settlement figures that add to the batch's counters (a group member's item keeps them in `tally`).
TALLIED = ("input_tokens", "output_tokens", "cost_usd", "cost_unknown", "result_bytes")


@dataclass
class Moves:
    """The counters a set of request state changes moves, summed so that one transaction writes them."""

    batch: dict[str, float] = field(default_factory=dict)
    model: dict[str, int] = field(default_factory=dict)
    account_in_flight: int = 0
    cost_usd: float = 0.0

    def add(self, was: RequestState, outcome: Settlement, stop: Stop | None) -> None:
        def bump(counters: dict, name: str, by: float) -> None:
            counters[name] = counters.get(name, 0) + by

        if was in SLOT_HOLDERS:  # the slot goes back
            bump(self.batch, "in_flight", -1)
            bump(self.model, "in_flight", -1)
            self.account_in_flight -= 1
        if outcome.to in (RequestState.COMPLETED, RequestState.FAILED, RequestState.UNSTARTED):
            bump(self.batch, "#open", -1)
        if outcome.to is RequestState.COMPLETED:
            bump(self.batch, "completed", 1)
        elif outcome.to is RequestState.FAILED or (outcome.to is RequestState.UNSTARTED
                                                    and counts_as_failed_unstarted(stop)):
            bump(self.batch, "failed", 1)
        for name in TALLIED:
            value = getattr(outcome, name)
            if value:
                bump(self.batch, "cost_unknown_attempts" if name == "cost_unknown" else name, value)
        self.cost_usd += outcome.cost_usd
        # `waiting` counts requests waiting for a retry, so that dispatchers only look for due retries
        # when there are any.
        if outcome.to is RequestState.WAITING and was is not RequestState.WAITING:
            bump(self.model, "waiting", 1)
        elif was is RequestState.WAITING and outcome.to is not RequestState.WAITING:
            bump(self.model, "waiting", -1)

    def ops(self, svc: Services, batch_id: str, model_id: str, account_id: str) -> list[dict]:
        t = svc.table
        ops = []
        for key, adds in ((batch_key(batch_id), self.batch), (model_budget_key(model_id), self.model)):
            adds = {k: v for k, v in adds.items() if v}
            if adds:
                ops.append(t.op_update(*key, "ADD " + ", ".join(f"{k} :{k.lstrip('#')}" for k in adds),
                                       vals={f":{k.lstrip('#')}": v for k, v in adds.items()}))
        if self.account_in_flight:
            ops.append(t.op_update(*account_key(account_id), "ADD in_flight :m", vals={":m": self.account_in_flight}))
        if self.cost_usd:
            now = svc.now()
            ops.append(t.op_update(*usage_key(account_id, utc_day(now)), "ADD cost_usd :c SET #ttl = :ttl",
                                   vals={":c": self.cost_usd, ":ttl": now + 3 * 86400}))
        return ops


def settle(svc: Services, req: dict, outcome: Settlement, stop: Stop | None = None) -> None:
    """Move a request from its current state (and token) to `outcome.to`, with every counter it moves."""
    now = svc.now()
    t = svc.table
    sets = ["#state = :to", "updated_at = :now", "#token = :newtoken"]
    vals: dict = {":to": outcome.to.value, ":now": now, ":expect": req["state"], ":token": req["token"],
                  ":newtoken": new_token()}
    removes = []
    if outcome.to is RequestState.WAITING:
        sets += ["due_pk = :due", "due_at = :at"]
        vals[":due"], vals[":at"] = retry_due(req["model"]), outcome.retry_at or now
    else:
        removes += ["due_pk", "due_at"]
    if outcome.to is RequestState.UNSTARTED:
        outcome.error = unstarted_error(stop)
    for name in ("error", "response", "response_object"):
        value = getattr(outcome, name)
        if value is not None:
            sets.append(f"#{name} = :{name}")
            vals[f":{name}"] = value
    for name, value in outcome.extra.items():
        sets.append(f"{name} = :x_{name}")
        vals[f":x_{name}"] = value
    expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
    ops = [t.op_update(*request_key(req["batch_id"], req["index"]), expression, vals=vals,
                       names={"#state": "state"}, condition="#state = :expect AND #token = :token")]
    moves = Moves()
    moves.add(RequestState(req["state"]), outcome, stop)
    t.transact(ops + moves.ops(svc, req["batch_id"], req["model"], req["account_id"]))


def start(svc: Services, req: dict) -> dict:
    """dispatched -> running: the worker is about to call the backend. Returns the new request.

    Fenced against its batch stopping: a request that has not started by the time its batch is cancelled,
    failed or out of its window must not start, even if the worker checked a moment earlier."""
    now = svc.now()
    t = svc.table
    running = {**req, "state": RequestState.RUNNING.value, "attempt": int(req.get("attempt", 0)) + 1,
               "due_at": now + svc.settings.lease_seconds, "started_at": now, "token": new_token()}
    t.transact([
        t.op_update(*request_key(req["batch_id"], req["index"]),
                    "SET #state = :running, attempt = :attempt, due_at = :lease, started_at = :now, "
                    "#token = :newtoken",
                    vals={":running": running["state"], ":attempt": running["attempt"], ":lease": running["due_at"],
                          ":now": now, ":expect": RequestState.DISPATCHED.value, ":token": req["token"],
                          ":newtoken": running["token"]},
                    condition="#state = :expect AND #token = :token"),
        _batch_may_start(svc, req["batch_id"], now, first_attempt=int(req.get("attempt", 0)) == 0),
    ])
    return running


def _batch_may_start(svc: Services, batch_id: str, now: int, first_attempt: bool) -> dict:
    """The check a start makes on its batch: not stopped, not being deleted, and for a first attempt the
    window still open (the window only stops requests from starting)."""
    if first_attempt:
        return svc.table.op_check(*batch_key(batch_id), "attribute_not_exists(#stop) AND attribute_not_exists("
                                  "deleting) AND expires_at > :now", vals={":now": now})
    return svc.table.op_check(*batch_key(batch_id), "attribute_not_exists(#stop) AND attribute_not_exists(deleting)")


def _take_ops(svc: Services, model_id: str, account_id: str, k: int, model_cap: int, account_cap: int,
              from_waiting: bool = False, interactive_seen: int | None = None) -> list[dict]:
    """Take k slots of the model and of the account, within their caps. `interactive_seen` is the model's
    interactive count the cap was computed from: if interactive load has grown since, the claim fails
    rather than start batch work on a cap that is already too high."""
    t = svc.table
    vals = {":k": k, ":cap": model_cap - k}
    condition = "(attribute_not_exists(in_flight) OR in_flight <= :cap)"
    if interactive_seen is not None:
        vals[":seen"] = interactive_seen
        condition += " AND (attribute_not_exists(interactive) OR interactive <= :seen)"
    if from_waiting:
        vals[":w"] = -k
    return [
        t.op_update(*model_budget_key(model_id), "ADD in_flight :k" + (", waiting :w" if from_waiting else ""),
                    vals=vals, condition=condition),
        t.op_update(*account_key(account_id), "ADD in_flight :k", vals={":k": k, ":cap": account_cap - k},
                    condition="attribute_not_exists(in_flight) OR in_flight <= :cap"),
    ]


def claim_from_lane(svc: Services, batch: dict, model_id: str, positions: list[Position], lane_next: int,
                    model_cap: int, account_cap: int, interactive_seen: int | None = None,
                    running: bool = False) -> list[dict]:
    """Dispatch the lane's next positions as groups: take their slots, advance the lane, create the groups.

    A group is one lease over up to GROUP_MAX requests: one item, one queue message, one start and one
    outcome transaction for all of them. Request items are written only when a request has an outcome.
    `running`: the claimant runs the groups itself at once, so they start now (no separate start)."""
    now = svc.now()
    t = svc.table
    k = len(positions)
    lane = batch["lanes"][model_id]
    ops = [t.op_update(
        *batch_key(batch["id"]),
        "SET lanes.#m.#next = :new, #status = :running, in_progress_at = if_not_exists(in_progress_at, :now) "
        "ADD in_flight :k, #open :k",
        vals={":new": lane_next + k, ":old": lane_next, ":running": "in_progress", ":now": now, ":k": k},
        names={"#m": model_id},
        condition="lanes.#m.#next = :old AND attribute_not_exists(#stop) AND attribute_not_exists(deleting) "
                  "AND expires_at > :now",
    )]
    ops += _take_ops(svc, model_id, batch["account_id"], k, model_cap, account_cap,
                     interactive_seen=interactive_seen)
    groups = []
    for at in range(0, k, GROUP_MAX):
        members = positions[at:at + GROUP_MAX]
        pk, sk = group_key(batch["id"], members[0].index)
        group = {"pk": pk, "sk": sk, "batch_id": batch["id"], "model": model_id, "account_id": batch["account_id"],
                 "first": members[0].index, "positions": [[p.index, p.custom_id, p.offset, p.length] for p in members],
                 "state": (RequestState.RUNNING if running else RequestState.DISPATCHED).value,
                 "token": new_token(), "due_pk": LEASE_DUE,
                 "due_at": now + svc.settings.lease_seconds, "created_at": now, "item_ttl": _items_ttl(svc, batch)}
        groups.append(group)
        ops.append(t.op_put(group, condition="attribute_not_exists(pk)"))
    if lane_next + k >= lane["total"]:
        ops.append(t.op_delete(*lane_key(model_id, batch["created_at"], batch["id"])))
    t.transact(ops)
    return groups


def _items_ttl(svc: Services, batch: dict) -> int:
    """When DynamoDB may delete the batch's request items on its own (TTL deletes cost nothing). The batch
    and its results go from the API when its retention ends (the sweeper's purge); a batch ends at most
    about an hour after its window closes (retries of requests that had started), so a day after the
    window plus the retention is always later."""
    return int(batch["expires_at"]) + svc.settings.batch_retention_seconds + 86400


def start_group(svc: Services, group: dict) -> dict:
    """dispatched -> running for a whole group, fenced against its batch stopping (see `start`)."""
    now = svc.now()
    t = svc.table
    running = {**group, "state": RequestState.RUNNING.value, "due_at": now + svc.settings.lease_seconds,
               "started_at": now, "token": new_token()}
    t.transact([
        t.op_update(group["pk"], group["sk"],
                    "SET #state = :running, due_at = :lease, started_at = :now, #token = :newtoken",
                    vals={":running": running["state"], ":lease": running["due_at"], ":now": now,
                          ":expect": RequestState.DISPATCHED.value, ":token": group["token"],
                          ":newtoken": running["token"]},
                    condition="#state = :expect AND #token = :token"),
        _batch_may_start(svc, group["batch_id"], now, first_attempt=True),
    ])
    return running


def position_item(svc: Services, group: dict, position: list, outcome: Settlement, attempt: int,
                  stop: Stop | None = None, token: str | None = None) -> dict:
    """The request item a group member's outcome creates. `tally` keeps what the outcome adds to the
    counters, so that a group whose worker died after writing it is counted from its items, once."""
    index, custom_id, offset, length = position
    now = svc.now()
    pk, sk = request_key(group["batch_id"], index)
    item = {"pk": pk, "sk": sk, "batch_id": group["batch_id"], "index": index, "custom_id": custom_id,
            "model": group["model"], "account_id": group["account_id"], "offset": offset, "length": length,
            "state": outcome.to.value, "token": token or new_token(), "attempt": attempt, "created_at": now,
            "updated_at": now, "group_token": group["token"]}
    if group.get("item_ttl"):
        item["ttl"] = group["item_ttl"]
    error = unstarted_error(stop) if outcome.to is RequestState.UNSTARTED else outcome.error
    for name, value in (("error", error), ("response", outcome.response),
                        ("response_object", outcome.response_object)):
        if value is not None:
            item[name] = value
    if outcome.to is RequestState.WAITING:
        item["due_pk"], item["due_at"] = retry_due(group["model"]), outcome.retry_at or now
    tally = {name: value for name in TALLIED if (value := getattr(outcome, name))}
    item["tally"] = {"to": outcome.to.value, **({"stop": stop.value} if stop else {}), **tally}
    return item


def tallied(item: dict) -> tuple[Settlement, Stop | None]:
    """The outcome a group member's item recorded (see `position_item`)."""
    tally = item["tally"]
    stop = Stop(tally["stop"]) if tally.get("stop") else None
    return Settlement(to=RequestState(tally["to"]), **{k: tally[k] for k in TALLIED if k in tally}), stop


def record_position(svc: Services, item: dict) -> None:
    """Write one group member's outcome. Raises ConditionFailed if the group's lease was recovered first."""
    svc.table.put(item, condition="attribute_not_exists(pk)")


def close_group(svc: Services, group: dict, written: list[dict], new: tuple[dict, ...] = ()) -> None:
    """End a group: give its slots back and add its members' outcomes to the counters, in one transaction
    fenced by the group's token. `written`: members' request items already stored; `new`: members' items
    this same transaction writes."""
    t = svc.table
    ops = [t.op_delete(group["pk"], group["sk"], condition="#state = :s AND #token = :t",
                       vals={":s": group["state"], ":t": group["token"]})]
    ops += [t.op_put(item, condition="attribute_not_exists(pk)") for item in new]
    moves = Moves()
    for item in (*written, *new):
        outcome, stop = tallied(item)
        moves.add(RequestState(group["state"]), outcome, stop)
    t.transact(ops + moves.ops(svc, group["batch_id"], group["model"], group["account_id"]))


def claim_retry(svc: Services, req: dict, model_cap: int, account_cap: int,
                interactive_seen: int | None = None) -> dict:
    """waiting -> dispatched: a request whose wait is over takes a slot again."""
    now = svc.now()
    t = svc.table
    token = new_token()
    ops = [
        t.op_update(*request_key(req["batch_id"], req["index"]),
                    "SET #state = :d, #token = :new, due_pk = :lease, due_at = :at",
                    vals={":d": RequestState.DISPATCHED.value, ":new": token, ":lease": LEASE_DUE,
                          ":at": now + svc.settings.lease_seconds, ":w": RequestState.WAITING.value,
                          ":old": req["token"]},
                    condition="#state = :w AND #token = :old"),
        t.op_update(*batch_key(req["batch_id"]), "ADD in_flight :one", vals={":one": 1},
                    condition="attribute_not_exists(#stop) AND attribute_not_exists(deleting)"),
    ]
    ops += _take_ops(svc, req["model"], req["account_id"], 1, model_cap, account_cap, from_waiting=True,
                     interactive_seen=interactive_seen)
    t.transact(ops)
    return {**req, "state": RequestState.DISPATCHED.value, "token": token}


def queue_message(unit: dict) -> dict:
    """The queue message for a dispatched group, or for one request dispatched again for a retry."""
    if "positions" in unit:
        return {"batch_id": unit["batch_id"], "group": unit["first"], "token": unit["token"], "model": unit["model"]}
    return {k: unit[k] for k in ("batch_id", "index", "token", "model")}
