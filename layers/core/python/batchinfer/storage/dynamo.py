"""A thin typed wrapper over the DynamoDB client: plain dicts in, plain dicts out."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from ..catalog import METRIC_CONDITIONAL_CHECK_FAILURES, METRIC_DYNAMODB_THROTTLES, METRIC_TRANSACTION_CONFLICTS
from ..observability import metrics

_ser = TypeSerializer()
_de = TypeDeserializer()


class ConditionFailed(Exception):
    """A conditional write lost: someone else changed the item first."""


class Throttled(Exception):
    """DynamoDB refused the write for capacity; the caller may try again later."""


class ItemTooLarge(Exception):
    """DynamoDB refused the write because an item would pass its 400 KB limit: nothing was written, and the
    same write would be refused again. Not a lost condition: whoever wrote it must write less."""


ITEM_LIMIT_BYTES = 400 * 1024  # DynamoDB's limit on one item (attribute names and values)


def _says_too_large(message: str | None) -> bool:
    """DynamoDB's words for an item over its limit: "Item size has exceeded the maximum allowed size" (PutItem,
    a transaction's cancellation reason), "Item size to update has exceeded ..." (UpdateItem); read loosely,
    as its wording is not part of the API."""
    text = (message or "").lower()
    return "item size" in text and "exceed" in text


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, set):
        return {_plain(v) for v in value}
    return value


def _typed(value: Any) -> Any:
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_typed(v) for v in value]
    return value


def serialize(item: dict) -> dict:
    return {k: _ser.serialize(_typed(v)) for k, v in item.items() if v is not None}


def deserialize(item: dict) -> dict:
    return {k: _plain(_de.deserialize(v)) for k, v in item.items()}


def values(vals: dict) -> dict:
    return {k: _ser.serialize(_typed(v)) for k, v in vals.items()}


_ALIAS = re.compile(r"#([A-Za-z_][A-Za-z0-9_]*)")


def _names(names: dict | None, *expressions: str | None) -> dict | None:
    """Expression attribute names: `#word` stands for the attribute `word` (many names are reserved words)."""
    found = dict(names or {})
    for expression in expressions:
        for match in _ALIAS.finditer(expression or ""):
            found.setdefault(match.group(0), match.group(1))
    return found or None


_THROTTLE_REASONS = ("ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded")
_BUSY_REASONS = (*_THROTTLE_REASONS, "TransactionConflict")
_THROTTLE_CODES = ("ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded")


def _count(name: str) -> None:
    """One refused write, as an EMF metric of the invocation (Powertools adds them up until it flushes)."""
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)


def _raise(error: ClientError) -> None:
    code = error.response.get("Error", {}).get("Code", "")
    if code == "ValidationException" and _says_too_large(error.response.get("Error", {}).get("Message")):
        raise ItemTooLarge(str(error)) from error
    if code == "ConditionalCheckFailedException":
        _count(METRIC_CONDITIONAL_CHECK_FAILURES)
        raise ConditionFailed(str(error)) from error
    if code == "TransactionCanceledException":
        cancelled = error.response.get("CancellationReasons", [])
        if any(r.get("Code") == "ValidationError" and _says_too_large(r.get("Message")) for r in cancelled):
            raise ItemTooLarge(str(error)) from error
        reasons = [r.get("Code") for r in cancelled]
        if any(r == "ValidationError" for r in reasons):
            raise error  # a write DynamoDB cannot make as asked (a number out of range): a fault, not a race
        if any(r == "ConditionalCheckFailed" for r in reasons):
            _count(METRIC_CONDITIONAL_CHECK_FAILURES)
            raise ConditionFailed(str(error)) from error
        if any(r in _BUSY_REASONS for r in reasons) or not reasons:
            # Throttled, or another transaction touched one of the items at the same moment (hot counters):
            # nothing was written, so the same transaction may simply be tried again.
            if any(r == "TransactionConflict" for r in reasons):
                _count(METRIC_TRANSACTION_CONFLICTS)
            if any(r in _THROTTLE_REASONS for r in reasons):
                _count(METRIC_DYNAMODB_THROTTLES)
            raise Throttled(str(error)) from error
        raise ConditionFailed(str(error)) from error
    if code == "TransactionConflictException":
        _count(METRIC_TRANSACTION_CONFLICTS)
        raise Throttled(str(error)) from error
    if code in _THROTTLE_CODES:
        _count(METRIC_DYNAMODB_THROTTLES)
        raise Throttled(str(error)) from error
    raise error


def _retrying(call, attempts: int = 6):
    """Run a write, trying again (with jittered backoff) while DynamoDB says it is busy. A condition that
    fails is an answer, not a busy signal, and is never retried here."""
    for attempt in range(attempts):
        try:
            return call()
        except Throttled:
            if attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0, 0.05 * 2 ** attempt))


def _expressions(expression: str | None = None, condition: str | None = None, names: dict | None = None,
                 vals: dict | None = None) -> dict[str, Any]:
    """The expression parameters of one write, with `#word` names filled in."""
    out: dict[str, Any] = {}
    if expression:
        out["UpdateExpression"] = expression
    if condition:
        out["ConditionExpression"] = condition
    names = _names(names, expression, condition)
    if names:
        out["ExpressionAttributeNames"] = names
    if vals:
        out["ExpressionAttributeValues"] = values(vals)
    return out


class Table:
    def __init__(self, ddb_client, name: str) -> None:
        self.client = ddb_client
        self.name = name

    def key(self, pk: str, sk: str) -> dict:
        return {"pk": {"S": pk}, "sk": {"S": sk}}

    def _write(self, operation: str, **kwargs: Any) -> dict:
        """One write, tried again while DynamoDB is busy; a lost condition raises ConditionFailed."""
        def call() -> dict:
            try:
                return getattr(self.client, operation)(**kwargs)
            except ClientError as error:
                _raise(error)

        return _retrying(call)

    def get(self, pk: str, sk: str, consistent: bool = True) -> dict | None:
        answer = self.client.get_item(TableName=self.name, Key=self.key(pk, sk), ConsistentRead=consistent)
        return deserialize(answer["Item"]) if "Item" in answer else None

    def get_many(self, keys: list[tuple[str, str]], consistent: bool = True) -> dict[tuple[str, str], dict]:
        """Several items in one round trip (BatchGetItem), by (pk, sk)."""
        found: dict[tuple[str, str], dict] = {}
        pending = {self.name: {"Keys": [self.key(pk, sk) for pk, sk in dict.fromkeys(keys)],
                               "ConsistentRead": consistent}}
        while pending:
            answer = self.client.batch_get_item(RequestItems=pending)
            for raw in answer.get("Responses", {}).get(self.name, []):
                item = deserialize(raw)
                found[(item["pk"], item["sk"])] = item
            pending = answer.get("UnprocessedKeys") or {}
        return found

    def put(self, item: dict, condition: str | None = None, names: dict | None = None,
            vals: dict | None = None) -> None:
        self._write("put_item", TableName=self.name, Item=serialize(item),
                    **_expressions(condition=condition, names=names, vals=vals))

    def update(self, pk: str, sk: str, expression: str, vals: dict | None = None, names: dict | None = None,
               condition: str | None = None, return_new: bool = False) -> dict | None:
        extra = {"ReturnValues": "ALL_NEW"} if return_new else {}
        answer = self._write("update_item", TableName=self.name, Key=self.key(pk, sk), **extra,
                             **_expressions(expression, condition, names, vals))
        return deserialize(answer["Attributes"]) if return_new else None

    def update_unless(self, pk: str, sk: str, expression: str, condition: str, vals: dict | None = None,
                      names: dict | None = None) -> tuple[dict | None, dict | None]:
        """An update whose condition failing is an expected answer (a limit reached, a guess about the item
        that was wrong), not a lost race: (the updated attributes, None) when it was written, (None, the item
        as it was) when the condition failed, in one call. Not counted as a conditional-check failure."""
        def call() -> dict:
            try:
                return self.client.update_item(
                    TableName=self.name, Key=self.key(pk, sk), ReturnValues="UPDATED_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD", **_expressions(expression, condition, names, vals))
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                    return {"old": error.response.get("Item") or {}}
                _raise(error)

        answer = _retrying(call)
        if "old" in answer:
            return None, deserialize(answer["old"])
        return deserialize(answer.get("Attributes", {})), None

    def delete(self, pk: str, sk: str, condition: str | None = None, vals: dict | None = None,
               return_old: bool = False) -> dict | None:
        extra = {"ReturnValues": "ALL_OLD"} if return_old else {}
        answer = self._write("delete_item", TableName=self.name, Key=self.key(pk, sk), **extra,
                             **_expressions(condition=condition, vals=vals))
        return deserialize(answer["Attributes"]) if return_old and "Attributes" in answer else None

    # Transactions take ops built by the helpers below.
    def op_put(self, item: dict, condition: str | None = None, vals: dict | None = None) -> dict:
        return {"Put": {"TableName": self.name, "Item": serialize(item),
                        **_expressions(condition=condition, vals=vals)}}

    def op_update(self, pk: str, sk: str, expression: str, vals: dict | None = None, names: dict | None = None,
                  condition: str | None = None) -> dict:
        return {"Update": {"TableName": self.name, "Key": self.key(pk, sk),
                           **_expressions(expression, condition, names, vals)}}

    def op_delete(self, pk: str, sk: str, condition: str | None = None, vals: dict | None = None) -> dict:
        return {"Delete": {"TableName": self.name, "Key": self.key(pk, sk),
                           **_expressions(condition=condition, vals=vals)}}

    def op_check(self, pk: str, sk: str, condition: str, vals: dict | None = None,
                 names: dict | None = None) -> dict:
        return {"ConditionCheck": {"TableName": self.name, "Key": self.key(pk, sk),
                                   **_expressions(condition=condition, names=names, vals=vals)}}

    def transact(self, ops: list[dict]) -> None:
        self._write("transact_write_items", TransactItems=ops)

    def query(self, key_condition: str, vals: dict, index: str | None = None, forward: bool = True,
              limit: int | None = None, start: dict | None = None, names: dict | None = None,
              filter_expression: str | None = None, consistent: bool = False,
              projection: str | None = None) -> tuple[list[dict], dict | None]:
        """One page: (items, key to continue from or None). `projection`: the attributes to read (`#word`
        names allowed), when the caller needs only a few."""
        kwargs: dict[str, Any] = {"TableName": self.name, "KeyConditionExpression": key_condition,
                                  "ExpressionAttributeValues": values(vals), "ScanIndexForward": forward}
        if index:
            kwargs["IndexName"] = index
        elif consistent:
            kwargs["ConsistentRead"] = True
        if limit:
            kwargs["Limit"] = limit
        if start:
            kwargs["ExclusiveStartKey"] = serialize(start)
        names = _names(names, key_condition, filter_expression, projection)
        if names:
            kwargs["ExpressionAttributeNames"] = names
        if filter_expression:
            kwargs["FilterExpression"] = filter_expression
        if projection:
            kwargs["ProjectionExpression"] = projection
        answer = self.client.query(**kwargs)
        last = answer.get("LastEvaluatedKey")
        return [deserialize(i) for i in answer.get("Items", [])], (deserialize(last) if last else None)

    def query_all(self, key_condition: str, vals: dict, **kwargs: Any) -> Iterator[dict]:
        start = None
        while True:
            items, start = self.query(key_condition, vals, start=start, **kwargs)
            yield from items
            if not start:
                return

    def delete_many(self, keys: list[tuple[str, str]]) -> None:
        for i in range(0, len(keys), 25):
            requests = [{"DeleteRequest": {"Key": self.key(pk, sk)}} for pk, sk in keys[i:i + 25]]
            pending = {self.name: requests}
            while pending:
                answer = self.client.batch_write_item(RequestItems=pending)
                pending = answer.get("UnprocessedItems") or {}
