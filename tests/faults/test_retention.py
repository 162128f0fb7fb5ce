"""Retention: a finished or deleted batch goes, with its objects and request items."""

from __future__ import annotations

import pytest

from batchinfer.errors import ApiError
from batchinfer.operations.openai import batches
from batchinfer.service.accounts import authenticate
from batchinfer.service.background.sweep import sweep_once
from tests.faults.harness import configure, get_batch, pump, submit
from tests.helpers import chat_request, new_key
from tests.invariants import stored_requests

# --- Retention -------------------------------------------------------------------------------------------------


def _objects(svc, batch_id: str) -> list[str]:
    listed = svc.blobs.s3.list_objects_v2(Bucket=svc.blobs.bucket, Prefix=f"batches/{batch_id}/")
    return [o["Key"] for o in listed.get("Contents", [])]


def test_retention_end_removes_the_batch_and_leaves_its_request_items_to_ttl(svc, sim_control):
    """When a finished batch's retention ends, the sweeper deletes the batch record and its objects; its
    request items, unreachable from then on, carry a TTL a little later (DynamoDB deletes them for free)."""
    configure(svc, batch_retention_seconds=3600)
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request(f"r-{i}", f"retain {i}") for i in range(3)])
    final = pump(svc, batch_id)
    assert final["status"] == "completed" and _objects(svc, batch_id)
    items = stored_requests(svc, batch_id)
    assert len(items) == 3
    for item in items:  # after the results go, and at most a day plus the window later
        assert final["results_expires_at"] < item["ttl"] <= final["expires_at"] + 3600 + 86400

    # The clock runs with real time too: move it to just before the retention ends, whenever pump finished.
    svc.clock.advance(final["results_expires_at"] - svc.clock() - 1)
    sweep_once(svc)
    assert get_batch(svc, batch_id) is not None  # not before its retention ends
    svc.clock.advance(2)
    assert sweep_once(svc)["purged"] == 1
    assert get_batch(svc, batch_id) is None and _objects(svc, batch_id) == []
    with pytest.raises(ApiError) as gone:
        batches.results_page(svc, who, batch_id, 10, None)
    assert gone.value.status == 404


def test_deleting_a_batch_deletes_its_request_items_in_the_next_sweep(svc, sim_control):
    _, key = new_key(svc)
    who = authenticate(svc, key)
    batch_id = submit(svc, who, [chat_request(f"d-{i}", f"delete {i}") for i in range(3)])
    pump(svc, batch_id)
    assert len(stored_requests(svc, batch_id)) == 3
    assert batches.delete_batch(svc, who, batch_id)["deleted"] is True  # at once: marked, not yet removed
    assert sweep_once(svc)["purged"] == 1
    assert stored_requests(svc, batch_id) == [] and _objects(svc, batch_id) == []
    assert get_batch(svc, batch_id) is None
