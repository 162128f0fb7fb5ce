"""Storage names an item over DynamoDB's 400 KB limit for what it is, in each form DynamoDB refuses one: a
caller must not take it for a lost condition (someone else changed the item) and wait for a race to end."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from batchinfer.storage.dynamo import ConditionFailed, ItemTooLarge, Throttled, _raise


def refused(code: str, message: str = "refused", reasons: list[dict] | None = None) -> ClientError:
    response: dict = {"Error": {"Code": code, "Message": message}}
    if reasons is not None:
        response["CancellationReasons"] = reasons
    return ClientError(response, "TransactWriteItems")


@pytest.mark.parametrize("error", [
    refused("ValidationException", "Item size has exceeded the maximum allowed size"),
    refused("ValidationException", "Item size to update has exceeded the maximum allowed size"),
    refused("TransactionCanceledException", "Transaction cancelled [None, ValidationError]",
            [{"Code": "None"},
             {"Code": "ValidationError", "Message": "Item size has exceeded the maximum allowed size"}]),
    # A condition that failed on another item of the same transaction does not hide the size: trying again
    # after the race would be refused again.
    refused("TransactionCanceledException", "Transaction cancelled [ConditionalCheckFailed, ValidationError]",
            [{"Code": "ConditionalCheckFailed", "Message": "The conditional request failed"},
             {"Code": "ValidationError", "Message": "Item size has exceeded the maximum allowed size"}]),
])
def test_an_item_over_the_limit_is_its_own_error_in_every_form_dynamodb_gives(error):
    with pytest.raises(ItemTooLarge) as raised:
        _raise(error)
    assert not isinstance(raised.value, ConditionFailed | Throttled)


def test_another_validation_error_in_a_transaction_is_not_a_lost_condition():
    error = refused("TransactionCanceledException", "Transaction cancelled [ValidationError]",
                    [{"Code": "ValidationError", "Message": "Number overflow. Attempting to store a number with "
                                                            "magnitude larger than supported range"}])
    with pytest.raises(ClientError):
        _raise(error)


def test_a_lost_condition_is_still_a_lost_condition():
    with pytest.raises(ConditionFailed):
        _raise(refused("TransactionCanceledException", "Transaction cancelled [ConditionalCheckFailed]",
                       [{"Code": "ConditionalCheckFailed", "Message": "The conditional request failed"}]))


def test_other_validation_exceptions_are_left_as_they_are():
    with pytest.raises(ClientError):
        _raise(refused("ValidationException", "One or more parameter values were invalid"))
