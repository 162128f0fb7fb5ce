"""The local DynamoDB (moto with local.moto_patches) refuses what DynamoDB refuses: an item over 400 KB
(attribute names plus values) in PutItem, UpdateItem and TransactWriteItems, and a number it cannot hold. The
storage layer names an oversize item `ItemTooLarge` in each form, never a lost condition."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from batchinfer.storage.dynamo import ITEM_LIMIT_BYTES, ItemTooLarge
from local.moto_patches import NUMBER_DIGITS, NUMBER_OVERFLOW, NUMBER_UNDERFLOW

PK, SK = "TEST#limits", "ITEM"
# pk, sk and their values, and the attribute name "text": what an item beside its text counts.
OVERHEAD = len("pk") + len(PK) + len("sk") + len(SK) + len("text")


def test_an_item_of_exactly_400_kb_is_stored_and_one_byte_more_is_refused_whole(svc):
    t = svc.table
    t.put({"pk": PK, "sk": SK, "text": "x" * (ITEM_LIMIT_BYTES - OVERHEAD)})
    assert len(t.get(PK, SK)["text"]) == ITEM_LIMIT_BYTES - OVERHEAD
    with pytest.raises(ItemTooLarge):
        t.put({"pk": PK, "sk": SK, "text": "y" * (ITEM_LIMIT_BYTES - OVERHEAD + 1)})
    assert t.get(PK, SK)["text"][0] == "x"  # nothing written


def test_multibyte_text_counts_its_utf8_bytes(svc):
    with pytest.raises(ItemTooLarge):
        svc.table.put({"pk": PK, "sk": SK, "text": "é" * ((ITEM_LIMIT_BYTES - OVERHEAD) // 2 + 1)})
    assert svc.table.get(PK, SK) is None


def test_an_update_that_would_pass_the_limit_changes_nothing(svc):
    t = svc.table
    t.put({"pk": PK, "sk": SK, "text": "x" * 300_000, "n": 1})
    with pytest.raises(ItemTooLarge):
        t.update(PK, SK, "SET more = :m, n = n + :one", {":m": "y" * 200_000, ":one": 1})
    item = t.get(PK, SK)
    assert "more" not in item and item["n"] == 1
    with pytest.raises(ItemTooLarge):  # a map nested in the item counts too
        t.update(PK, SK, "SET nested = :m", {":m": {"errors": ["z" * 60_000] * 2}})
    assert "nested" not in t.get(PK, SK)


def test_a_transaction_with_an_oversize_item_is_cancelled_with_a_validation_error_and_writes_nothing(svc):
    t = svc.table
    with pytest.raises(ClientError) as raw:
        t.client.transact_write_items(TransactItems=[
            t.op_put({"pk": PK, "sk": "OTHER", "text": "fine"}),
            t.op_put({"pk": PK, "sk": SK, "text": "x" * ITEM_LIMIT_BYTES})])
    assert raw.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert raw.value.response["CancellationReasons"] == [
        {"Code": "None"}, {"Code": "ValidationError", "Message": "Item size has exceeded the maximum allowed size"}]
    with pytest.raises(ItemTooLarge):
        t.transact([t.op_put({"pk": PK, "sk": "OTHER", "text": "fine"}),
                    t.op_update(PK, SK, "SET #text = :v", {":v": "x" * ITEM_LIMIT_BYTES})])
    assert t.get(PK, "OTHER") is None and t.get(PK, SK) is None


@pytest.mark.parametrize(("number", "message"), [
    ("5E-324", NUMBER_UNDERFLOW), ("1E-131", NUMBER_UNDERFLOW), ("-1E-131", NUMBER_UNDERFLOW),
    ("1E+126", NUMBER_OVERFLOW), ("-1E+130", NUMBER_OVERFLOW),
    ("1" * 39, NUMBER_DIGITS), ("0.000" + "7" * 39, NUMBER_DIGITS),
])
def test_numbers_dynamodb_cannot_hold_are_refused_in_items_and_expressions(svc, number, message):
    t = svc.table
    key = t.key(PK, SK)
    writes = [
        lambda: t.client.put_item(TableName=t.name, Item={**key, "n": {"N": number}}),
        lambda: t.client.put_item(TableName=t.name, Item={**key, "m": {"M": {"deep": {"L": [{"N": number}]}}}}),
        lambda: t.client.update_item(TableName=t.name, Key=key, UpdateExpression="SET n = :v",
                                     ExpressionAttributeValues={":v": {"N": number}}),
        lambda: t.client.transact_write_items(TransactItems=[{"Update": {
            "TableName": t.name, "Key": key, "UpdateExpression": "ADD n :v",
            "ExpressionAttributeValues": {":v": {"N": number}}}}]),
    ]
    for write in writes:
        with pytest.raises(ClientError) as refused:
            write()
        assert refused.value.response["Error"] == {"Code": "ValidationException", "Message": message}
    assert t.get(PK, SK) is None


@pytest.mark.parametrize("number", ["1E-130", "-1E-130", "9.9999999999999999999999999999999999999E+125",
                                    "1" * 38, "0.0000000000000000000000000000000000000000000001", "0"])
def test_numbers_at_the_edges_of_the_range_are_stored(svc, number):
    t = svc.table
    t.client.put_item(TableName=t.name, Item={**t.key(PK, SK), "n": {"N": number}})
    stored = t.client.get_item(TableName=t.name, Key=t.key(PK, SK))["Item"]["n"]["N"]
    assert float(stored) == float(number)


@pytest.mark.parametrize("cost", ["1E-7", "5E-7", "1e-7", "1.5E-9"])
def test_a_transaction_adds_a_cost_written_in_exponent_form(svc, cost):
    t = svc.table
    t.put({"pk": PK, "sk": SK, "cost_usd": 0})
    for _ in range(3):
        t.client.transact_write_items(TransactItems=[{"Update": {
            "TableName": t.name, "Key": t.key(PK, SK), "UpdateExpression": "ADD cost_usd :c",
            "ExpressionAttributeValues": {":c": {"N": cost}}}}])
    assert abs(t.get(PK, SK)["cost_usd"] - 3 * float(cost)) < 1e-18


def test_a_call_costing_exactly_a_ten_millionth_of_a_dollar_is_counted(api, svc, sim_control):
    """1 token at 0.10 USD per million: 1e-7 USD, which boto3 sends as 1E-7, added in transactions."""
    from batchinfer.domain import utc_day
    from batchinfer.records import Usage
    from tests.helpers import finish, new_key, ok, settings

    settings(svc, embeddings_responses_batches_enabled=True)
    account, key = new_key(svc)
    embedding = ok(api("POST", "/v1/embeddings", key, json_body={"model": "glm-5.3-flash", "input": "a"}))
    assert embedding["usage"]["prompt_tokens"] == 1
    batch = api.created(key, [{"custom_id": "e", "url": "/v1/embeddings",
                               "body": {"model": "glm-5.3-flash", "input": "a"}}])
    assert finish(svc, batch["id"])["completed"] == 1
    assert abs(ok(api("GET", f"/v1/batches/{batch['id']}", key))["cost_usd"] - 1e-7) < 1e-15
    assert abs(float(Usage.get(svc.table, account["id"], utc_day(svc.now()))["cost_usd"]) - 2e-7) < 1e-15
