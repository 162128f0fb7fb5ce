"""Intake: a validated batch, whatever its source (inline JSON, an input file, a Message Batch), becomes a
stored batch: bodies and index in S3, the batch, its lanes, the account's unfinished counts and the
Idempotency-Key in one DynamoDB transaction. Nothing is stored for a batch that is refused.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, replace

from ...errors import Conflict, Gone, InvalidRequest, PermissionDenied, RateLimited
from ...jsontext import DuplicateKey
from ...jsontext import loads as read_json
from ...layout import (
    INDEX_CHUNK,
    IndexEntry,
    batch_prefix,
    file_object,
    index_object,
    input_file_copy,
    lane_object,
    requests_object,
)
from ...protocols import Protocol
from ...records import Account, Batch, BatchExtras, BatchItem, Idempotency, Lane
from ...runtime import Services
from ...scheduling.prefix_order import prefix_waves, worth_ordering
from ...spending import CAP_PARAM, output_bound
from ...storage.dynamo import ConditionFailed, ItemTooLarge
from ..accounts import Principal, quota_used_up
from ..lifecycle import fail_validation
from ..offloading import execution
from .prefix_key import prefix_key
from .validation import (
    UNPAIRED_SURROGATE,
    RejectedRequest,
    ValidatedBatch,
    ValidRequest,
    duplicate_key_fault,
    holds_unpaired_surrogate,
    validate_file_lines,
)


class BatchTooLarge(Exception):
    """A batch of more requests than an account may have unfinished at all: refused before anything is
    stored, as a full account's batch is (429 `too_many_requests`)."""

    def __init__(self, total: int, limit: int) -> None:
        super().__init__(f"{total} requests, over the unfinished-request limit of {limit}")
        self.total = total
        self.limit = limit


@dataclass(frozen=True)
class IdempotencyClaim:
    """An Idempotency-Key and the hash of the request it came with."""

    key: str
    body_hash: str


def check_idempotency_key(key: str | None) -> None:
    if key is None:
        return
    if not 1 <= len(key) <= 255 or not all(0x20 <= ord(c) <= 0x7E for c in key):
        raise InvalidRequest("The Idempotency-Key header must be 1-255 printable ASCII characters.",
                             param="Idempotency-Key")


def body_hash(payload: object) -> str:
    """The hash of a request body, independent of key order and spacing (what a replay must match)."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_json_body(raw: bytes) -> object:
    """A create call's body, parsed; anything JSON (or UTF-8) cannot hold is the caller's 400."""
    try:
        payload = read_json(raw) if raw.strip() else None
    except DuplicateKey as twice:
        message, param = duplicate_key_fault(twice)
        raise InvalidRequest(message, code="duplicate_key", param=param) from None
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("The body is not valid JSON.") from None
    except RecursionError:
        raise InvalidRequest("The body is nested too deeply.") from None
    if holds_unpaired_surrogate(raw, payload):
        raise InvalidRequest(UNPAIRED_SURROGATE)
    return payload


def open_create(svc: Services, principal: Principal, raw: bytes, idem_key: str | None, protocol: Protocol
                ) -> tuple[object, IdempotencyClaim | None, BatchItem | None]:
    """The first steps of every create call (its body within the size limit already: the route's
    `api.bodies.body_within`): the Idempotency-Key, the parsed body, and the batch an earlier call with the
    same key and body created (a replay), if any. The protocol is part of
    what a replay must match (where its batches carry `api`), so one key cannot answer for two kinds of
    batch."""
    check_idempotency_key(idem_key)
    payload = parse_json_body(raw)
    try:
        digest = body_hash({"api": protocol.name, "body": payload} if protocol.api_field else payload)
    except RecursionError:
        raise InvalidRequest("The body is nested too deeply.") from None
    claim = IdempotencyClaim(idem_key, digest) if idem_key else None
    return payload, claim, replay(svc, principal, claim) if claim else None


def replay(svc: Services, principal: Principal, claim: IdempotencyClaim) -> BatchItem | None:
    """The batch an earlier call with this Idempotency-Key created, or None if the key is new."""
    record = Idempotency.get(svc.table, principal.account_id, claim.key)
    if record is None or (record.get("ttl") and record["ttl"] <= svc.now()):
        return None
    if record["body_hash"] != claim.body_hash:
        raise Conflict("This Idempotency-Key was already used for a different request.",
                       code="idempotency_key_reused")
    batch = Batch.get(svc.table, record["batch_id"])
    if record.get("deleted") or batch is None or batch.get("deleting"):
        raise Gone("The batch this Idempotency-Key created has been deleted.", code="batch_deleted")
    return batch


def admit(svc: Services, principal: Principal) -> None:
    """Whether the account may create a batch at all right now."""
    account = principal.account
    if not account.get("batch_access"):
        raise PermissionDenied("Your account may not create batches.", code="batch_access_denied")
    if quota_used_up(svc, account):
        raise RateLimited("Your daily quota is used up; it renews at 00:00 UTC.", code="quota_exceeded")


def store(svc: Services, principal: Principal, batch: ValidatedBatch, claim: IdempotencyClaim | None,
          protocol: Protocol, extras: BatchExtras) -> tuple[BatchItem, bool]:
    """Store a new batch of `protocol` (its kind of id, and its `api` where its batches carry one). Returns
    (batch item, created): created is False when a concurrent call with the same Idempotency-Key won the
    race and this call answers with its batch. `extras`: the fields of the batch item its API and its
    body's extensions add."""
    limits = svc.settings
    if protocol.api_field:
        extras = replace(extras, api=protocol.name)
    check_cap(svc, batch, extras)
    try:
        return _store_new_batch(svc, principal, batch, claim, extras, protocol.batch_ids.new()), True
    except (ConditionFailed, BatchTooLarge):  # a full account, or a race for the same key
        if claim:  # a concurrent call with the same key won the race
            existing = replay(svc, principal, claim)
            if existing:
                return existing, False
        check_room(svc, principal, None)
        raise RateLimited(f"This batch would take your unfinished batch requests past the limit of "
                          f"{limits.max_unfinished_requests}.", code="too_many_requests") from None


