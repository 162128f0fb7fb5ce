"""A batch's spending cap (`max_cost_usd`, an extension of the three batch APIs) through the real API
handler and the real worker and sweeper handlers: checked and shown at create, never passed by what the
simulator reports the requests used, and stopping the batch as a cancel does once the next request's worst
case no longer fits."""

from __future__ import annotations

import json

import pytest

from batchinfer.layout import batch_key
from batchinfer.service.accounts import Principal
from tests.helpers import (
    anthropic_error,
    chat_request,
    error,
    finish,
    new_key,
    ok,
    services_in_use,
    sim_requests,
)
from tests.integration.test_files import create_from, jsonl, line, upload
from tests.integration.test_message_batches import Messages, entry
from tests.invariants import assert_ledger_consistent

GLM = "glm-5.3-flash"


@pytest.fixture
def svc(svc, sim):
    """The suite's services on the same moto, with Message Batches and file batches on."""
    with services_in_use(svc, sim.url, "cap", message_batches_enabled=True, file_batches_enabled=True) as services:
        yield services


def capped_requests(n: int, max_tokens: int = 5) -> list[dict]:
    return [chat_request(f"q-{i}", f"Question number {i}?", max_tokens=max_tokens) for i in range(n)]


def worst_case(svc, request: dict) -> float:
    """A request's worst case as the cap counts it: its line's bytes as input tokens, max_tokens as output."""
    line = json.dumps({"custom_id": request["custom_id"], "body": request["body"]}, separators=(",", ":"))
    return svc.catalog.get(GLM).cost_usd(len(line.encode()) + 1, request["body"]["max_tokens"])


@pytest.mark.parametrize("value", [0, -1, "2.50", True, None, [], {"usd": 1}])
def test_a_cap_that_is_not_a_positive_number_is_a_400_naming_it(api, svc, value):
    _, key = new_key(svc)
    body = {"requests": capped_requests(1), "max_cost_usd": value}
    if value is None:  # null is the same as leaving it out
        assert "max_cost_usd" not in ok(api("POST", "/v1/batches", key, json_body=body))
        return
    error(api("POST", "/v1/batches", key, json_body=body), 400, "max_cost_usd", param="max_cost_usd")
    anthropic_error(Messages(api, key)("POST", json_body={"requests": [entry("a")], "max_cost_usd": value}),
                    400, "invalid_request_error", "max_cost_usd")
    assert ok(api("GET", "/v1/batches", key))["data"] == []


def test_the_cap_is_shown_on_the_batch_object_of_each_api(api, svc):
    _, key = new_key(svc)
    inline = ok(api("POST", "/v1/batches", key, json_body={"requests": capped_requests(1), "max_cost_usd": 2.5}))
    assert inline["max_cost_usd"] == 2.5
    assert ok(api("GET", f"/v1/batches/{inline['id']}", key))["max_cost_usd"] == 2.5
    plain = ok(api("POST", "/v1/batches", key, json_body={"requests": capped_requests(1)}))
    assert "max_cost_usd" not in plain  # shown where one was set, as webhook_url is
    messages = Messages(api, key)
    capped = ok(messages("POST", json_body={"requests": [entry("a")], "max_cost_usd": 1}))
    assert capped["max_cost_usd"] == 1 and capped["type"] == "message_batch"
    assert ok(messages("GET", f"/{capped['id']}"))["max_cost_usd"] == 1


def test_a_capped_request_without_a_worst_case_is_refused_naming_the_cap(api, svc):
    _, key = new_key(svc)
    image = chat_request("pic", "x")
    image["body"]["messages"] = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]
    err = error(api("POST", "/v1/batches", key, json_body={"requests": [*capped_requests(2), image],
                                                           "max_cost_usd": 1}), 400, "requests[2]", "pic",
                param="max_cost_usd")
    assert "max_cost_usd" in err["message"]
    # Without a cap the same batch is fine: nothing needs its worst case.
    ok(api("POST", "/v1/batches", key, json_body={"requests": [*capped_requests(2), image]}))


def test_the_batch_stops_at_its_cap_and_never_spends_past_it(api, svc, sim_control):
    account, key = new_key(svc)
    requests = capped_requests(30)
    worst = max(worst_case(svc, r) for r in requests)
    cap = 3.5 * worst  # room for three worst cases at once; actual costs are far lower, so more than 3 run
    batch = ok(api("POST", "/v1/batches", key, json_body={"requests": requests, "max_cost_usd": cap}))
    item = finish(svc, batch["id"], timeout=60)
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert shown["status"] == "cancelled", shown
    assert shown["error"]["code"] == "max_cost_reached", shown
    assert f"{cap:.6g}" in shown["error"]["message"]
    spent = shown["cost_usd"]
    assert 0 < spent <= cap
    # It stopped only when the next request could pass the cap beside what had been spent.
    assert spent + worst > cap - 1e-9
    counts = shown["request_counts"]
    assert 3 < counts["completed"] < 30 and counts["failed"] == 0, counts
    assert sim_requests(sim_control) == counts["completed"]  # nothing started that was not counted
    results = ok(api("GET", f"/v1/batches/{batch['id']}/results", key, query={"limit": 100}))["data"]
    assert {r["status"] for r in results} == {"completed", "cancelled"}
    # Spend as the simulator reported each answer's usage, at the catalog's prices (and the ledger's invariants).
    assert_ledger_consistent(svc, batch["id"], Principal(key_hash="", account=account))
    assert item["committed_usd"] == pytest.approx(spent, rel=1e-9)


