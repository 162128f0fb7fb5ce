"""A request whose cost is a few ten-millionths of a dollar: boto3 sends such a number in exponent form
(`5E-7`), which DynamoDB adds like any other (local.moto_patches makes moto do the same)."""

from __future__ import annotations

from batchinfer.domain import utc_day
from batchinfer.records import Usage
from tests.helpers import finish, new_key, ok, settings

GLM = "glm-5.3-flash"
FIVE_TOKENS = "a b c d e"  # 5 input tokens at 0.10 USD per million: 5e-7 USD, sent as 5E-7


def spent(svc, account_id: str) -> float:
    return float(Usage.get(svc.table, account_id, utc_day(svc.now()))["cost_usd"])


def test_interactive_requests_costing_ten_millionths_of_a_dollar_are_counted(api, svc, sim_control):
    account, key = new_key(svc)
    for n in (1, 2):
        embedding = ok(api("POST", "/v1/embeddings", key, json_body={"model": GLM, "input": FIVE_TOKENS}))
        assert embedding["usage"]["prompt_tokens"] == 5
        assert abs(spent(svc, account["id"]) - n * 5e-7) < 1e-15


def test_a_batch_of_requests_costing_ten_millionths_of_a_dollar_completes_and_is_charged(api, svc, sim_control):
    settings(svc, embeddings_responses_batches_enabled=True)
    account, key = new_key(svc)
    # One request: a worker adds what its requests cost together, and two would make 1e-6, sent as 0.000001.
    batch = api.created(key, [{"custom_id": "e", "url": "/v1/embeddings",
                               "body": {"model": GLM, "input": FIVE_TOKENS}}])
    assert finish(svc, batch["id"])["completed"] == 1
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert abs(shown["cost_usd"] - 5e-7) < 1e-15, shown
    assert abs(spent(svc, account["id"]) - 5e-7) < 1e-15
