"""The storage layer's EMF metrics: every write DynamoDB refuses is counted by why (infra alarms on them)."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from batchinfer.catalog import (
    METRIC_CONDITIONAL_CHECK_FAILURES,
    METRIC_DYNAMODB_THROTTLES,
    METRIC_TRANSACTION_CONFLICTS,
)
from batchinfer.observability import metrics
from batchinfer.storage.dynamo import ConditionFailed, Throttled, _raise


def refused(code: str, reasons: list[str] | None = None) -> ClientError:
    response: dict = {"Error": {"Code": code, "Message": "refused"}}
    if reasons is not None:
        response["CancellationReasons"] = [{"Code": r} for r in reasons]
    return ClientError(response, "TransactWriteItems")


def counted() -> dict[str, float]:
    return {name: sum(entry["Value"]) for name, entry in metrics.metric_set.items()}


@pytest.fixture(autouse=True)
def fresh_metrics():
    metrics.clear_metrics()
    yield
    metrics.clear_metrics()


@pytest.mark.parametrize(("error", "raised", "metric"), [
    (refused("ConditionalCheckFailedException"), ConditionFailed, METRIC_CONDITIONAL_CHECK_FAILURES),
    (refused("TransactionCanceledException", ["None", "ConditionalCheckFailed"]), ConditionFailed,
     METRIC_CONDITIONAL_CHECK_FAILURES),
    (refused("TransactionCanceledException", ["TransactionConflict", "None"]), Throttled,
     METRIC_TRANSACTION_CONFLICTS),
    (refused("TransactionConflictException"), Throttled, METRIC_TRANSACTION_CONFLICTS),
    (refused("TransactionCanceledException", ["ThrottlingError"]), Throttled, METRIC_DYNAMODB_THROTTLES),
    (refused("ProvisionedThroughputExceededException"), Throttled, METRIC_DYNAMODB_THROTTLES),
    (refused("ThrottlingException"), Throttled, METRIC_DYNAMODB_THROTTLES),
])
def test_each_refused_write_is_counted_once_by_why(error, raised, metric):
    with pytest.raises(raised):
        _raise(error)
    assert counted() == {metric: 1.0}
    with pytest.raises(raised):
        _raise(error)
    assert counted() == {metric: 2.0}  # one data point per occurrence: Powertools adds them up per invocation


def test_other_errors_are_not_counted():
    with pytest.raises(ClientError):
        _raise(refused("ValidationException"))
    assert counted() == {}
