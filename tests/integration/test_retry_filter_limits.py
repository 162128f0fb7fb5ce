"""A retry's filter, whatever its size, is checked and stored within bounds: an entry no request could match
by its length is a 400 naming the filter; a filter too large for the batch item is kept in S3 and still
takes what it names; and a filter that takes nothing because nothing is left says both."""

from __future__ import annotations

import json

from batchinfer.layout import batch_key
from batchinfer.service.steering import retry as retry_module
from tests.helpers import anthropic_error, error, finish, new_key, ok, req, settings, sim_requests
from tests.integration.test_hostile_records import ANTHROPIC, MESSAGE_BATCH_PATHS, assert_records_bounded

FLAKY = "[[sim:flaky:1:500]] once"  # fails the first time this exact body is sent, then answers
PARAMS = {"model": "glm-5.3-flash", "max_tokens": 8}


def retry(api, key: str, batch_id: str, body: object):
    return api("POST", f"/v1/batches/{batch_id}/retry", key, json_body=body)


def message_batch(api, key: str, contents: dict[str, str]) -> dict:
    return ok(api("POST", "/v1/messages/batches", key, headers=ANTHROPIC, json_body={"requests": [
        {"custom_id": cid, "params": {**PARAMS, "messages": [{"role": "user", "content": text}]}}
        for cid, text in contents.items()]}))


def test_a_custom_id_longer_than_one_may_be_is_a_400_naming_the_filter(api, svc):
    settings(svc, message_batches_enabled=True, max_attempts=1)
    _, key = new_key(svc)
    batch = api.created(key, [req("ok-0"), req("bad", "[[sim:400]]")])
    finish(svc, batch["id"])
    too_long = "c" * 513
    said = error(retry(api, key, batch["id"], {"custom_ids": ["bad", too_long]}), 400,
                 "custom_ids[1]: a custom_id has 1 to 512 characters; this one has 513", param="custom_ids")
    assert len(said["message"]) < 200
    error(retry(api, key, batch["id"], {"error_codes": ["e" * 10_000]}), 400, "error_codes[0]", param="error_codes")
    # A custom_id of exactly 512 characters is one a request may have: a filter of it is read, and takes nothing.
    error(retry(api, key, batch["id"], {"custom_ids": ["c" * 512]}), 400, code="nothing_to_retry", param="custom_ids")
    messages = message_batch(api, key, {"m-0": "hi", "m-1": "[[sim:400]]"})
    finish(svc, messages["id"])
    for path in MESSAGE_BATCH_PATHS:
        reply = api("POST", f"{path}/{messages['id']}/retry", key, headers=ANTHROPIC,
                    json_body={"custom_ids": [too_long]})
        anthropic_error(reply, 400, "invalid_request_error", "custom_ids[0]", "512 characters")
    assert svc.table.get(*batch_key(batch["id"]))["status"] == "completed"  # nothing changed


def test_a_filter_that_takes_nothing_because_nothing_is_left_names_the_filter_and_says_so(api, svc):
    settings(svc, message_batches_enabled=True)
    _, key = new_key(svc)
    batch = api.created(key, [req("ok-0"), req("ok-1")])
    finish(svc, batch["id"])
    said = error(retry(api, key, batch["id"], {"custom_ids": ["ok-0"]}), 400, code="nothing_to_retry",
                 param="custom_ids")["message"]
    assert "custom_ids=['ok-0']" in said and "nothing is left to retry" in said, said
    said = error(retry(api, key, batch["id"], {"statuses": ["failed"]}), 400, code="nothing_to_retry",
                 param="statuses")["message"]
    assert "statuses=['failed']" in said and "succeeded, so nothing is left to retry" in said, said
    # Without a filter, only that nothing is left.
    said = error(retry(api, key, batch["id"], {}), 400, code="nothing_to_retry")["message"]
    assert said.startswith("Every request of batch") and "filter" not in said, said
    messages = message_batch(api, key, {"m-0": "hi"})
    finish(svc, messages["id"])
    for path in MESSAGE_BATCH_PATHS:
        reply = api("POST", f"{path}/{messages['id']}/retry", key, headers=ANTHROPIC,
                    json_body={"statuses": ["errored"]})
        message = anthropic_error(reply, 400, "invalid_request_error", "statuses=['errored']",
                                  "nothing is left to retry")["message"]
        assert len(message) < 300


def test_a_filter_too_large_for_the_batch_item_is_kept_aside_and_still_takes_what_it_names(api, svc, sim_control):
    settings(svc, max_attempts=1)
    _, key = new_key(svc)
    batch = api.created(key, [req("ok"), req("flaky", FLAKY), req("other", "[[sim:400]]")])
    finish(svc, batch["id"])
    sent = sim_requests(sim_control)
    names = ["flaky", *(f"{i:05d}" + "n" * 500 for i in range(2_000))]  # 1 MB of custom ids
    again = ok(retry(api, key, batch["id"], {"custom_ids": names}))
    assert again["status"] == "in_progress" and again["request_counts"]["failed"] == 1
    stored = svc.table.get(*batch_key(batch["id"]))
    assert_records_bounded(svc)
    walk = stored.get("retrying")
    if walk is not None:  # the walk is still going: its filter lies in S3, not in the item
        assert "filter" not in walk and walk["filter_object"].startswith(f"batches/{batch['id']}/")
        assert json.loads(svc.blobs.get(walk["filter_object"]))["custom_ids"][0] == "00000" + "n" * 500
    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and final["retry_count"] == 1
    assert sim_requests(sim_control) == sent + 1  # only "flaky" ran again: "other" was not named
    results = {r["custom_id"]: r["status"] for r in ok(api.results(key, batch["id"]))["data"]}
    assert results == {"ok": "completed", "flaky": "completed", "other": "failed"}


def test_a_walk_carried_on_by_the_sweeper_reads_a_filter_kept_aside(api, svc, sim_control, monkeypatch):
    settings(svc, max_attempts=1)
    monkeypatch.setattr(retry_module, "CALL_SECONDS", 0.0)  # the call re-queues nothing: the sweeper walks
    _, key = new_key(svc)
    batch = api.created(key, [req("flaky", FLAKY), req("other", "[[sim:400]]")])
    finish(svc, batch["id"])
    retry_module._filters.clear()  # a sweeper in another process, which never read it
    ok(retry(api, key, batch["id"], {"custom_ids": ["flaky", *(f"{i:03d}" + "x" * 509 for i in range(50))]}))
    stored = svc.table.get(*batch_key(batch["id"]))
    assert "filter_object" in stored["retrying"]
    retry_module._filters.clear()
    final = finish(svc, batch["id"])
    assert final["status"] == "completed"
    results = {r["custom_id"]: r["status"] for r in ok(api.results(key, batch["id"]))["data"]}
    assert results == {"flaky": "completed", "other": "failed"}
