"""The local DynamoDB (moto with local.moto_patches) answers a query with a sort key condition as DynamoDB does,
and at the cost of what the condition keeps: a one-item query of a large batch's feed does not weigh every item
the batch's partition holds."""

from __future__ import annotations

import pytest
from moto.dynamodb.models.dynamo_type import Item

PK = "TEST#queries"
# Two kinds of items share the partition, as a batch's requests and its feed do.
KEYS = [f"REQ#{i:05d}" for i in range(300)] + [f"FEED#{i:05d}" for i in range(40)]


@pytest.fixture
def table(svc):
    t = svc.table
    for i, sk in enumerate(KEYS):
        t.put({"pk": PK, "sk": sk, "n": i})
    return t


def pages(t, condition: str, vals: dict, forward: bool, limit: int | None) -> list[list[str]]:
    found, start = [], None
    while True:
        items, start = t.query(condition, {":pk": PK, **vals}, forward=forward, limit=limit, start=start)
        found.append([item["sk"] for item in items])
        if start is None:
            return found


CONDITIONS = [
    ("pk = :pk AND begins_with(sk, :p)", {":p": "FEED#"}, lambda sk: sk.startswith("FEED#")),
    ("pk = :pk AND sk BETWEEN :a AND :b", {":a": "REQ#00100", ":b": "REQ#00149"},
     lambda sk: "REQ#00100" <= sk <= "REQ#00149"),
    ("pk = :pk AND sk > :a", {":a": "REQ#00290"}, lambda sk: sk > "REQ#00290"),
    ("pk = :pk AND sk <= :a", {":a": "FEED#00003"}, lambda sk: sk <= "FEED#00003"),
    ("pk = :pk AND sk = :a", {":a": "REQ#00007"}, lambda sk: sk == "REQ#00007"),
]


@pytest.mark.parametrize(("condition", "vals", "keeps"), CONDITIONS, ids=[c[0] for c in CONDITIONS])
def test_a_query_with_a_sort_key_condition_answers_each_page_as_dynamodb_does(table, condition, vals, keeps):
    for forward in (True, False):
        wanted = sorted((sk for sk in KEYS if keeps(sk)), reverse=not forward)
        for limit in (None, 1, 7):
            found = pages(table, condition, vals, forward, limit)
            assert [sk for page in found for sk in page] == wanted, (forward, limit)
            if limit:
                assert all(len(page) == limit for page in found[:-1]), (forward, limit, found)
                assert len(found[-1]) <= limit


def test_a_one_item_query_of_the_feed_weighs_only_the_feeds_items(table, monkeypatch):
    sized = []
    real_size = Item.size
    monkeypatch.setattr(Item, "size", lambda self: sized.append(1) or real_size(self))
    items, _ = table.query("pk = :pk AND begins_with(sk, :p)", {":pk": PK, ":p": "FEED#"}, forward=False, limit=1)
    assert [item["sk"] for item in items] == ["FEED#00039"]
    assert 1 <= len(sized) <= 40 + 1  # the feed's items, not the partition's 340
