"""The ledger: every change of a request's state, with the counters it moves, written atomically.

Each write is one DynamoDB transaction fenced by the request's current state and token, so a duplicate
SQS delivery, a worker that lost its lease or a second dispatcher loses the condition instead of
recording an outcome twice. Slots (model and account `in_flight`) are taken and given back in the same
transactions, so budgets can never drift from the requests that hold them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .domain import RequestState, Stop, counts_as_failed_unstarted, new_token, unstarted_error
from .layout import LEASE_DUE, account_key, batch_key, lane_key, model_budget_key, request_key, retry_due, usage_key
from .runtime import Services
from .service.accounts import utc_day

SLOT_HOLDERS = (RequestState.DISPATCHED, RequestState.RUNNING)


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


def _model_ops(svc: Services, req: dict, held: bool, outcome: RequestState) -> list[dict]:
    """The model's counters this change moves: the slot it gives back, and `waiting` (how many requests
    wait for a retry, so that dispatchers only look for due retries when there are any)."""
    adds: dict[str, int] = {}
    if held:
        adds["in_flight"] = -1
    waiting_now = req["state"] == RequestState.WAITING.value
    if outcome is RequestState.WAITING and not waiting_now:
        adds["waiting"] = 1
    elif waiting_now and outcome is not RequestState.WAITING:
        adds["waiting"] = -1
    if not adds:
        return []
    return [svc.table.op_update(*model_budget_key(req["model"]), "ADD " + ", ".join(f"{k} :{k}" for k in adds),
                                vals={f":{k}": v for k, v in adds.items()})]


def _release_ops(svc: Services, req: dict) -> list[dict]:
    return [svc.table.op_update(*account_key(req["account_id"]), "ADD in_flight :m", vals={":m": -1})]


def settle(svc: Services, req: dict, outcome: Settlement, stop: Stop | None = None) -> None:
    """Move a request from its current state (and token) to `outcome.to`, with every counter it moves."""
    now = svc.now()
    t = svc.table
    held = RequestState(req["state"]) in SLOT_HOLDERS
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

    adds: dict[str, float] = {}
    if held:
        adds["in_flight"] = -1
    final = outcome.to in (RequestState.COMPLETED, RequestState.FAILED, RequestState.UNSTARTED)
    if final:
        adds["#open"] = -1
    if outcome.to is RequestState.COMPLETED:
        adds["completed"] = 1
    elif outcome.to is RequestState.FAILED or (outcome.to is RequestState.UNSTARTED
                                                and counts_as_failed_unstarted(stop)):
        adds["failed"] = 1
    for name in ("input_tokens", "output_tokens", "cost_usd", "cost_unknown", "result_bytes"):
        value = getattr(outcome, name)
        if value:
            adds["cost_unknown_attempts" if name == "cost_unknown" else name] = value
    if adds:
        ops.append(t.op_update(*batch_key(req["batch_id"]),
                               "ADD " + ", ".join(f"{k} :{k.lstrip('#')}" for k in adds),
                               vals={f":{k.lstrip('#')}": v for k, v in adds.items()}))
    ops += _model_ops(svc, req, held, outcome.to)
    if held:
        ops += _release_ops(svc, req)
    if outcome.cost_usd:
        ops.append(t.op_update(*usage_key(req["account_id"], utc_day(now)), "ADD cost_usd :c SET #ttl = :ttl",
                               vals={":c": outcome.cost_usd, ":ttl": now + 3 * 86400}))
    t.transact(ops)


def start(svc: Services, req: dict) -> dict:
    """dispatched -> running: the worker is about to call the backend. Returns the new request.

    Fenced against its batch stopping: a request that has not started by the time its batch is cancelled,
    failed or out of its window must not start, even if the worker checked a moment earlier."""
    now = svc.now()
    t = svc.table
    running = {**req, "state": RequestState.RUNNING.value, "attempt": int(req.get("attempt", 0)) + 1,
               "due_at": now + svc.settings.lease_seconds, "started_at": now, "token": new_token()}
    batch_condition = "attribute_not_exists(#stop) AND attribute_not_exists(deleting)"
    batch_vals: dict = {}
    if int(req.get("attempt", 0)) == 0:  # the window only stops requests from starting
        batch_condition += " AND expires_at > :now"
        batch_vals[":now"] = now
    t.transact([
        t.op_update(*request_key(req["batch_id"], req["index"]),
                    "SET #state = :running, attempt = :attempt, due_at = :lease, started_at = :now, "
                    "#token = :newtoken",
                    vals={":running": running["state"], ":attempt": running["attempt"], ":lease": running["due_at"],
                          ":now": now, ":expect": RequestState.DISPATCHED.value, ":token": req["token"],
                          ":newtoken": running["token"]},
                    condition="#state = :expect AND #token = :token"),
        t.op_check(*batch_key(req["batch_id"]), batch_condition, vals=batch_vals or None),
    ])
    return running


def _take_ops(svc: Services, model_id: str, account_id: str, k: int, model_cap: int, account_cap: int,
              from_waiting: bool = False) -> list[dict]:
    t = svc.table
    vals = {":k": k, ":cap": model_cap - k}
    if from_waiting:
        vals[":w"] = -k
    return [
        t.op_update(*model_budget_key(model_id), "ADD in_flight :k" + (", waiting :w" if from_waiting else ""),
                    vals=vals, condition="attribute_not_exists(in_flight) OR in_flight <= :cap"),
        t.op_update(*account_key(account_id), "ADD in_flight :k", vals={":k": k, ":cap": account_cap - k},
                    condition="attribute_not_exists(in_flight) OR in_flight <= :cap"),
    ]


def claim_from_lane(svc: Services, batch: dict, model_id: str, positions: list[Position], lane_next: int,
                    model_cap: int, account_cap: int) -> list[dict]:
    """Dispatch the lane's next positions: take slots, advance the lane, create their request states."""
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
    ops += _take_ops(svc, model_id, batch["account_id"], k, model_cap, account_cap)
    requests = []
    for p in positions:
        pk, sk = request_key(batch["id"], p.index)
        req = {"pk": pk, "sk": sk, "batch_id": batch["id"], "index": p.index, "custom_id": p.custom_id,
               "model": model_id, "account_id": batch["account_id"], "offset": p.offset, "length": p.length,
               "state": RequestState.DISPATCHED.value, "token": new_token(), "attempt": 0,
               "due_pk": LEASE_DUE, "due_at": now + svc.settings.lease_seconds, "created_at": now}
        requests.append(req)
        ops.append(t.op_put(req, condition="attribute_not_exists(pk)"))
    if lane_next + k >= lane["total"]:
        ops.append(t.op_delete(*lane_key(model_id, batch["created_at"], batch["id"])))
    t.transact(ops)
    return requests


def claim_retry(svc: Services, req: dict, model_cap: int, account_cap: int) -> dict:
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
    ops += _take_ops(svc, req["model"], req["account_id"], 1, model_cap, account_cap, from_waiting=True)
    t.transact(ops)
    return {**req, "state": RequestState.DISPATCHED.value, "token": token}


def queue_message(req: dict) -> dict:
    return {k: req[k] for k in ("batch_id", "index", "token", "model")}
