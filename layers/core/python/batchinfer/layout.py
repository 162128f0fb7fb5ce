"""Where each record lives: DynamoDB keys and S3 object keys, in one place."""

from __future__ import annotations

import hashlib
import zlib
from typing import Any, NamedTuple

from . import protocols

INDEX_CHUNK = 5000  # request index entries per S3 index object

# The table's global secondary indexes, (hash key, range key) as (attribute, DynamoDB type), and what each
# projects. The local stack (storage.bootstrap) and the CDK stack both build the table from these.
INDEXES: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {
    "by_owner": (("owner_pk", "S"), ("owner_sk", "S")),
    "by_due": (("due_pk", "S"), ("due_at", "N")),
    "by_active": (("active_pk", "S"), ("active_sk", "S")),
}
# (projection type, non-key attributes). `by_owner` feeds the lists, which show whole items: ALL. The readers
# of `by_due` use only the keys (pk, sk, due_at) and read the item itself again, and the sweeper takes only
# the id from `by_active`: projecting no more means an index write is one small item, and an update that
# leaves an index's keys (and `id`) alone writes nothing to it. A reader that needs more reads the item.
INDEX_PROJECTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "by_owner": ("ALL", ()),
    "by_due": ("KEYS_ONLY", ()),
    "by_active": ("INCLUDE", ("id",)),
}
TTL_ATTRIBUTE = "ttl"  # DynamoDB deletes an item on its own once this time (epoch seconds) has passed
BATCHES_PREFIX = "batches/"  # S3: everything of a batch lies under batches/<id>/
FILES_PREFIX = "files/"  # S3: uploaded and result files
# S3: the provider batch jobs that read their input from and write their output to the service's bucket
# (Bedrock's model invocation jobs): one input file each under the first, the job's output under the second.
# Bedrock's service role reads only the first and writes only the second (infra/storage.py).
PROVIDER_JOBS_INPUT_PREFIX = "provider-jobs/in/"
PROVIDER_JOBS_OUTPUT_PREFIX = "provider-jobs/out/"


def account_key(account_id: str) -> tuple[str, str]:
    return owner_partition(account_id), "ACCOUNT"


def api_key_key(key_hash: str) -> tuple[str, str]:
    return f"KEY#{key_hash}", "KEY"


def webhook_key(account_id: str) -> tuple[str, str]:
    """The account's completion webhook: its URL and its sealed signing secret."""
    return owner_partition(account_id), "WEBHOOK"


WEBHOOK_EVENT_PREFIX = "WHEVENT#"  # sort keys of an account's webhook events (ids sort by time)


def webhook_event_key(account_id: str, event_id: str) -> tuple[str, str]:
    return owner_partition(account_id), WEBHOOK_EVENT_PREFIX + event_id


def request_rate_key(account_id: str) -> tuple[str, str]:
    """The account's request-rate bucket (records.RequestRate)."""
    return owner_partition(account_id), "RATE"


def long_polls_key(account_id: str) -> tuple[str, str]:
    """The account's long polls held now (records.LongPolls)."""
    return owner_partition(account_id), "POLLS"


def usage_key(account_id: str, day: str) -> tuple[str, str]:
    return owner_partition(account_id), f"USAGE#{day}"


def idempotency_key(account_id: str, key: str) -> tuple[str, str]:
    return owner_partition(account_id), "IDEM#" + hashlib.sha256(key.encode()).hexdigest()


def batch_key(batch_id: str) -> tuple[str, str]:
    return f"BATCH#{batch_id}", "BATCH"


def request_key(batch_id: str, index: int) -> tuple[str, str]:
    return f"BATCH#{batch_id}", request_sk(index)


def group_key(batch_id: str, first_index: int) -> tuple[str, str]:
    """A group: requests of one batch dispatched together, under one lease (named by its first request)."""
    return f"BATCH#{batch_id}", f"{GROUP_PREFIX}{first_index:06d}"


REQUEST_PREFIX = "REQ#"  # sort keys of a batch's request items
GROUP_PREFIX = "GRP#"  # sort keys of a batch's groups under way


def request_sk(index: int) -> str:
    return f"{REQUEST_PREFIX}{index:06d}"


FEED_PREFIX = "FEED#"  # sort keys of a batch's finished-order log (records.finished_order)


def feed_key(batch_id: str, seq: int) -> tuple[str, str]:
    """Entry `seq` (1, 2, ...) of a batch's finished-order log: beside its request items, in its partition."""
    return f"BATCH#{batch_id}", f"{FEED_PREFIX}{seq:09d}"


def model_budget_key(model_id: str, shard: int = 0) -> tuple[str, str]:
    """One shard of a model's budget (records.Budget). Shard 0 is the item from before the shards; the others
    have partitions of their own, so that a model's slot takes and give-backs spread over as many partitions
    as it has shards (an item is never split across partitions)."""
    if shard == 0:
        return f"MODEL#{model_id}", "BUDGET"
    return f"BUDGET#{model_id}#{shard:02d}", "BUDGET"


