"""A batch's estimate before it runs (an extension): what it holds (requests, input tokens counted with a
real tokenizer, the output tokens it may be charged for, its cost range at the catalog's prices) and when it
would end if submitted now, at the capacity the models have now.

When it would end. Each model runs its batches' requests in `cap` slots (the budget as interactive load
and 429s leave it), one call taking the model's measured mean latency (the pumps note it on the budget). The
batches waiting on the model (its lanes) share the slots by fair turns: the accounts alike, each within its
tier limit, then each account's lanes alike; retries already waiting go first. That is a fluid model of
the dispatcher's turns: the new batch's lane joins the others, and the time its last request ends is the
model's figure; the batch ends with its slowest model. Nothing is written: an estimate stores nothing and
counts against no quota.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from ...catalog import Model
from ...errors import InvalidRequest, RateLimited
from ...layout import account_key, batch_key, file_object
from ...records import Lane
from ...runtime import Services
from ...scheduling.capacity import effective_budget, read_budget
from ...scheduling.config import scheduler_config
from ...spending import output_limit
from ..accounts import Principal
from ..offloading.execution import TierRule
from .prefix_key import prefix_key, shared_part
from .tokenizer import DEFAULT_TOKENIZER, count_body
from .validation import RejectedRequest, ValidatedBatch, ValidRequest, problem_count, validate_file_lines

OBJECT = "batch.estimate"
ADMISSION_PARAM = "admission"  # a create body's extension field
REJECT_IF_LATE = "reject_if_late"
ADMISSIONS = ("always", REJECT_IF_LATE)
# Lanes read per model: the queue ahead past this many batches is counted as far as it was read.
MAX_LANES = 1000
BATCH_GET_KEYS = 100  # DynamoDB's most keys in one BatchGetItem
NEW = object()  # the estimated batch's own lane among the model's
# What a batch takes beyond its calls. On an idle model, its first claim reaching a worker: the dispatcher's
# turn, the queue, a worker and its pump starting (~2 s on the local stack: a 16-request batch at L=1 s ends
# 3-4 s after its create); on a busy one the running pumps claim it at their next claim. And after its last
# answer, the last group's close and the settle that ends it (~0.5 s).
IDLE_START_SECONDS = 2.0
END_SECONDS = 0.5


@dataclass
class Part:
    """Requests of one model that run one way: their count, input tokens, the output tokens they may be charged
    for (None: a request has no output limit of its own nor in the catalog) and the input a prompt cache would
    serve."""

    request_count: int = 0
    input_tokens: int = 0
    max_output_tokens: int | None = 0
    cached_input_tokens: int = 0

    def add(self, tokens: int, limit: int | None, cached: int) -> None:
        self.request_count += 1
        self.input_tokens += tokens
        self.cached_input_tokens += cached
        self.max_output_tokens = None if limit is None or self.max_output_tokens is None \
            else self.max_output_tokens + limit

    def __add__(self, other: Part) -> Part:
        outputs = None if self.max_output_tokens is None or other.max_output_tokens is None \
            else self.max_output_tokens + other.max_output_tokens
        return Part(self.request_count + other.request_count, self.input_tokens + other.input_tokens, outputs,
                    self.cached_input_tokens + other.cached_input_tokens)


@dataclass
class ModelFigures:
    """A model's part of the batch: `carried`, the requests its provider batch tier would take (a Bedrock
    job takes no tools, say), and `rest`; when the part goes to the tier (`on_tier`), `carried` is priced at
    the tier's price with no cache counted, and `rest` runs directly at the model's."""

    model: Model
    carried: Part = field(default_factory=Part)
    rest: Part = field(default_factory=Part)
    on_tier: bool = False
    # Input a prompt cache would serve: the shared part (`prefix_key`) of every request after its prefix's
    # first, where the model's backend has a cache (`prompt_cache` not off); the batch runs in the order that
    # lets it (scheduling.prefix_order).
    shared: dict = field(default_factory=dict)  # prefix key -> the tokens of its shared part

    def add(self, endpoint: str, body: dict, to_tier: bool = False) -> None:
        cached = 0
        key = prefix_key(endpoint, body) if self.model.cache_kind != "off" else None
        if key is not None:
            if key in self.shared:
                cached = self.shared[key]
            else:
                self.shared[key] = count_body(shared_part(endpoint, body), endpoint, self.tokenizer)
        (self.carried if to_tier else self.rest).add(count_body(body, endpoint, self.tokenizer),
                                                     output_limit(self.model, endpoint, body), cached)

    @property
    def whole(self) -> Part:
        return self.carried + self.rest

    @property
    def direct(self) -> Part:
        """What runs directly: all of it, unless the part goes to the tier."""
        return self.rest if self.on_tier else self.whole

    @property
    def tokenizer(self) -> str:
        return self.model.tokenizer or DEFAULT_TOKENIZER

    def cost(self) -> dict:
        direct = self.direct
        low = self.model.cost_usd(direct.input_tokens, 0, direct.cached_input_tokens)
        high = None if direct.max_output_tokens is None else self.model.cost_usd(
            direct.input_tokens, direct.max_output_tokens, direct.cached_input_tokens)
        if self.on_tier and self.model.provider_batch:  # a provider job: the tier's price, no cache counted
            tier, carried = self.model.provider_batch, self.carried
            low += tier.cost_usd(carried.input_tokens, 0)
            high = None if high is None or carried.max_output_tokens is None \
                else high + tier.cost_usd(carried.input_tokens, carried.max_output_tokens)
        return {"min": round(low, 10), "max": None if high is None else round(high, 10)}


@dataclass
class Queue:
    """A model's capacity and what waits for it now."""

    cap: int
    latency: float  # seconds per call, as measured (or the scheduler's first guess)
    measured: float | None  # the measured mean, None when none was noted
    waiting: int  # retries waiting (they go first)
    in_flight: int = 0  # batch requests running now
    lanes: list[tuple[str, int]] = field(default_factory=list)  # (account id, requests left) per batch
    limits: dict[str, int] = field(default_factory=dict)  # account id -> tier limit

    @property
    def ahead(self) -> int:
        return self.waiting + sum(left for _, left in self.lanes)