def check_cap(svc: Services, batch: ValidatedBatch, extras: BatchExtras) -> None:
    """A batch with a spending cap must bound every request's cost (400 naming the first that does not)."""
    if extras.max_cost_usd is not None and (unbounded := unbounded_under_cap(svc, batch.endpoint,
                                                                                       batch.requests)):
        raise InvalidRequest(unbounded_message(*unbounded), param=CAP_PARAM)


def check_room(svc: Services, principal: Principal, total: int | None) -> None:
    """429 when the account's unfinished batches are at their limit, or (given the batch's `total`) when its
    requests would take the unfinished requests past theirs: what storing the batch would refuse."""
    limits = svc.settings
    current = Account.get(svc.table, principal.account_id) or {}
    if current.get("unfinished_batches", 0) >= limits.max_unfinished_batches:
        raise RateLimited(f"You already have {limits.max_unfinished_batches} unfinished batches, the most "
                          "allowed. Wait for one to finish.", code="too_many_batches") from None
    if total is not None and current.get("unfinished_requests", 0) + total > limits.max_unfinished_requests:
        raise RateLimited(f"This batch would take your unfinished batch requests past the limit of "
                          f"{limits.max_unfinished_requests}.", code="too_many_requests")


def unbounded_under_cap(svc: Services, endpoint: str, requests: list) -> tuple[int, ValidRequest] | None:
    """The first request whose cost has no worst case (no output limit of its own or in the catalog, or
    input that is not text), with its position: a batch with a spending cap cannot run it."""
    for i, req in enumerate(requests):
        if isinstance(req, ValidRequest) and output_bound(svc.catalog.get(req.model_id), endpoint, req.body) is None:
            return i, req
    return None


def unbounded_message(i: int, req: ValidRequest) -> str:
    return (f"max_cost_usd: requests[{i}] (custom_id '{req.custom_id}') has no worst-case cost: set its "
            "max_tokens (or max_completion_tokens, max_output_tokens), since model "
            f"'{req.model_id}' has no output limit in the catalog, and send text only (the tokens of images, "
            "audio and documents do not follow from their size).")


@dataclass(frozen=True)
class StoredRequests:
    """What `write_requests` stored: each model's positions in the order its lane runs them, and whether
    any lane is in prefix order (`lane_ordered` on the batch: its lane object is read even when alone)."""

    lanes: dict[str, list[int]]
    ordered: bool