def budget_share(cap: int, shard: int, shards: int) -> int:
    """Shard `shard`'s part of a cap of `cap` slots split over `shards` shards (they add up to the cap)."""
    return cap // shards + (1 if shard < cap % shards else 0)


def slot_lease_key(model_id: str, lease_id: str) -> tuple[str, str]:
    """A slot lease: some of a model's batch slots, held by one worker invocation (scheduling.pump)."""
    return f"MODEL#{model_id}", f"SLOTS#{lease_id}"


def interactive_lease_key(model_id: str, lease_id: str) -> tuple[str, str]:
    """An interactive request in flight on a model: counted in the budget's `interactive` while it exists."""
    return f"MODEL#{model_id}", f"INTERACTIVE#{lease_id}"


def lane_key(model_id: str, created_at: int, batch_id: str) -> tuple[str, str]:
    """A lane: the undispatched requests of one batch on one model; exists while it has any."""
    return f"MODEL#{model_id}", f"LANE#{created_at:012d}#{batch_id}"


def lanes_of(model_id: str) -> tuple[str, str]:
    """(partition, sort key prefix) of a model's lanes, oldest batch first."""
    return f"MODEL#{model_id}", "LANE#"


# Past every lane's sort key ("$" follows "#"): the end of the lanes' range in the model's partition.
LANES_END = "LANE$"


def lane_turn_at(created_at: int, id_from: str = "") -> str:
    """A place in the ring of lanes: before the lanes of batches created at `created_at` whose ids sort
    after `id_from`."""
    return f"LANE#{created_at:012d}#{id_from}"


def lane_created_at(lane_sk: str) -> int:
    return int(lane_sk.split("#")[1])


# The `by_owner` index: an account's batches and files, by creation time. Each protocol's batches are
# listed apart, under its own prefix (protocols.Protocol.owner_prefix).
OWNER_FILE_PREFIX = "FILE#"


def owner_partition(account_id: str) -> str:
    return f"ACCOUNT#{account_id}"


def owner_sort(created_us: int, batch_id: str) -> str:
    """Sort key of an account's batch list (each protocol's apart): creation time in microseconds, so
    newest first holds."""
    return f"{protocols.of_batch_id(batch_id).owner_prefix}{created_us:018d}#{batch_id}"


def owner_sort_created_us(owner_sk: str) -> int:
    """The creation time in microseconds an `owner_sort` key holds."""
    return int(owner_sk.rsplit("#", 1)[0][-18:])


def owner_file_sort(created_us: int, file_id: str) -> str:
    """Sort key of an account's file list: creation time in microseconds, so newest first holds."""
    return f"{OWNER_FILE_PREFIX}{created_us:018d}#{file_id}"


def file_key(file_id: str) -> tuple[str, str]:
    """A batch file: an upload (purpose batch) or a batch's output or error file (purpose batch_output)."""
    return f"FILE#{file_id}", "FILE"


def hash_api_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


# The sparse `by_active` index: unfinished batches, for the sweeper. Written across BATCH_INDEX_SHARDS
# partitions (by a hash of the batch id), as the batches' `by_due` purge entries are: each is written once
# or twice in a batch's life, so their rate is the rate batches are created and end, which small batches
# make high (one partition took 103 % of its write units at the scale target with 20-request batches).
# The sweeper reads every shard, and the partition written before the shards came.
ACTIVE_PARTITION = "ACTIVE"
BATCH_INDEX_SHARDS = 4
ACTIVE_PARTITIONS = (ACTIVE_PARTITION, *(f"{ACTIVE_PARTITION}#{shard:02d}" for shard in range(BATCH_INDEX_SHARDS)))


def _batch_shard(batch_id: str) -> str:
    return f"{zlib.crc32(batch_id.encode()) % BATCH_INDEX_SHARDS:02d}"


def active_partition(batch_id: str) -> str:
    """The `by_active` partition of an unfinished batch: one of the shards, always the same one."""
    return f"{ACTIVE_PARTITION}#{_batch_shard(batch_id)}"

# Sparse index partitions of `by_due`.
# Dispatched or running requests, groups, slot leases and interactive leases, due when their lease runs out:
# written across LEASE_SHARDS partitions (by a hash of the item's key), so no one index partition takes
# every lease of the deployment (DynamoDB gives a partition 1,000 write units/s, and a throttled index
# throttles the table's writes). The sweeper reads them all; `LEASE_DUE` is the partition items written
# before the shards came may still be in. 32: at the scale target (20,480 requests/s on one model, 0.33-0.42
# index writes per request) 16 shards sat at 41-62 % of a partition each; 32 halve that. Raising it later
# is safe (items stay in their shard; the sweeper reads every shard below the new count); lowering is not.
LEASE_DUE = "LEASE"
LEASE_SHARDS = 32
LEASE_PARTITIONS = (LEASE_DUE, *(f"{LEASE_DUE}#{shard:02d}" for shard in range(LEASE_SHARDS)))
PURGE_DUE = "PURGE"  # finished batches, due when their retention ends (sharded as `by_active` is)
PURGE_PARTITIONS = (PURGE_DUE, *(f"{PURGE_DUE}#{shard:02d}" for shard in range(BATCH_INDEX_SHARDS)))
WEBHOOK_DUE = "WEBHOOK"  # webhook events not yet delivered, due when the sweeper should send them again


