"""Count the AWS calls of the process running the local stack, with what AWS would bill for each.

Every boto3 client of the stack (API, dispatcher, worker, sweeper all run in this process) gets botocore
event hooks; each call is recorded with a label saying who made it: the Lambda function the local
runtime is running in this thread or task (`local.lambda_runtime.invoke` is wrapped), `esm` for the
event source mapping's own receive/delete calls (`poll_once` is wrapped), `bench` for the benchmark's
own calls (set with `LABEL.set("bench")`), `api` for the rest made in the API's threads (AnyIO's thread
pool under uvicorn), `other` for anything else (an invocation already running when recording began).

DynamoDB units are estimated the way AWS bills them: a write costs 1 WRU per started KB of the larger of
the old and new item (2x in a transaction; a ConditionCheck is a write; a failed conditional write still
costs); a read 1 RRU per started 4 KB (half for eventually consistent reads). Item sizes are taken from
the items this process writes and reads (an update is estimated at max(item as last seen, key + values
written)). A write to an item that is in a global secondary index also writes the index, as its projection
decides (layout.INDEX_PROJECTIONS): an index that projects ALL is written by every write of the item (its
size in units), a KEYS_ONLY or INCLUDE one only when its keys or included attributes are written (1 unit: the
entry is small); two writes (delete + put) when its index key changes. These are counted apart (`gsi_wru`),
at 1x; beside them, in the same pass, what they would have been had every index projected ALL
(`gsi_wru_all`), which is what the deployed projections save. Each call also keeps, per item it wrote,
the item's key and the index partitions it wrote
(`Call.keys`), for the hot-item report (bench/hot_report.py).
"""

from __future__ import annotations

import contextvars
import json
import math
import re
import threading
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

from batchinfer.layout import INDEX_PROJECTIONS
from batchinfer.storage.bootstrap import GSIS

LABEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("aws_label", default=None)
GSI_KEYS = {name: (h[0], r[0]) for name, (h, r) in GSIS.items()}
KEY_ATTRS = {a for pair in GSI_KEYS.values() for a in pair}


def _index_writes(was: bool, now: bool, key_changed: bool, written_in_entry: bool, was_units: int,
                  now_units: int) -> list[tuple[bool, int]]:
    """The index entries a write of an item writes: (in the new partition?, units) each. `written_in_entry`:
    the write changes what the entry holds (every write, for an ALL projection)."""
    if was and now and key_changed:  # a new index key: the old entry deleted, a new one put
        return [(False, was_units), (True, now_units)]
    if was and now:
        return [(True, max(was_units, now_units))] if written_in_entry else []
    return [(False, was_units)] if was else [(True, now_units)] if now else []


# AWS list prices, us-east-1, on-demand (USD).
PRICE = {"wru": 0.625e-6, "rru": 0.125e-6, "sqs": 0.40e-6, "s3_put": 0.005e-3, "s3_get": 0.0004e-3,
         "lambda": 0.20e-6}
S3_PUT_CLASS = {"PutObject", "CopyObject", "ListObjectsV2", "ListObjects", "CreateMultipartUpload",
                "UploadPart", "CompleteMultipartUpload", "CreateBucket"}
S3_FREE = {"DeleteObject", "DeleteObjects"}


def value_size(v: dict) -> int:
    """Size of one DynamoDB-typed value, as DynamoDB counts it (approximately)."""
    (t, x), = v.items()
    if t == "S":
        return len(x.encode())
    if t == "N":
        return len(x.strip("-").replace(".", "").lstrip("0")) // 2 + 1
    if t == "B":
        return len(x)
    if t in ("BOOL", "NULL"):
        return 1
    if t == "M":
        return 3 + sum(len(k.encode()) + value_size(e) + 1 for k, e in x.items())
    if t == "L":
        return 3 + sum(value_size(e) + 1 for e in x)
    return sum(len(str(e)) for e in x)  # sets


