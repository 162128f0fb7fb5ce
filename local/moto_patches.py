"""Make moto's DynamoDB transactions safe to use from many threads, as DynamoDB's are.

moto (5.2) runs TransactWriteItems by deep-copying every table it touches and, if any part fails,
putting the copies back. That is O(table size) per transaction, and with a threaded server a failed
transaction restores the table over writes other threads made meanwhile, silently losing them. Our
ledger is built on transactions, so the local stack and the tests would measure moto, not the design.

The patch keeps moto's own transaction code but (1) runs DynamoDB operations one at a time under a lock,
so a transaction is atomic to other callers, and (2) replaces the table copy with a snapshot of only the
items the transaction names, restored if it is cancelled. Applied by the local moto server process
(`python -m local.moto_server`) and by the test suite's in-process moto.

(3) A query costs what it returns, as on DynamoDB: moto's `Table.query` starts from `all_items()`, which
sorts every item of the table, for each query, then filters them. The patch hands it only the candidates:
the items of the one partition a table query names (those its sort key condition keeps: moto works out the
size of every candidate before it looks at the condition), or for an index query the items whose index hash
key equals the one asked for (found by a plain pass, not a sort); moto's own code then sorts, pages and
filters those as before. Without it every poll of a sparse index took time in proportion to the whole table,
and a one-item query of a batch's feed took time in proportion to the batch, so a large table or batch
slowed every reader, which the design does not.

(4) Key sizes are checked on reads too, as DynamoDB checks them: a GetItem, BatchGetItem, TransactGetItems,
DeleteItem or UpdateItem whose key, or a Query whose key condition or ExclusiveStartKey, holds a partition
key over 2,048 bytes or a sort key over 1,024 bytes is a ValidationException. moto checks them only when an
item is written, so an id too long to be a key read as "not found" here and failed deployed.

(5) S3: a part written into a completed or aborted multipart upload answers 404 NoSuchUpload, as on S3.

(6) Number arithmetic (`ADD n :v`, `SET n = n + :v`) reads a number in exponent form, as DynamoDB does:
moto parses an operand without a "." with int(), so `5E-7` (what boto3 sends for a cost of 5e-7 USD) raised
ValueError and its server answered 500.

(7) An item over DynamoDB's 400 KB is refused as DynamoDB refuses it, counted as DynamoDB counts (attribute
names plus values: a string's UTF-8 bytes, a number's significant digits at two a byte plus one, 3 bytes for
a list or map and 1 per element, map keys included): a PutItem with "Item size has exceeded the maximum
allowed size", an UpdateItem with "Item size to update has exceeded the maximum allowed size" (ValidationException
both, nothing written), and inside TransactWriteItems a TransactionCanceledException whose reason for that
item is `ValidationError`. moto's own check counted its own way (a number by its characters), at every
attribute set (quadratic in the attributes), and turned the transaction's refusal into a ValidationException.

(8) A number DynamoDB cannot hold (a magnitude under 1E-130 or from 1E+126, or more than 38 significant
digits), in an item or an expression's values, is a ValidationException as on DynamoDB; moto checked the
range only in a put's item, and as a float.

(9) The moto server lists its own service packages once, not for every request: it matched each request's
host against `list_of_moto_modules()`, which reads moto's folder and stats each of its ~200 entries, twice a
request. That was about half of what an idle local stack's polls cost the server's process.

(10) DynamoDB's answers are written as JSON at once, as moto wrote them before its 5.x serializer: the
serializer walks the operation's output shape for every value, trying several spellings of each member's
name, and was a quarter of the CPU of a test that runs batches through in-process moto. An answer holding
anything but plain JSON values and bytes (a timestamp: DescribeTable and the like) still goes through it.
`MOTO_JSON_CHECK=1` writes every answer both ways and raises where they differ. And the names of a
response class's methods are listed once per class, not with `inspect.getmembers` at every request.

(11) KMS: a symmetric key (the webhook secrets' key) gets one RSA key pair made once per process, not one of
its own: moto makes an RSA-2048 pair for every key it creates, a symmetric one too, where nothing uses it
(it signs and verifies only for asymmetric keys), and that was about 50 ms of CPU for every test's fresh moto.
Asymmetric keys still get pairs of their own.
"""