def lease_due(pk: str, sk: str) -> str:
    """The `by_due` partition of the lease of the item (pk, sk): one of the shards, always the same one."""
    return f"{LEASE_DUE}#{zlib.crc32(f'{pk}/{sk}'.encode()) % LEASE_SHARDS:02d}"


def purge_due(batch_id: str) -> str:
    """The `by_due` partition of a batch waiting for its purge: one of the shards, always the same one."""
    return f"{PURGE_DUE}#{_batch_shard(batch_id)}"


def is_lease_due(partition: object) -> bool:
    return partition in LEASE_PARTITIONS


def retry_due(model_id: str) -> str:
    return f"RETRY#{model_id}"  # waiting requests, due when they may run again


def due_lateness(items: list[dict], now: int) -> int:
    """Seconds past its due time of the most overdue of these `by_due` items (0 for none): the index's own
    key `due_at`, so a page of it tells how late its readers are without reading the items."""
    return max((now - int(item["due_at"]) for item in items), default=0)


# S3
def requests_object(batch_id: str) -> str:
    return f"batches/{batch_id}/requests.jsonl"


def input_file_copy(batch_id: str) -> str:
    """A file batch's own copy of its input file (deleting the upload must not affect the batch)."""
    return f"batches/{batch_id}/input.jsonl"


def index_object(batch_id: str, chunk: int) -> str:
    """A chunk of a batch's request index: INDEX_CHUNK `IndexEntry`s, a JSON list of lists."""
    return f"batches/{batch_id}/index/{chunk:05d}.json"


class IndexEntry(NamedTuple):
    """One request's entry in its batch's index, stored as a JSON list in this order. A request rejected at
    intake has no model, no bytes in requests.jsonl and its error last; a valid one its place in
    requests.jsonl, the most output tokens it may be charged for (None: unbounded) and its prefix key."""

    custom_id: str
    model_id: str | None
    offset: int  # of its line in requests.jsonl
    length: int
    last: Any = None  # absent from entries stored before output bounds were kept
    # Its prefix key (service.creating.prefix_key): what a prompt cache shares with other requests; None when
    # nothing is, and in entries stored before keys were kept.
    prefix: str | None = None

    @classmethod
    def read(cls, stored: list) -> IndexEntry:
        return cls(*stored)

    @property
    def output_bound(self) -> int | None:
        return self.last if self.model_id is not None else None

    @property
    def error(self) -> dict | None:
        """A request rejected at intake: its error."""
        return self.last if self.model_id is None else None


def lane_in_order(batch: dict) -> bool:
    """Whether a batch's one lane is simply its positions 0..n-1, with no lane object: one model, no request
    rejected at intake, and not put in prefix order (`lane_ordered`, scheduling.prefix_order)."""
    return len(batch["lanes"]) == 1 and not batch.get("rejected") and not batch.get("lane_ordered")


def lane_object(batch_id: str, model_id: str) -> str:
    return f"batches/{batch_id}/lanes/{hashlib.sha256(model_id.encode()).hexdigest()[:16]}.json"


def result_object(batch_id: str, index: int) -> str:
    return f"batches/{batch_id}/results/{index:06d}.json"


def export_object(batch_id: str) -> str:
    return f"batches/{batch_id}/output.jsonl"


def file_object(file_id: str) -> str:
    return f"{FILES_PREFIX}{file_id}/content"


def file_prefix(file_id: str) -> str:
    """Everything of one file: its content, and a result file's carry objects while it is written."""
    return f"{FILES_PREFIX}{file_id}/"


def upload_key(upload_id: str) -> tuple[str, str]:
    """A file being sent in parts (the Uploads API), until it is completed into a file or cancelled."""
    return f"UPLOAD#{upload_id}", "UPLOAD"


def upload_parts_prefix(upload_id: str) -> str:
    """Where an upload's parts lie until it is completed or cancelled: under `files/`, so that the data
    bucket's files lifecycle rule also removes the parts of an upload nobody completed or cancelled."""
    return f"{FILES_PREFIX}{upload_id}/parts/"


def upload_part_object(upload_id: str, part_id: str) -> str:
    return f"{upload_parts_prefix(upload_id)}{part_id}"


def retry_filter_object(batch_id: str, token: str) -> str:
    """A retry's filter too large for the batch item (service.steering.retry), under the batch's prefix."""
    return f"{BATCHES_PREFIX}{batch_id}/retry-filter-{token}.json"


def batch_prefix(batch_id: str) -> str:
    return f"{BATCHES_PREFIX}{batch_id}/"