def test_a_message_batch_stops_at_its_cap_with_canceled_requests(api, svc):
    _, key = new_key(svc)
    messages = Messages(api, key)
    cap = 0.00012  # max_tokens 64: about 27 microdollars at worst each, a few microdollars each in fact
    batch = ok(messages("POST", json_body={"requests": [entry(f"m-{i}") for i in range(40)], "max_cost_usd": cap}))
    finish(svc, batch["id"], timeout=60)
    shown = ok(messages("GET", f"/{batch['id']}"))
    assert shown["processing_status"] == "ended"
    assert shown["error"]["code"] == "max_cost_reached", shown
    assert 0 < shown["cost_usd"] <= cap
    counts = shown["request_counts"]
    assert counts["canceled"] > 0 and counts["succeeded"] > 0 and counts["errored"] == 0, counts
    lines = messages.results(batch["id"])
    assert {line["result"]["type"] for line in lines} == {"succeeded", "canceled"}


def test_a_raised_cap_lets_the_batch_claim_again(api, svc):
    """`Batch.set_cap`, the one write a retry with a higher cap makes before it queues requests again."""
    from batchinfer.records import Batch
    from batchinfer.scheduling.dispatcher import Dispatcher

    _, key = new_key(svc)
    requests = capped_requests(4)
    worst = worst_case(svc, requests[0])
    batch = ok(api("POST", "/v1/batches", key, json_body={"requests": requests, "max_cost_usd": worst * 1.5}))
    Dispatcher(svc).pass_once()
    assert svc.table.get(*batch_key(batch["id"]))["lanes"][GLM]["next"] == 1  # one worst case fits
    Batch.set_cap(svc.table, batch["id"], worst * 10)
    Dispatcher(svc).pass_once()
    assert svc.table.get(*batch_key(batch["id"]))["lanes"][GLM]["next"] == 4
    assert ok(api("GET", f"/v1/batches/{batch['id']}", key))["max_cost_usd"] == pytest.approx(worst * 10)


def test_a_capped_file_batch_with_a_line_without_a_worst_case_fails_validation_naming_the_cap(api, svc,
                                                                                              sim_control):
    _, key = new_key(svc)
    image = line("pic", max_tokens=5)
    image["body"]["messages"] = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]
    uploaded = ok(upload(api, key, jsonl(line("a", max_tokens=5), image)))
    error(create_from(api, key, uploaded["id"], max_cost_usd="1"), 400, "max_cost_usd", param="max_cost_usd")
    batch = ok(create_from(api, key, uploaded["id"], max_cost_usd=1))
    assert batch["max_cost_usd"] == 1 and batch["status"] == "validating"
    finish(svc, batch["id"])
    failed = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert failed["status"] == "failed", failed
    [problem] = failed["errors"]["data"]
    assert problem["param"] == "max_cost_usd" and "custom_id 'pic'" in problem["message"], problem
    assert sim_requests(sim_control) == 0  # nothing of it ran


def test_a_retry_with_a_higher_cap_lets_a_batch_its_cap_stopped_go_on(api, svc, sim_control):
    account, key = new_key(svc)
    requests = capped_requests(12)
    worst = max(worst_case(svc, r) for r in requests)
    batch = ok(api("POST", "/v1/batches", key, json_body={"requests": requests, "max_cost_usd": 2.5 * worst}))
    finish(svc, batch["id"], timeout=60)
    stopped = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert stopped["error"]["code"] == "max_cost_reached" and stopped["request_counts"]["completed"] < 12
    # A cap below what was spent, or on a batch made without one, names max_cost_usd and changes nothing.
    error(api("POST", f"/v1/batches/{batch['id']}/retry", key, json_body={"max_cost_usd": stopped["cost_usd"] / 2}),
          400, "spent", param="max_cost_usd")
    error(api("POST", f"/v1/batches/{batch['id']}/retry", key, json_body={"max_cost_usd": -1}), 400,
          param="max_cost_usd")
    assert ok(api("GET", f"/v1/batches/{batch['id']}", key))["status"] == "cancelled"

    cap = 100 * worst
    again = ok(api("POST", f"/v1/batches/{batch['id']}/retry", key, json_body={"max_cost_usd": cap}))
    assert again["status"] == "in_progress" and again["max_cost_usd"] == pytest.approx(cap)
    assert again["error"] is None and again["retry_count"] == 1
    finish(svc, batch["id"], timeout=60)
    done = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 12, "completed": 12, "failed": 0}
    assert 0 < done["cost_usd"] <= cap
    assert sim_requests(sim_control) == 12  # each request ran once over both runs
    assert_ledger_consistent(svc, batch["id"], Principal(key_hash="", account=account))