def read_queue(svc: Services, model: Model) -> Queue:
    """The model's cap, latency, retries waiting and lanes (each batch's undispatched requests), read now."""
    t = svc.table
    budget = read_budget(svc, model, consistent=False)
    cap = effective_budget(model, budget, svc.settings.interactive_yield_per_request)
    noted = budget.get("call_seconds")
    config = scheduler_config(svc.settings)
    fresh = noted is not None and svc.now() - int(budget.get("call_seconds_at", 0)) <= config.latency_fresh_seconds
    measured = float(noted) if fresh else None
    latency = measured if measured else config.first_call_seconds
    lanes, _ = Lane.in_turn(t, model.id, None, MAX_LANES)
    batches = _read_many(svc, [batch_key(lane["batch_id"]) for lane in lanes])
    accounts = _read_many(svc, [account_key(a) for a in {lane["account_id"] for lane in lanes}])
    queue = Queue(cap=cap, latency=latency, measured=measured, waiting=max(0, int(budget.get("waiting", 0))),
                  in_flight=max(0, int(budget.get("in_flight", 0))))
    for lane in lanes:
        batch = batches.get(batch_key(lane["batch_id"]))
        cursor = (batch or {}).get("lanes", {}).get(model.id) or {}
        left = int(cursor.get("total", 0)) - int(cursor.get("next", 0))
        if batch is None or batch.get("stop") or batch.get("paused_at") or left <= 0:
            continue  # a lane left behind by a stopped, paused or drained batch takes no turn
        queue.lanes.append((lane["account_id"], left))
        account = accounts.get(account_key(lane["account_id"])) or {}
        queue.limits[lane["account_id"]] = svc.settings.tier_limits.get(account.get("tier", "free"), 0)
    return queue


def coarse_count(count: int) -> int:
    """A count as another account may see it: rounded down to 0, 1, 2, 5, 10, 20, 50, 100, 200, 500, ...
    The queue ahead is every account's backlog on a model; shown exactly, successive estimates would tell one
    tenant how many requests another submitted and when. Its order of magnitude is what a user plans with."""
    if count <= 0:
        return 0
    power = 10 ** (len(str(int(count))) - 1)
    return max(step * power for step in (1, 2, 5) if step * power <= count)


def ahead_text(shown: int) -> str:
    """A coarse queue ahead in words: "no", or its lower bound ("50+")."""
    return f"{shown}+" if shown else "no"