from __future__ import annotations

import base64
import copy
import decimal
import functools
import json
import operator
import os
import threading
import types

_lock = threading.RLock()
_applied = False
_transaction_depth = 0  # > 0 while a TransactWriteItems runs (under _lock: one operation at a time)


def apply() -> None:
    global _applied
    if _applied:
        return
    import moto.dynamodb.models as models
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.table import Table

    real_deepcopy = copy.deepcopy

    def deepcopy(obj, memo=None):
        return obj if isinstance(obj, Table) else real_deepcopy(obj, memo)

    # Only transact_write_items deep-copies Table objects in that module; keep every other copy real.
    models.copy = types.SimpleNamespace(deepcopy=deepcopy, copy=copy.copy)

    def locked(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            with _lock:
                return method(self, *args, **kwargs)
        return wrapper

    for name in ("put_item", "get_item", "update_item", "delete_item", "query", "scan"):
        setattr(DynamoDBBackend, name, locked(getattr(DynamoDBBackend, name)))

    original = DynamoDBBackend.transact_write_items

    @functools.wraps(original)
    def transact_write_items(self, transact_items):
        with _lock:
            snapshots = []
            for entry in transact_items:
                _, op = next(iter(entry.items()))
                table = self.tables.get(op.get("TableName"))
                if table is None:
                    continue
                source = op.get("Item") or op.get("Key") or {}
                key = {a: source[a] for a in (table.hash_key_attr, table.range_key_attr) if a and a in source}
                current = self.get_item(table.name, key)
                snapshots.append((table.name, key, real_deepcopy(current.to_json()["Attributes"]) if current else None))
            global _transaction_depth
            _transaction_depth += 1
            try:
                return original(self, transact_items)
            except Exception:
                for table_name, key, attrs in reversed(snapshots):
                    if attrs is None:
                        self.delete_item(table_name, key)
                    else:
                        self.put_item(table_name, attrs)
                raise
            finally:
                _transaction_depth -= 1

    DynamoDBBackend.transact_write_items = transact_write_items

    real_keys_value = DynamoDBBackend.get_keys_value

    # Every item read or change by key goes through here (GetItem, BatchGetItem, TransactGetItems,
    # DeleteItem, UpdateItem, and the writes of a transaction).
    @functools.wraps(real_keys_value)
    def get_keys_value(self, table, keys):
        table._validate_key_sizes(keys)
        return real_keys_value(self, table, keys)

    DynamoDBBackend.get_keys_value = get_keys_value

    real_backend_query = DynamoDBBackend.query

    @functools.wraps(real_backend_query)
    def backend_query(self, table_name, hash_key_dict, range_comparison, range_value_dicts, limit,
                      exclusive_start_key, *args, hash_key_conditions=None, range_key_conditions=None, **kwargs):
        table = self.get_table(table_name)
        table._validate_key_sizes(dict(exclusive_start_key or {}))
        table._validate_key_sizes(dict(hash_key_conditions or []))
        for name, _, condition_values in range_key_conditions or []:
            for value in condition_values:
                table._validate_key_sizes({name: value})
        return real_backend_query(self, table_name, hash_key_dict, range_comparison, range_value_dicts, limit,
                                  exclusive_start_key, *args, hash_key_conditions=hash_key_conditions,
                                  range_key_conditions=range_key_conditions, **kwargs)

    DynamoDBBackend.query = backend_query

    real_query = Table.query

    @functools.wraps(real_query)
    def query(self, hash_key, *args, hash_key_conditions=None, **kwargs):
        index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
        if index_name is None and hash_key is not None and self.range_key_attr:
            candidates = list(self.items.get(hash_key, {}).values())
            range_comparison, range_objs = (args[0], args[1]) if len(args) > 1 else (None, None)
            if range_comparison and not set(kwargs) - {"range_key_conditions"}:  # not with a legacy QueryFilter
                # moto sizes every item of the partition before it looks at the sort key condition: only
                # those the condition keeps (moto applies it again, so its answer is the same)
                keeps = _sort_key_test(range_comparison, range_objs)
                candidates = [item for item in candidates if keeps(item.range_key)]
        elif index_name is not None and hash_key_conditions and len(hash_key_conditions) == 1:
            (attribute, value), = hash_key_conditions
            wanted = (value.type, value.value)
            candidates = [item for partition in self.items.values()
                          for item in (partition.values() if self.range_key_attr else [partition])
                          if (found := item.attrs.get(attribute)) is not None and (found.type, found.value) == wanted]
        else:
            return real_query(self, hash_key, *args, hash_key_conditions=hash_key_conditions, **kwargs)
        self.all_items = lambda: candidates  # this call only (operations run one at a time, under the lock)
        try:
            return real_query(self, hash_key, *args, hash_key_conditions=hash_key_conditions, **kwargs)
        finally:
            del self.all_items

    Table.query = query
    _patch_item_limits()
    _patch_number_arithmetic()
    _patch_s3_uploads()
    _patch_server_lookup()
    _patch_dynamodb_answers()
    _patch_kms_key_pairs()
    _applied = True


# DynamoDB keeps 38 significant digits.
_DYNAMO_NUMBERS = decimal.Context(prec=38)


def _sort_key_test(comparison: str, objs: list):  # noqa: ANN202 - a test of moto's DynamoType
    """moto's `DynamoType.compare` of a sort key with a query's condition; for string keys the condition's values
    are cast once, not again for every item of the partition as moto's own way does."""
    from moto.dynamodb.comparisons import get_comparison_func

    func = get_comparison_func(comparison)
    if func is None or not all(obj.type == "S" for obj in objs):
        return lambda key: key.compare(comparison, objs)
    values = [obj.value for obj in objs]
    return lambda key: func(key.value, *values) if key.type == "S" else key.compare(comparison, objs)


def _number(text: str) -> int | decimal.Decimal:
    try:
        return int(text)
    except ValueError:
        return decimal.Decimal(text)


def _patch_kms_key_pairs() -> None:
    """(11) One RSA pair, made at the first symmetric key, for every symmetric key (none of them uses it)."""
    import moto.kms.models as kms_models

    real_generate = kms_models.generate_private_key
    unused_pair = functools.cache(lambda: real_generate("SYMMETRIC_DEFAULT"))

    def generate_private_key(key_spec: str):  # noqa: ANN202 - moto's AbstractPrivateKey
        return unused_pair() if key_spec == "SYMMETRIC_DEFAULT" else real_generate(key_spec)

    kms_models.generate_private_key = generate_private_key


def _patch_number_arithmetic() -> None:
    """(6) The sum or difference of two numbers in any form DynamoDB accepts (`5E-7`, `1.5e3`, `12`)."""
    from moto.dynamodb.models.dynamo_type import DDBType, DynamoType

    def arithmetic(real, combine):
        @functools.wraps(real)
        def apply_to(self, other):
            if self.type != DDBType.NUMBER or other.type != DDBType.NUMBER:
                return real(self, other)  # moto's own refusals of other types
            left, right = _number(self.value), _number(other.value)
            if isinstance(left, int) and isinstance(right, int):
                return DynamoType({DDBType.NUMBER: str(combine(left, right))})
            with decimal.localcontext(_DYNAMO_NUMBERS):
                return DynamoType({DDBType.NUMBER: str(combine(decimal.Decimal(left), decimal.Decimal(right)))})
        return apply_to

    DynamoType.__add__ = arithmetic(DynamoType.__add__, operator.add)
    DynamoType.__sub__ = arithmetic(DynamoType.__sub__, operator.sub)


def _patch_s3_uploads() -> None:
    """(5) A part written into an upload that was completed or aborted fails as on S3, with 404 NoSuchUpload:
    moto (5.2) raises a KeyError there, which its server answers as a 500, so code that must treat a vanished
    upload as "another writer finished it" could not be tested."""
    from moto.s3.exceptions import NoSuchUpload
    from moto.s3.models import S3Backend

    real_upload_part = S3Backend.upload_part

    @functools.wraps(real_upload_part)
    def upload_part(self, bucket_name, multipart_id, *args, **kwargs):
        if multipart_id not in self.get_bucket(bucket_name).multiparts:
            raise NoSuchUpload(upload_id=multipart_id)
        return real_upload_part(self, bucket_name, multipart_id, *args, **kwargs)

    S3Backend.upload_part = upload_part


ITEM_LIMIT_BYTES = 400 * 1024  # DynamoDB's item size limit
ITEM_TOO_LARGE = "Item size has exceeded the maximum allowed size"
UPDATE_TOO_LARGE = "Item size to update has exceeded the maximum allowed size"
NUMBER_OVERFLOW = "Number overflow. Attempting to store a number with magnitude larger than supported range"
NUMBER_UNDERFLOW = "Number underflow. Attempting to store a number with magnitude smaller than supported range"
NUMBER_DIGITS = "Attempting to store more than 38 significant digits in a Number"
_SMALLEST = decimal.Decimal("1E-130")
_LARGEST = decimal.Decimal("1E+126")


class ValidationError(Exception):
    """An item of a transaction refused for its content: moto names a cancellation reason after the class of
    what an operation raised, and DynamoDB's reason for these is `ValidationError`."""


def _significant_digits(number: decimal.Decimal) -> str:
    return "".join(map(str, number.as_tuple().digits)).strip("0") or "0"


def number_problem(text: str) -> str | None:
    """Why DynamoDB would refuse the number `text`, or None."""
    try:
        number = decimal.Decimal(text)
    except decimal.InvalidOperation:
        return None  # moto's own refusal of what is not a number
    if not number.is_finite() or number == 0:
        return None
    if len(_significant_digits(number)) > 38:
        return NUMBER_DIGITS
    if number.copy_abs() >= _LARGEST:
        return NUMBER_OVERFLOW
    if number.copy_abs() < _SMALLEST:
        return NUMBER_UNDERFLOW
    return None


def _numbers(value: object):
    """Every number in an attribute value in its wire form ({"N": "1"}, {"L": [...]}, {"M": {...}}, {"NS": [...]})."""
    if not isinstance(value, dict):
        return
    for kind, inner in value.items():
        if kind == "N":
            yield inner
        elif kind == "NS":
            yield from inner
        elif kind == "L":
            for element in inner:
                yield from _numbers(element)
        elif kind == "M":
            for element in inner.values():
                yield from _numbers(element)


def _check_numbers(values: dict | None) -> None:
    from moto.dynamodb.exceptions import MockValidationException

    for value in (values or {}).values():
        for text in _numbers(value):
            problem = number_problem(str(text))
            if problem:
                raise MockValidationException(problem)


def _number_size(text: str) -> int:
    try:
        return (len(_significant_digits(decimal.Decimal(text))) + 1) // 2 + 1
    except decimal.InvalidOperation:
        return len(text)


def value_size(value) -> int:
    """The bytes DynamoDB counts for one attribute value (a moto DynamoType)."""
    kind, inner = value.type, value.value
    if kind == "S":
        return len(inner.encode("utf-8", "surrogatepass"))
    if kind == "N":
        return _number_size(inner)
    if kind == "B":
        return len(inner) if isinstance(inner, bytes) else len(inner) * 3 // 4
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode("utf-8", "surrogatepass")) for s in inner)
    if kind == "NS":
        return sum(_number_size(n) for n in inner)
    if kind == "BS":
        return sum(len(b) if isinstance(b, bytes) else len(b) * 3 // 4 for b in inner)
    if kind == "L":
        return 3 + sum(1 + value_size(element) for element in inner)
    if kind == "M":
        return 3 + sum(len(k.encode("utf-8", "surrogatepass")) + 1 + value_size(element)
                       for k, element in inner.items())
    return len(str(inner))


def item_size(attrs: dict) -> int:
    """The bytes DynamoDB counts for an item: its attribute names and values ({name: DynamoType})."""
    return sum(len(name.encode("utf-8", "surrogatepass")) + value_size(value) for name, value in attrs.items())


def _patch_item_limits() -> None:
    """(7) and (8): items over 400 KB, and numbers DynamoDB cannot hold, refused as DynamoDB refuses them."""
    from moto.dynamodb.exceptions import MockValidationException
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.dynamo_type import DynamoType, LimitedSizeDict
    from moto.dynamodb.models.table import Table

    LimitedSizeDict.__setitem__ = dict.__setitem__  # the size is checked once per write, below

    real_validate_number = Table._validate_number_type

    @functools.wraps(real_validate_number)
    def validate_number(self, value):
        # moto compares the range as floats: 9.99...9E+125 (38 nines) rounds to 1E+126 and was refused.
        if isinstance(value, str) and number_problem(value) is None:
            try:
                return real_validate_number(self, value)
            except Exception as refused:
                if getattr(refused, "message", None) in (NUMBER_OVERFLOW, NUMBER_UNDERFLOW):
                    return None
                raise
        return real_validate_number(self, value)

    Table._validate_number_type = validate_number

    def refuse(message: str) -> Exception:
        return ValidationError(message) if _transaction_depth else MockValidationException(message)

    real_put = DynamoDBBackend.put_item

    @functools.wraps(real_put)
    def put_item(self, table_name, item_attrs, *args, **kwargs):
        with _lock:
            _check_numbers(item_attrs)
            _check_numbers(kwargs.get("expression_attribute_values") or (args[3] if len(args) > 3 else None))
            if item_size({name: DynamoType(value) for name, value in item_attrs.items()}) > ITEM_LIMIT_BYTES:
                raise refuse(ITEM_TOO_LARGE)
            return real_put(self, table_name, item_attrs, *args, **kwargs)

    real_update = DynamoDBBackend.update_item

    @functools.wraps(real_update)
    def update_item(self, table_name, key, *args, **kwargs):
        with _lock:
            _check_numbers(kwargs.get("expression_attribute_values") or (args[2] if len(args) > 2 else None))
            before = self.get_item(table_name, key)
            saved = copy.deepcopy(before.to_json()["Attributes"]) if before else None
            item = real_update(self, table_name, key, *args, **kwargs)
            if item is not None and item_size(item.attrs) > ITEM_LIMIT_BYTES:
                if saved is None:
                    self.delete_item(table_name, key)
                else:
                    real_put(self, table_name, saved)
                raise refuse(ITEM_TOO_LARGE if _transaction_depth else UPDATE_TOO_LARGE)
            return item

    DynamoDBBackend.put_item = put_item
    DynamoDBBackend.update_item = update_item


def _patch_server_lookup() -> None:
    import moto.backends as backends

    modules = tuple(backends.list_of_moto_modules())  # moto's installed packages: fixed while it runs
    backends.list_of_moto_modules = lambda: iter(modules)


class _NotPlain(Exception):
    """An answer holds a value JSON cannot carry as it is (a timestamp): moto's serializer writes it."""


def _plain(value):  # noqa: ANN001, ANN202
    """`value` as the JSON protocol writes it: members without a value left out, bytes (B and BS attributes)
    in base64."""
    if isinstance(value, dict):
        return {key: _plain(member) for key, member in value.items() if member is not None}
    if isinstance(value, list):
        return [_plain(member) for member in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise _NotPlain(type(value).__name__)


def _patch_dynamodb_answers() -> None:
    from moto.dynamodb.responses import DynamoResult

    real = DynamoResult.execute_result
    check = os.environ.get("MOTO_JSON_CHECK") == "1"

    def execute_result(self, context):  # noqa: ANN001, ANN202
        shape = context.operation_model.output_shape
        try:
            members = shape.members if shape is not None else {}
            body = json.dumps(_plain({key: value for key, value in self.result.items() if key in members}))
        except (_NotPlain, AttributeError):  # AttributeError: a result that is not a dict
            return real(self, context)
        serializer = context.serializer_class(operation_model=context.operation_model)
        answer = serializer._create_default_response()
        headers = {"Content-Type": serializer._get_protocol_specific_content_type()}
        if check:
            status, real_headers, real_body = real(self, context)
            if (status, real_headers, json.loads(real_body)) != (answer["status_code"], headers, json.loads(body)):
                raise AssertionError(f"{context.operation_model.name}: {real_body!r} written as {body!r}")
        return answer["status_code"], headers, body

    DynamoResult.execute_result = execute_result

    import moto.core.responses as responses

    responses.method_names_from_class = functools.cache(responses.method_names_from_class)