def test_a_retry_cannot_add_a_cap_to_a_batch_made_without_one(api, svc):
    _, key = new_key(svc)
    batch = ok(api("POST", "/v1/batches", key, json_body={"requests": capped_requests(2)}))
    finish(svc, batch["id"], timeout=60)
    ok(api("POST", f"/v1/batches/{batch['id']}/cancel", key))
    error(api("POST", f"/v1/batches/{batch['id']}/retry", key, json_body={"max_cost_usd": 1.0}), 400,
          "without a spending cap", param="max_cost_usd")


def dispatch_and_work(svc) -> None:
    """The dispatcher's and the workers' handlers, one round: no sweeper runs."""
    from local.lambda_runtime import invoke, sqs_event

    invoke("dispatcher", {"seconds": 0})  # one claim pass
    sqs = svc.queues.sqs
    for url in svc.queues.urls.values():
        arn = "arn:aws:sqs:us-east-1:000000000000:" + url.rsplit("/", 1)[-1]
        while got := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1).get("Messages", []):
            assert invoke("worker", sqs_event(arn, got)).get("batchItemFailures", []) == []
            sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])


def test_the_settle_that_leaves_the_cap_unreachable_stops_the_batch_without_the_sweeper(api, svc, sim_control,
                                                                                       monkeypatch):
    """What runs settles and the next request's worst case no longer fits beside what was spent: the batch
    ends `cancelled` with `max_cost_reached` from the dispatcher's and workers' own steps, no sweeper pass."""
    from batchinfer.service.background import sweep

    monkeypatch.setattr(sweep, "sweep_once", lambda *a, **k: pytest.fail("the sweeper ran"))
    account, key = new_key(svc)
    requests = capped_requests(30)
    worst = max(worst_case(svc, r) for r in requests)
    cap = 3.5 * worst
    batch = ok(api("POST", "/v1/batches", key, json_body={"requests": requests, "max_cost_usd": cap}))
    for _ in range(40):
        dispatch_and_work(svc)
        shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
        if shown["status"] == "cancelled":
            break
    assert shown["status"] == "cancelled" and shown["error"]["code"] == "max_cost_reached", shown
    assert shown["cancelled_at"] is not None and shown["cost_usd"] + worst > cap - 1e-9
    counts = shown["request_counts"]
    assert 3 < counts["completed"] < 30 and counts["failed"] == 0, counts
    assert sim_requests(sim_control) == counts["completed"]
    assert_ledger_consistent(svc, batch["id"], Principal(key_hash="", account=account))


def test_a_claim_finding_nothing_can_fit_stops_the_batch_at_once(api, svc, sim_control):
    """Not even the first request's worst case fits the cap: the dispatcher's first claim stops the batch
    (nothing of it runs) and it ends `cancelled` with `max_cost_reached`, every request unstarted, on both APIs."""
    account, key = new_key(svc)
    requests = capped_requests(3)
    cap = worst_case(svc, requests[0]) / 2
    batch = ok(api("POST", "/v1/batches", key, json_body={"requests": requests, "max_cost_usd": cap}))
    messages = Messages(api, key)
    capped = ok(messages("POST", json_body={"requests": [entry(f"m-{i}") for i in range(3)], "max_cost_usd": 1e-9}))
    from local.lambda_runtime import invoke

    invoke("dispatcher", {"seconds": 0})
    shown = ok(api("GET", f"/v1/batches/{batch['id']}", key))
    assert shown["status"] == "cancelled" and shown["error"]["code"] == "max_cost_reached", shown
    assert shown["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    results = ok(api("GET", f"/v1/batches/{batch['id']}/results", key))["data"]
    assert [r["status"] for r in results] == ["cancelled"] * 3
    ended = ok(messages("GET", f"/{capped['id']}"))
    assert ended["processing_status"] == "ended" and ended["error"]["code"] == "max_cost_reached", ended
    assert ended["request_counts"]["canceled"] == 3
    assert {line["result"]["type"] for line in messages.results(capped["id"])} == {"canceled"}
    assert sim_requests(sim_control) == 0
    assert_ledger_consistent(svc, batch["id"], Principal(key_hash="", account=account))