def _read_many(svc: Services, keys: list[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    """Items by key, eventually consistent, in BatchGetItem's pages of 100 keys."""
    found: dict[tuple[str, str], dict] = {}
    for start in range(0, len(keys), BATCH_GET_KEYS):
        found.update(svc.table.get_many(keys[start:start + BATCH_GET_KEYS], consistent=False))
    return found


def _water_fill(room: float, wants: dict, caps: dict) -> dict:
    """`room` shared alike among the keys of `wants`, none past its cap (what one cannot take goes to the
    others)."""
    share: dict = {key: 0.0 for key in wants}
    open_keys = [key for key in wants if caps[key] > 0]
    while open_keys and room > 1e-9:
        each = room / len(open_keys)
        capped = [key for key in open_keys if caps[key] - share[key] <= each]
        if not capped:
            for key in open_keys:
                share[key] += each
            break
        for key in capped:
            room -= caps[key] - share[key]
            share[key] = caps[key]
        open_keys = [key for key in open_keys if key not in capped]
    return share


def seconds_to_finish(queue: Queue, account_id: str, own_limit: int, count: int) -> float:
    """How long until the last of `count` new requests of `account_id` has run on this model: fair turns
    between accounts (each within its tier limit), then between an account's lanes, at `queue.cap` slots
    of `queue.latency` seconds each; retries waiting first."""
    if count <= 0:
        return 0.0
    cap = max(queue.cap, 1)
    latency = queue.latency
    elapsed = queue.waiting * latency / cap
    lanes: list[list] = [[acc, float(left)] for acc, left in queue.lanes] + [[NEW, float(count)]]
    limits = {**queue.limits, NEW: own_limit}

    def account_of(lane: list) -> object:
        return account_id if lane[0] is NEW else lane[0]

    while True:
        live = [lane for lane in lanes if lane[1] > 1e-9]
        mine = next((lane for lane in live if lane[0] is NEW), None)
        if mine is None:
            break
        per_account: dict[object, list[list]] = {}
        for lane in live:
            per_account.setdefault(account_of(lane), []).append(lane)
        caps = {acc: own_limit if acc == account_id else limits.get(acc, cap) for acc in per_account}
        slots = _water_fill(cap, per_account, caps)
        rates = {id(lane): slots[acc] / len(held) / latency for acc, held in per_account.items() for lane in held}
        if rates[id(mine)] <= 0:
            return math.inf  # the account may run nothing on this model (a tier limit of 0)
        step = min(lane[1] / rates[id(lane)] for lane in live if rates[id(lane)] > 0)
        for lane in live:
            lane[1] -= rates[id(lane)] * step
        elapsed += step
    # The fluid model ends when the last call would, spread over the slots; real calls run whole, so the
    # last wave ends on average half a call later.
    idle = not queue.lanes and not queue.waiting and not queue.in_flight
    return elapsed + latency / 2 + END_SECONDS + (IDLE_START_SECONDS if idle else 0.0)


def estimate(svc: Services, principal: Principal, batch: ValidatedBatch,
             requests: Iterable[ValidRequest | RejectedRequest] | None = None,
             on_tier: TierRule | None = None) -> dict:
    """The estimate of `batch` (its requests, or `requests` for a file batch's lines) for `principal`.
    `on_tier`: which requests of a model's part its provider batch tier would carry, and whether the part would
    go there (its `execution`), priced there; the rest is priced as it runs, directly."""
    now = svc.now()
    endpoint = batch.endpoint
    figures: dict[str, ModelFigures] = {}
    rejected: list[dict] = []
    for req in batch.requests if requests is None else requests:
        if isinstance(req, RejectedRequest):
            rejected.append({"custom_id": req.custom_id, "error": req.error})
            continue
        if req.model_id not in figures:
            figures[req.model_id] = ModelFigures(svc.catalog.get(req.model_id))
        fig = figures[req.model_id]
        fig.add(endpoint, req.body, on_tier is not None and on_tier.carries(fig.model, endpoint, req.body))
    own_limit = svc.settings.tier_limits.get(principal.account.get("tier", "free"), 0)
    window = batch.window_seconds or svc.settings.batch_completion_window_seconds
    models, longest = [], 0.0
    for model_id, fig in figures.items():
        fig.on_tier = bool(on_tier and fig.carried.request_count and on_tier.goes(fig.model,
                                                                                  fig.carried.request_count))
        whole = fig.whole
        queue = read_queue(svc, fig.model)
        seconds = seconds_to_finish(queue, principal.account_id, own_limit, whole.request_count)
        longest = max(longest, seconds)
        models.append({
            "model": model_id, "request_count": whole.request_count, "input_tokens": whole.input_tokens,
            "cached_input_tokens": fig.direct.cached_input_tokens,
            "max_output_tokens": whole.max_output_tokens, "cost_usd": fig.cost(), "tokenizer": fig.tokenizer,
            "execution": "provider_batch" if fig.on_tier else "direct",
            "provider_batch_request_count": fig.carried.request_count if fig.on_tier else 0,
            "queue_ahead": coarse_count(queue.ahead), "batch_budget": fig.model.batch_budget,
            "batch_cap_now": queue.cap, "tier_limit": own_limit, "mean_latency_seconds": queue.measured,
            "latency_used_seconds": round(queue.latency, 4),
            "estimated_seconds": None if math.isinf(seconds) else round(seconds, 1)})
    ends = None if math.isinf(longest) else now + math.ceil(longest)
    costs = [m["cost_usd"] for m in models]
    outputs = [m["max_output_tokens"] for m in models]
    answer = {
        "object": OBJECT, "endpoint": endpoint, "created_at": now,
        "request_count": sum(m["request_count"] for m in models) + len(rejected),
        "input_tokens": sum(m["input_tokens"] for m in models),
        "cached_input_tokens": sum(m["cached_input_tokens"] for m in models),
        "max_output_tokens": None if None in outputs else sum(outputs),
        "cost_usd": {"min": round(sum(c["min"] for c in costs), 10),
                     "max": None if any(c["max"] is None for c in costs) else round(sum(c["max"] for c in costs), 10)},
        "tokenizer": ",".join(sorted({m["tokenizer"] for m in models})) or DEFAULT_TOKENIZER,
        "models": models, "completion_window_seconds": window,
        "estimated_completion_at": ends, "fits_window": ends is not None and ends <= now + window,
    }
    answer["rejected"] = rejected  # requests that would error at once (a Message Batch's: listed, not refused)
    return answer


def file_requests(svc: Services, principal: Principal, endpoint: str, file_id: str) -> list[ValidRequest]:
    """A file batch's requests, its lines checked now as its validation after create would check them: a
    400 naming the first problem (and how many there are) when that validation would fail the batch."""
    data = svc.blobs.get(file_object(file_id))
    if data is None:
        raise InvalidRequest(f"Invalid 'input_file_id': file '{file_id}' could not be read.", code="file_not_found",
                             param="input_file_id")
    requests, problems = validate_file_lines(svc, principal.account, endpoint, data)
    if problems:
        first = problems[0]
        where = f"line {first['line']}: " if first.get("line") else ""
        count = problem_count(problems)
        more = f" ({count:,} problems in all)" if count > 1 else ""
        raise InvalidRequest(f"The input file would fail validation{more}: {where}{first['message']}",
                             code=first["code"], param="input_file_id")
    return requests


def parse_admission(value: object) -> str:
    """A create body's `admission` (an extension): "always" (the default) or "reject_if_late"."""
    if value is None:
        return "always"
    if value not in ADMISSIONS:
        raise InvalidRequest(f"admission must be one of {', '.join(repr(a) for a in ADMISSIONS)}, not {value!r}.",
                             param=ADMISSION_PARAM)
    return str(value)


def refuse_if_late(answer: dict) -> None:
    """429 (not retried by the SDKs: it does not change by itself soon) when the estimated batch would not
    end within its completion window at the capacity there is now, with the estimate's figures."""
    if answer["fits_window"]:
        return
    now, ends, window = answer["created_at"], answer["estimated_completion_at"], answer["completion_window_seconds"]
    if ends is None:
        late, when = window, "never, at the capacity there is now (a tier limit of 0)"
    else:
        late, when = ends - (now + window), f"in about {ends - now} s (at {ends})"
    queue = ", ".join(f"{m['model']}: {ahead_text(m['queue_ahead'])} requests ahead, {m['batch_cap_now']} slots, "
                      f"{m['latency_used_seconds']} s a call" for m in answer["models"])
    raise RateLimited(f"This batch would not finish within its completion window of {window} s: it would end {when}, "
                      f"{late} s late ({queue}). It was not created (admission: reject_if_late); submit it later, "
                      "in smaller parts, or without admission.", code="batch_would_be_late",
                      retry_after=max(1, int(late)))
