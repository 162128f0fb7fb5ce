"""The records the service keeps in DynamoDB, and every expression that reads or changes them.

Service code says what changes (a lane advances, a batch stops, slots go back); this package says how
DynamoDB spells it: the update, condition and key-condition expressions, each next to the record it
touches. Keys come from `layout`; statuses and states from `domain`, whose transition tables fence
every status write. Ops are built for `Table.transact`, so callers combine them into one transaction.

Records: the batch (`BatchItem`), its lanes (one per model with undispatched requests), its groups (a
lease over up to 25 first attempts), its requests (written with their outcome, or for a retry), the
model's budget, the account (unfinished counts and slots), the day's usage, and an Idempotency-Key.

One module per family, each importing only those below it:
  expressions     what every record's expressions share (`Op`, `IN` tests, `ADD` of counters, `by_due` reads)
  items           what the items hold (`BatchItem`, `GroupItem`, `RequestItem`, `FileItem`, `UploadItem`), and a
                  new batch's extension fields (`BatchExtras`)
  capacity        a model's budget, interactive leases and slot leases, and the shards slots came from
  batches         the batch and its lanes
  idempotency     the Idempotency-Key record: which batch a key created
  work            a batch's groups and request items
  accounts        the account, its API keys and its day's usage
  files           batch files and uploads
  webhooks        the account's webhook and its events
  analytics       a batch's analytics counters (moved by the writes that settle its requests)
  finished_order  a batch's finished-order log (its entries are written in the transactions that count
                  outcomes)
  limits          an account's request-rate bucket and the long polls it holds
Callers import from the package (`from batchinfer.records import Batch`), not from its modules.
"""

from . import analytics as analytics  # a module of functions, not a record class
from .accounts import Account, ApiKey, Usage, key_account_and_usage
from .batches import Batch, Lane
from .capacity import Budget, InteractiveLease, SlotLease, group_shards, lease_shards, shards_map
from .expressions import Op, due_in
from .files import File, Upload
from .finished_order import Feed, finished_members, transact_counted
from .idempotency import Idempotency
from .items import BatchExtras, BatchItem, FileItem, GroupItem, LaneState, RequestItem, UploadItem
from .limits import LongPolls, RequestRate
from .webhooks import Webhook, WebhookEvent
from .work import Group, Request

__all__ = [
    "Account", "ApiKey", "Batch", "BatchExtras", "BatchItem", "Budget", "File", "FileItem", "Group", "GroupItem",
    "Idempotency",
    "InteractiveLease", "Lane", "LaneState", "Op", "Request", "RequestItem", "SlotLease", "Upload", "UploadItem",
    "Usage", "Webhook", "WebhookEvent", "due_in", "group_shards", "key_account_and_usage", "lease_shards",
    "shards_map",
    "Feed", "finished_members", "transact_counted", "LongPolls", "RequestRate",
]
