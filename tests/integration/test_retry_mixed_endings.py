"""Retries of batches whose requests ended in more than one way: a batch cancelled, retried for its failed
request, then expired holds cancelled and expired requests at once, and each API counts each as it ended."""

from __future__ import annotations

import pytest

from batchinfer.service.accounts import authenticate
from tests.helpers import new_key
from tests.integration.test_api import _tick, finish, ok, step
from tests.integration.test_message_batches import (
    Messages,
    catalog_file,  # noqa: F401  (a fixture)
    entry,
)
from tests.integration.test_retry import FLAKY
from tests.invariants import assert_ledger_consistent

IDS = ["flaky"] + [f"n-{i}" for i in range(30)]


@pytest.fixture
def messages(api, svc, sim, catalog_file):  # noqa: F811
    from batchinfer.runtime import use_services
    from tests.helpers import make_services
    services = make_services(sim.url, table_name="batchinfer-mixed", bucket_name="batchinfer-mixed",
                             models_file=str(catalog_file), message_batches_enabled=True, max_attempts=1)
    use_services(services)
    _, key = new_key(services, tier="free")  # 8 requests in flight at most: one round runs 8 of them
    yield Messages(api, key), services
    use_services(svc)


def cancelled_with_one_failed(client: Messages, services) -> tuple[dict, list[str]]:
    """A Message Batch cancelled after one round: `flaky` errored, some never started (canceled)."""
    created = ok(client.create([entry("flaky", FLAKY)] + [entry(c) for c in IDS[1:]]))
    step(services)
    ok(client("POST", f"/{created['id']}/cancel"))
    finish(services, created["id"])
    types = {r["custom_id"]: r["result"]["type"] for r in client.results(created["id"])}
    assert types["flaky"] == "errored"
    never = [c for c, t in types.items() if t == "canceled"]
    assert never, "every request ran before the cancel"
    return created, never


def test_a_message_batch_cancelled_then_expired_counts_each_request_as_it_ended(messages):
    client, services = messages
    created, never = cancelled_with_one_failed(client, services)
    again = ok(client("POST", f"/{created['id']}/retry", json_body={"statuses": ["errored"]}))
    assert again["processing_status"] == "in_progress"
    _tick(services, 86400 + 1)  # the new window closes before the retried request runs
    finish(services, created["id"])
    ended = ok(client("GET", f"/{created['id']}"))
    types = {r["custom_id"]: r["result"]["type"] for r in client.results(created["id"])}
    assert types["flaky"] == "expired" and all(types[c] == "canceled" for c in never)
    assert ended["request_counts"] == {"processing": 0, "succeeded": len(IDS) - 1 - len(never), "errored": 0,
                                       "canceled": len(never), "expired": 1}
    assert_ledger_consistent(services, created["id"], authenticate(services, client.key), IDS)