def item_size(item: dict) -> int:
    return sum(len(k.encode()) + value_size(v) for k, v in item.items())


def item_key(item: dict) -> tuple[str, str]:
    return item["pk"]["S"], item["sk"]["S"]


def kind(key: tuple[str, str]) -> str:
    pk, sk = key
    if pk.startswith("BATCH#"):
        return "request" if sk.startswith("REQ#") else "log entry" if sk.startswith("FEED#") else "batch"
    if pk.startswith("MODEL#"):
        return "lane" if sk.startswith("LANE#") else "model budget"
    if pk.startswith("ACCOUNT#"):
        return {"ACCOUNT": "account", "USAGE": "usage", "IDEM": "idempotency", "RATE": "rate bucket",
                "POLLS": "long polls"}.get(sk.split("#")[0], sk)
    return "api key" if pk.startswith("KEY#") else pk.split("#")[0]


_CLAUSE = re.compile(r"\b(SET|ADD|REMOVE|DELETE)\b")
_ASSIGNED = re.compile(r"(?:^|,)\s*([#\w]+)[\w.#\[\]]*\s*=")
_ASSIGNED_VALUE = re.compile(r"(?:^|,)\s*([#\w]+)\s*=\s*(:\w+)\s*(?=,|$)")


def _assigned_values(expression: str, names: dict, values: dict) -> dict[str, str]:
    """Top-level attributes an update expression SETs straight to a string value: {attribute: value}."""
    parts = _CLAUSE.split(expression)
    found = {}
    for verb, body in zip(parts[1::2], parts[2::2], strict=False):
        if verb == "SET":
            for name, placeholder in _ASSIGNED_VALUE.findall(body.strip()):
                value = values.get(placeholder, {})
                if "S" in value:
                    found[names.get(name, name)] = value["S"]
    return found


def _touched(expression: str, names: dict) -> tuple[set[str], set[str]]:
    """Top-level attributes an update expression sets (or adds) and removes."""
    parts = _CLAUSE.split(expression)
    sets, removes = set(), set()
    for verb, body in zip(parts[1::2], parts[2::2], strict=False):
        if verb == "SET":
            found = _ASSIGNED.findall(body)
        else:
            found = [p.strip().split(" ")[0].split(".")[0] for p in body.split(",") if p.strip()]
        found = {names.get(n, n) for n in found}
        (removes if verb in ("REMOVE", "DELETE") else sets).update(found)
    return sets, removes


@dataclass
class Call:
    label: str
    service: str
    operation: str
    ok: bool
    seconds: float = 0.0  # waiting on the moto server: request sent until response read (not parsed)
    units: float = 1.0  # billed requests (SQS 64 KB chunks; S3 requests; DynamoDB: 1 per call)
    wru: float = 0.0
    gsi_wru: float = 0.0
    gsi_wru_all: float = 0.0  # the GSI writes had every index projected ALL (the projections' saving)
    rru: float = 0.0
    writes: list = field(default_factory=list)  # (operation, item kind, wru, gsi_wru)
    keys: list = field(default_factory=list)  # (item key, wru, [(index, index partition, units)])