def write_requests(svc: Services, batch_id: str, requests: list[ValidRequest | RejectedRequest],
                   endpoint: str) -> StoredRequests:
    """The batch's requests in S3: bodies as one object (one PUT, not one write per request) and the index
    chunks; request state is created only when requests are dispatched, so storing 50,000 requests stays
    far inside 30 s. A request rejected at intake keeps only its error, in its index entry, and joins no
    lane. Each lane's positions are in the order they run: as they came, or, on a model with a prompt cache,
    in waves of prefixes (scheduling.prefix_order); the bodies are stored in that order too, lane by lane
    (the index, in submission order, says where each one is)."""
    lines: dict[int, bytes] = {}
    keys: dict[int, str | None] = {}
    lanes: dict[str, list[int]] = {}
    for position, req in enumerate(requests):
        if isinstance(req, ValidRequest):
            lines[position] = json.dumps({"custom_id": req.custom_id, "body": req.body},
                                         separators=(",", ":")).encode() + b"\n"
            keys[position] = prefix_key(endpoint, req.body)  # what a prompt cache would share of it
            lanes.setdefault(req.model_id, []).append(position)
    ordered = False
    for model_id, positions in lanes.items():  # each lane in waves of prefixes, where its model has a cache
        model = svc.catalog.get(model_id)
        prefixes = [keys[position] for position in positions]
        if model.cache_kind != "off" and worth_ordering(prefixes):
            lanes[model_id] = [positions[i] for i in prefix_waves(prefixes, model.batch_budget)]
            ordered = True
    # The bodies in the order their lanes run (submission order for a lone lane as it came): the members of
    # a group, consecutive in their lane, lie together, and a group's bodies are one ranged read.
    offsets, offset = {}, 0
    for positions in lanes.values():
        for position in positions:
            offsets[position] = offset
            offset += len(lines[position])
    svc.blobs.put(requests_object(batch_id), b"".join(lines[p] for ps in lanes.values() for p in ps),
                  "application/x-ndjson")
    index = []
    for position, req in enumerate(requests):
        if isinstance(req, RejectedRequest):
            index.append(IndexEntry(req.custom_id, None, 0, 0, req.error))
        else:
            # Then the most output tokens it can be charged for (a spending cap's worst case), and last its
            # prefix key.
            index.append(IndexEntry(req.custom_id, req.model_id, offsets[position], len(lines[position]),
                                    output_bound(svc.catalog.get(req.model_id), endpoint, req.body), keys[position]))
    for chunk in range(0, len(index), INDEX_CHUNK):
        svc.blobs.put(index_object(batch_id, chunk // INDEX_CHUNK),
                      json.dumps(index[chunk:chunk + INDEX_CHUNK], separators=(",", ":")).encode())
    if ordered or len(lanes) > 1 or sum(map(len, lanes.values())) < len(requests):  # else 0..n-1
        for model_id, positions in lanes.items():
            svc.blobs.put(lane_object(batch_id, model_id), json.dumps(positions).encode())
    return StoredRequests(lanes, ordered)


def _store_new_batch(svc: Services, principal: Principal, batch: ValidatedBatch, claim: IdempotencyClaim | None,
                     extras: BatchExtras, batch_id: str) -> BatchItem:
    s = svc.settings
    now = svc.now()
    if len(batch.requests) > s.max_unfinished_requests:
        raise BatchTooLarge(len(batch.requests), s.max_unfinished_requests)  # before anything is stored
    stored = write_requests(svc, batch_id, batch.requests, batch.endpoint) if batch.requests else None
    lanes = stored.lanes if stored else {}
    rejected = sum(isinstance(r, RejectedRequest) for r in batch.requests)
    if extras.input_file_id is not None:  # the batch's own copy: deleting the upload must not affect it
        svc.blobs.copy(file_object(extras.input_file_id), input_file_copy(batch_id))
    item = Batch.new(batch_id=batch_id, account_id=principal.account_id, key_hash=principal.key_hash,
                     endpoint=batch.endpoint, now=now,
                     expires_at=now + (batch.window_seconds or s.batch_completion_window_seconds),
                     metadata=batch.metadata, lanes={m: len(p) for m, p in lanes.items()},
                     # Wall-clock microseconds, not the (injectable) service clock: only the order matters here.
                     owner_created_us=time.time_ns() // 1000,
                     idempotency_key=claim.key if claim else None, extras=extras, rejected=rejected,
                     status=batch.status)
    if stored and stored.ordered:
        item["lane_ordered"] = True
    t = svc.table
    ops = [Batch.create(t, item),
           Account.reserve_unfinished(t, principal.account_id, item["total"], s.max_unfinished_batches,
                                      s.max_unfinished_requests)]
    held, job_ops = execution.plan(svc, item, {m: len(p) for m, p in lanes.items()}, now)  # provider batch tiers
    ops += [Lane.create(t, model_id, item) for model_id in lanes if model_id not in held] + job_ops
    if claim:
        ops.append(Idempotency.claim(t, principal.account_id, claim.key, batch_id, claim.body_hash, now))
    try:
        t.transact(ops)
    except ConditionFailed:
        svc.blobs.delete_prefix(batch_prefix(batch_id))
        raise
    except ItemTooLarge:  # not expected: what a create stores of its input is bounded (metadata, webhook_url)
        svc.blobs.delete_prefix(batch_prefix(batch_id))
        raise InvalidRequest("The batch's fields (metadata, webhook_url and the like) are too large to store; send "
                             "shorter ones.") from None
    return item


# --- Batches from a file: validated after the create call, by the sweeper ------------------------------

def validate_file_batch(svc: Services, batch: BatchItem) -> str:
    """Read a file batch's input (its own copy), check every line, and either admit its requests (they
    may be dispatched from then on) or fail the batch listing every problem, with nothing run. Safe to
    run twice: both outcomes are fenced on the batch still awaiting validation. Returns what happened."""
    data = svc.blobs.get(input_file_copy(batch["id"]))
    if data is None:
        problems = [{"code": "file_not_found", "message": "The input file could not be read.", "param": None,
                     "line": None}]
        return "failed" if fail_validation(svc, batch, problems) else "stale"
    account = Account.get(svc.table, batch["account_id"]) or {}
    requests, problems = validate_file_lines(svc, account, batch["endpoint"], data)
    if not problems and batch.get(CAP_PARAM) is not None and (
            unbounded := unbounded_under_cap(svc, batch["endpoint"], requests)):
        problems = [{"code": "invalid_request", "param": CAP_PARAM, "line": None,
                     "message": unbounded_message(*unbounded).replace(f"requests[{unbounded[0]}]",
                                                                      f"the file's request {unbounded[0] + 1}")}]
    if problems:
        return "failed" if fail_validation(svc, batch, problems) else "stale"
    stored = write_requests(svc, batch["id"], requests, batch["endpoint"])
    lanes = stored.lanes
    t = svc.table
    for _ in range(3):
        # A paused batch gets no lanes yet: its resume creates them.
        paused = bool(batch.get("paused_at"))
        ops = [Batch.validated(t, batch["id"], {m: len(p) for m, p in lanes.items()}, svc.now(), paused=paused,
                               seen=batch, ordered=stored.ordered),
               Account.reserve_requests(t, batch["account_id"], len(requests), svc.settings.max_unfinished_requests)]
        held, job_ops = execution.plan(svc, batch, {m: len(p) for m, p in lanes.items()}, svc.now())
        ops += job_ops + ([] if paused else [Lane.create(t, model_id, batch) for model_id in lanes
                                             if model_id not in held])
        try:
            t.transact(ops)
            return "validated"
        except ConditionFailed:
            current = Batch.get(t, batch["id"])
            if current is None or not current.get("awaiting_validation") or current.get("stop"):
                return "stale"  # validated by another run, or cancelled meanwhile: the sweeper settles it
            if bool(current.get("paused_at")) == paused and current.get("priority") == batch.get("priority"):
                break
            batch = current  # paused, resumed or given another priority meanwhile: again, as it is now
    else:
        return "stale"  # paused and resumed over and over: the next sweep validates it
    problems = [{"code": "too_many_requests", "param": None, "line": None,
                 "message": f"The file's {len(requests)} requests would take your unfinished batch "
                            f"requests past the limit of {svc.settings.max_unfinished_requests}."}]
    return "failed" if fail_validation(svc, current, problems) else "stale"
