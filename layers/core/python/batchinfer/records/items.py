"""The shapes of the items the service keeps (what each holds; DynamoDB adds nothing): the batch with its
lanes, its groups and requests, a file, an upload."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict


class LaneState(TypedDict):
    next: int  # the lane's next undispatched position
    total: int


class BatchItem(TypedDict, total=False):
    pk: str
    sk: str
    id: str
    account_id: str
    key_hash: str  # the key that created it: the worker re-checks it before every attempt
    endpoint: str
    status: str  # BatchStatus
    created_at: int
    expires_at: int  # the completion window: requests may start until then
    metadata: dict | None
    total: int
    lanes: dict[str, LaneState]  # model id -> lane progress
    lane_ordered: bool  # its lanes run in prefix order: each has a lane object, even when it is alone
    completed: int
    failed: int
    rejected: int  # requests that failed at intake (a Message Batch's invalid ones): in no lane, never run
    unstarted: int  # requests that never ran because the batch stopped (cancelled, expired, failed)
    open: int  # requests dispatched and not yet final
    in_flight: int  # requests holding a slot
    input_tokens: int
    output_tokens: int
    cost_usd: float
    cost_unknown_attempts: int
    result_bytes: int
    owner_pk: str  # by_owner index
    owner_sk: str
    active_pk: str  # by_active index, while unfinished
    active_sk: str
    idempotency_key: str | None
    stop: str  # Stop, once the batch stopped starting requests
    deleting: bool
    export_object: str  # output.jsonl written to S3 when the batch ended large
    retry_count: int  # how many times the batch was retried in place (service.steering.retry)
    retrying: dict  # while a retry re-queues its requests: the filter, the walk's cursor, what it replaces
    parked: str  # Stop under which its never-dispatched requests ended, when a retry left them as they were
    window_seconds: int  # once retried: its completion window's length, which each retry opens anew
    retried_at: int  # when it was last retried
    keep_until: int  # once retried: the latest its retention may end (its first request items' TTL less a day)
    unstarted_by: dict  # an ended retried batch: its never-run requests per Stop (its runs may have ended apart)
    pause_walk: dict  # while a pause or resume walks its waiting requests: the walk's id, kind and cursor
    # Its extension fields, set when it is created (`BatchExtras`):
    api: str  # the batch API that created it, where its batches carry one (a Message Batch's)
    anthropic_version: str  # a Message Batch's API version (its protocol's own field)
    priority: str
    webhook_url: str
    max_cost_usd: float  # its spending cap; committed_usd is what its started requests may cost at most
    committed_usd: float
    input_file_id: str  # a batch from a file: its lines are checked after create answers
    awaiting_validation: bool
    output_expires_after: int
    execution: str  # how its models' parts run (service.offloading.execution), where the create body said
    saved_usd: float  # what its requests run on a provider's batch tier saved against the model's price
    offloaded: int  # its requests in provider jobs now (it settles only once none is)


@dataclass(frozen=True)
class BatchExtras:
    """A new batch's fields beyond those every batch has: what its API and its create body's extensions add.
    None: the batch has no such field."""

    priority: str
    api: str | None = None
    protocol_fields: tuple[tuple[str, str], ...] = ()  # its protocol's own (named in its package), as pairs
    webhook_url: str | None = None
    max_cost_usd: float | None = None
    input_file_id: str | None = None
    output_expires_after: int | None = None
    execution: str | None = None

    def write_into(self, item: BatchItem) -> None:
        """Set these fields of a batch item being created."""
        item["priority"] = self.priority
        if self.api is not None:
            item["api"] = self.api
        for key, value in self.protocol_fields:
            item[key] = value  # type: ignore[literal-required]  # a key its protocol declares
        if self.webhook_url is not None:
            item["webhook_url"] = self.webhook_url
        if self.max_cost_usd is not None:
            item["max_cost_usd"], item["committed_usd"] = self.max_cost_usd, 0.0
        if self.input_file_id is not None:
            item["input_file_id"], item["awaiting_validation"] = self.input_file_id, True
        if self.output_expires_after is not None:
            item["output_expires_after"] = self.output_expires_after
        if self.execution is not None:
            item["execution"] = self.execution


class GroupItem(TypedDict, total=False):
    pk: str
    sk: str
    batch_id: str
    model: str
    account_id: str
    first: int
    positions: list[list]  # [index, custom_id, offset, length(, prefix key)] per member
    state: str  # RequestState: dispatched or running
    token: str  # the lease's fence
    due_pk: str
    due_at: int  # when the lease runs out
    created_at: int
    started_at: int
    item_ttl: int  # the TTL its members' items get
    slot_lease: str  # the SlotLease its members run in, if any (they hold no budget slots of their own)
    budget_shards: dict  # without a SlotLease: how many of its members' slots came from which budget shard


class RequestItem(TypedDict, total=False):
    pk: str
    sk: str
    batch_id: str
    index: int
    custom_id: str
    model: str
    account_id: str
    offset: int  # the body's place in the batch's requests object
    length: int
    prefix: str  # its prefix key (service.creating.prefix_key), when it has one
    state: str  # RequestState
    token: str
    attempt: int
    error: dict
    # A completed request's {status_code, request_id, body_text}: body_text is the body as the backend sent
    # it; a large body is the S3 object `response_object` names instead. (Items written before bodies were
    # kept as text hold `body` as a map, or the whole response in `response_object` without `response`.)
    response: dict
    response_object: str
    due_pk: str  # a retry's or a lease's due time (by_due)
    due_at: int
    group_token: str  # for a group member: the group that wrote it
    slot_lease: str  # a retry dispatched in a SlotLease's slots
    budget_shard: int  # a retry dispatched in a slot of its own: the budget shard it came from (0 if absent)
    tally: dict  # for a group member: what its outcome adds to the counters
    earlier_attempts: int  # attempts it used before its batch was retried (service.steering.retry)
    uncounted: bool  # waiting, put off by its batch's pause: not in its model's `waiting` count until resumed
    ttl: int


class FileItem(TypedDict, total=False):
    pk: str
    sk: str
    id: str
    account_id: str
    filename: str
    purpose: str  # batch (an upload) or batch_output (a batch's output or error file)
    bytes: int
    sha256: str  # fixed when the file is complete: the ETag of every download
    created_at: int
    expires_at: int | None
    batch_id: str  # for a result file: its batch
    owner_pk: str  # by_owner index
    owner_sk: str
    ttl: int  # DynamoDB forgets the record a day after it expires


class UploadItem(TypedDict, total=False):
    pk: str
    sk: str
    id: str
    account_id: str
    filename: str
    purpose: str
    mime_type: str
    bytes: int  # declared when created: the parts it is completed from must add up to it
    created_at: int
    expires_at: int  # a pending upload is gone from then on
    status: str  # Upload.PENDING, COMPLETED or CANCELLED
    parts: dict[str, int]  # part id -> its size; its bytes are one S3 object each (layout.upload_part_object)
    received: int  # the sizes of every part added, together
    file_expires_after: int  # the file's own expires_after (seconds), if the create call gave one
    file_id: str  # once completed: the file made of its parts
    part_ids: list[str]  # once completed: the parts it was made of, in order
    ttl: int  # DynamoDB forgets the record a day after it expires