class Recorder:
    """Hooks on the stack's clients; `calls` and `invocations` grow as the stack runs."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.invocations: list[tuple[str, float]] = []  # (function, seconds)
        self._sizes: dict[tuple[str, str], int] = {}
        self._keys: dict[tuple[str, str], set[str]] = {}  # GSI key attributes an item has
        self._partitions: dict[tuple[str, str], dict[str, str]] = {}  # its index partitions, by index
        self._lock = threading.Lock()
        self._local = threading.local()

    def reset(self) -> None:
        with self._lock:
            self.calls, self.invocations = [], []

    # --- hooks -----------------------------------------------------------------------------------------
    def _hooks(self) -> list[tuple[str, object]]:
        return [("before-parameter-build", self._params), ("before-call", self._stamp),
                ("before-send", self._sending), ("before-parse", self._received), ("after-call", self._after)]

    def install(self, *clients) -> None:
        for c in clients:
            for event, hook in self._hooks():
                c.meta.events.register(event, hook)

    def uninstall(self, *clients) -> None:
        for c in clients:
            for event, hook in self._hooks():
                c.meta.events.unregister(event, hook)

    @staticmethod
    def _params(params, context, **_) -> None:
        context["bench_params"] = params

    def _stamp(self, **_) -> None:
        self._local.waited = 0.0

    def _sending(self, **_) -> None:
        self._local.sent = time.perf_counter()

    def _received(self, **_) -> None:
        sent = getattr(self._local, "sent", None)  # None: the call began before recording did
        if sent is not None:
            self._local.waited = getattr(self._local, "waited", 0.0) + time.perf_counter() - sent
            self._local.sent = None

    def _after(self, http_response, parsed, model, context, **_) -> None:
        service = model.service_model.service_name
        op = model.name
        params = context.get("bench_params")
        if params is None:  # the call began before recording did
            return
        label = LABEL.get() or ("api" if threading.current_thread().name.startswith("AnyIO") else "other")
        call = Call(label, service, op, ok=http_response.status_code < 300,
                    seconds=getattr(self._local, "waited", 0.0))
        try:
            if service == "dynamodb":
                self._dynamodb(call, op, params, parsed)
            elif service == "sqs":
                self._sqs(call, op, params, parsed)
            elif service == "s3":
                call.units = 0 if op in S3_FREE else 1
        except Exception as error:  # a counting bug must not break the stack
            call.operation += f" (uncounted: {type(error).__name__})"
        self.calls.append(call)

    def _sqs(self, call: Call, op: str, params: dict, parsed: dict) -> None:
        if op == "SendMessageBatch":
            size = sum(len(e["MessageBody"].encode()) for e in params["Entries"])
        elif op == "SendMessage":
            size = len(params["MessageBody"].encode())
        elif op == "ReceiveMessage":
            messages = parsed.get("Messages", [])
            size = sum(len(m["Body"].encode()) for m in messages)
            if not messages:
                call.operation = "ReceiveMessage (empty)"
        else:
            size = 0
        call.units = max(1, math.ceil(size / 65536))

    # --- DynamoDB units ---------------------------------------------------------------------------------
    def _learn(self, item: dict) -> None:
        key = item_key(item)
        self._sizes[key] = item_size(item)
        self._keys[key] = {a for a in KEY_ATTRS if a in item}
        self._partitions[key] = {name: item[h]["S"] for name, (h, _) in GSI_KEYS.items() if "S" in item.get(h, {})}

    def _write(self, call: Call, op: str, key: tuple, new_size: int, after: set[str], changed: set[str],
               factor: int, values: dict[str, str] | None = None) -> None:
        before, old = self._keys.get(key, set()), self._sizes.get(key, new_size)
        wru = factor * max(1, math.ceil(max(old, new_size) / 1024))
        old_units, new_units = max(1, math.ceil(old / 1024)), max(1, math.ceil(new_size / 1024))
        gsi, gsi_all, parts = 0, 0, []
        if call.ok:  # a write that lost its condition writes no index
            partitions = dict(self._partitions.get(key, {}))
            for name, (h, r) in GSI_KEYS.items():
                projection, included = INDEX_PROJECTIONS[name]
                whole = projection == "ALL"
                was, now, key_changed = {h, r} <= before, {h, r} <= after, bool({h, r} & changed)
                gsi_all += sum(u for _, u in _index_writes(was, now, key_changed, True, old_units, new_units))
                was_units, now_units = (old_units, new_units) if whole else (1, 1)
                old_partition = partitions.get(name)
                new_partition = (values or {}).get(h, old_partition) if now else None
                for in_new, units in _index_writes(was, now, key_changed, whole or bool(set(included) & changed),
                                                   was_units, now_units):
                    gsi += units
                    parts.append((name, (new_partition if in_new else old_partition) or "?", units))
                if now and new_partition is not None:
                    partitions[name] = new_partition
                else:
                    partitions.pop(name, None)
            self._keys[key] = after
            self._sizes[key] = new_size
            self._partitions[key] = partitions
        call.wru += wru
        call.gsi_wru += gsi
        call.gsi_wru_all += gsi_all
        call.writes.append((op, kind(key), wru, gsi))
        call.keys.append((key, wru, parts))

    def _write_op(self, call: Call, op: str, p: dict, factor: int) -> None:
        if op == "Put":
            item = p["Item"]
            self._write(call, op, item_key(item), item_size(item), {a for a in KEY_ATTRS if a in item},
                        set(item), factor, {a: v["S"] for a, v in item.items() if a in KEY_ATTRS and "S" in v})
        elif op == "Update":
            key = item_key(p["Key"])
            sets, removes = _touched(p["UpdateExpression"], p.get("ExpressionAttributeNames") or {})
            new = item_size(p["Key"]) + sum(value_size(v) for v in (p.get("ExpressionAttributeValues") or {}).values())
            new = max(new, self._sizes.get(key, 0))
            after = (self._keys.get(key, set()) | (sets & KEY_ATTRS)) - removes
            values = _assigned_values(p["UpdateExpression"], p.get("ExpressionAttributeNames") or {},
                                      p.get("ExpressionAttributeValues") or {})
            self._write(call, op, key, new, after, sets | removes, factor, values)
        elif op == "Delete":
            self._write(call, op, item_key(p["Key"]), 0, set(), set(KEY_ATTRS), factor)
        elif op == "ConditionCheck":
            key = item_key(p["Key"])
            units = factor * max(1, math.ceil(self._sizes.get(key, 0) / 1024))
            call.wru += units
            call.writes.append((op, kind(key), units, 0))
            call.keys.append((key, units, []))

    def _dynamodb(self, call: Call, op: str, params: dict, parsed: dict) -> None:
        with self._lock:
            if op == "TransactWriteItems":
                for entry in params["TransactItems"]:
                    (kind_, p), = entry.items()
                    self._write_op(call, kind_, p, 2)
            elif op in ("PutItem", "UpdateItem", "DeleteItem"):
                self._write_op(call, op.removesuffix("Item"), params, 1)
            elif op == "BatchWriteItem":
                for requests in params["RequestItems"].values():
                    for r in requests:
                        if "PutRequest" in r:
                            self._write_op(call, "Put", r["PutRequest"], 1)
                        else:
                            self._write_op(call, "Delete", r["DeleteRequest"], 1)
            elif op == "GetItem":
                item = parsed.get("Item")
                if item:
                    self._learn(item)
                call.rru = self._read_units(item_size(item) if item else 0, params.get("ConsistentRead"))
            elif op == "BatchGetItem":
                for table, items in parsed.get("Responses", {}).items():
                    consistent = params["RequestItems"][table].get("ConsistentRead")
                    for item in items:
                        self._learn(item)
                    requested = len(params["RequestItems"][table]["Keys"])
                    call.rru += sum(self._read_units(item_size(i), consistent) for i in items)
                    call.rru += (requested - len(items)) * self._read_units(0, consistent)
            elif op in ("Query", "Scan"):
                items = parsed.get("Items", [])
                projected = "ProjectionExpression" in params
                if "IndexName" not in params and not projected:  # whole items of the table: their sizes
                    for item in items:
                        self._learn(item)
                call.rru = self._read_units(sum(self._read_size(i, projected) for i in items),
                                            params.get("ConsistentRead"))

    def _read_size(self, item: dict, projected: bool) -> int:
        """What reading `item` weighs: a projection saves no read units (DynamoDB charges the whole items it
        read), so an item that came back with its key counts at its size as last written or read whole; one
        whose key the projection left out (the finished-order log's head, read as `seq` alone) at what came
        back, within the same 4 KB unit for an item under 1 KB."""
        if projected and "pk" in item and "sk" in item:
            return max(item_size(item), self._sizes.get(item_key(item), 0))
        return item_size(item)

    @staticmethod
    def _read_units(size: int, consistent: bool | None) -> float:
        units = max(1, math.ceil(size / 4096))
        return units if consistent else units / 2


@contextmanager
def recording(svc, settle: bool = True):
    """Record every AWS call and Lambda invocation of the local stack while the block runs. With `settle`,
    first wait until the dispatcher and sweeper have been invoked afresh (under the wrapper), so that no
    invocation begun before recording is running unlabelled."""
    from local import lambda_runtime

    clients = (svc.table.client, svc.blobs.s3, svc.queues.sqs)
    recorder = Recorder()
    recorder.install(*clients)
    invoke, poll_once = lambda_runtime.invoke, lambda_runtime.poll_once

    fresh = {"dispatcher": threading.Event(), "sweeper": threading.Event()}

    def counted_invoke(function: str, event: dict, environment: str = "", ended: threading.Event | None = None) -> dict:
        if function in fresh:
            fresh[function].set()
        token = LABEL.set(function)
        started = time.monotonic()
        try:
            return invoke(function, event, environment, ended=ended)
        finally:
            recorder.invocations.append((function, time.monotonic() - started))
            LABEL.reset(token)

    def counted_poll(*args, **kwargs) -> int:
        token = LABEL.set("esm")
        try:
            return poll_once(*args, **kwargs)
        finally:
            LABEL.reset(token)

    lambda_runtime.invoke, lambda_runtime.poll_once = counted_invoke, counted_poll
    try:
        if settle:
            for event in fresh.values():
                event.wait(timeout=30)
            time.sleep(1.5)  # a poller's long poll (1 s) begun before
            recorder.reset()
        yield recorder
    finally:
        lambda_runtime.invoke, lambda_runtime.poll_once = invoke, poll_once
        recorder.uninstall(*clients)


def moto_cpu_seconds() -> float:
    """CPU seconds used so far by the moto server (a child process of this one), or 0 if not found."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            if int(stat[1]) == os.getpid() and b"moto_server" in open(f"/proc/{pid}/cmdline", "rb").read():
                return (int(stat[11]) + int(stat[12])) / tick
        except OSError:
            continue
    return 0.0


# --- Summaries -----------------------------------------------------------------------------------------

def by_operation(calls: list[Call], labels: set[str] | None = None) -> Counter:
    """Calls counted by (service, operation)."""
    return Counter((c.service, c.operation) for c in calls if labels is None or c.label in labels)


def describe(counts: Counter) -> str:
    grouped: dict[str, list[str]] = defaultdict(list)
    for (service, op), n in sorted(counts.items()):
        grouped[service].append(f"{op} {n}")
    return "; ".join(f"{s}: " + ", ".join(ops) for s, ops in grouped.items()) or "none"


def usd(calls: list[Call], invocations: int) -> dict[str, float]:
    """What AWS would charge for these calls (request charges only), by service."""
    out = {"dynamodb": 0.0, "sqs": 0.0, "s3": 0.0, "lambda": invocations * PRICE["lambda"]}
    for c in calls:
        if c.service == "dynamodb":
            out["dynamodb"] += (c.wru + c.gsi_wru) * PRICE["wru"] + c.rru * PRICE["rru"]
        elif c.service == "sqs":
            out["sqs"] += c.units * PRICE["sqs"]
        elif c.service == "s3":
            out["s3"] += c.units * PRICE["s3_put" if c.operation in S3_PUT_CLASS else "s3_get"]
    return out


def dumps(counts: Counter) -> str:
    return json.dumps({f"{s}.{o}": n for (s, o), n in sorted(counts.items())})
