"""A poisoned input file (huge values where only short ones are valid) is harmless: its batch ends `failed`
with its problems listed, clipped and summarized, in the sweep that validates it, and another account's file
batch created after it validates in that same sweep and runs to the end, while a third account's batch
expires on time. Nothing the poisoned file holds reaches a record whole."""

from __future__ import annotations

import json

from batchinfer.operations.openai import batches, files
from batchinfer.service.accounts import authenticate
from batchinfer.service.creating.validation import MAX_PROBLEM_CHARS, MAX_REPORTED_PROBLEMS
from local.lambda_runtime import invoke
from tests.faults.harness import GLM, account_counters, configure, get_batch, pump, submit, submit_file
from tests.helpers import chat_request, new_key
from tests.integration.test_hostile_records import assert_records_bounded
from tests.invariants import assert_ledger_consistent


def poisoned_lines() -> bytes:
    ok = {"custom_id": "ok", "method": "POST", "url": "/v1/chat/completions",
          "body": {"model": GLM, "messages": [{"role": "user", "content": "hi"}]}}
    lines = [{**ok, "custom_id": "method", "method": "X" * 600_000},
             {**ok, "custom_id": "url", "url": "/" + "u" * 300_000},
             {**ok, "custom_id": "keys", **{f"{i:03d}" + "k" * 297: "v" for i in range(500)}},
             *({**ok, "custom_id": f"bad-{i}", "method": "GET" * 2_000} for i in range(300))]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_a_poisoned_file_batch_fails_harmlessly_and_other_accounts_batches_run_on_time(svc, sim_control):
    configure(svc, file_batches_enabled=True, batch_completion_window_seconds=600)
    poisoner_account, poisoner_key = new_key(svc)
    poisoner = authenticate(svc, poisoner_key)
    upload = files.upload(svc, poisoner, filename="poison.jsonl", purpose="batch", data=poisoned_lines(),
                          expires_after=None)
    body = {"input_file_id": upload["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    poisoned, created = batches.create_batch(svc, poisoner, json.dumps(body).encode(), None)
    assert created and poisoned["status"] == "validating"
    # Another account's batch that will expire, and a third's file batch, created after the poisoned one.
    _, late_key = new_key(svc)
    late = authenticate(svc, late_key)
    expiring = submit(svc, late, [chat_request("e-0", "never runs")])
    _, other_key = new_key(svc)
    other = authenticate(svc, other_key)
    requests = [chat_request(f"o-{i}", f"question {i}", model=GLM) for i in range(5)]
    other_id = submit_file(svc, other, requests)
    svc.clock.advance(601)  # the expiring batch's window has closed before anything ran

    invoke("sweeper", {})  # one scheduled run, as deployed

    failed = get_batch(svc, poisoned["id"])
    assert failed["status"] == "failed" and not failed.get("awaiting_validation")
    problems = failed["errors"]["data"]
    assert len(problems) == MAX_REPORTED_PROBLEMS
    assert all(len(p["message"]) <= MAX_PROBLEM_CHARS + 3 for p in problems)
    assert [p["code"] for p in problems[:3]] == ["invalid_method", "url_mismatch", "invalid_request"]
    assert problems[-1]["message"] == "...and 204 more problems."  # 303 lines, 99 listed
    assert account_counters(svc, poisoner_account["id"])["unfinished_batches"] == 0  # its slot is free again
    assert get_batch(svc, expiring)["status"] == "expired"
    validated = get_batch(svc, other_id)
    assert validated.get("validated_at") and not validated.get("awaiting_validation")  # its lines admitted
    assert_records_bounded(svc)

    final = pump(svc, other_id)
    assert final["status"] == "completed" and final["completed"] == 5
    assert_ledger_consistent(svc, other_id, other, [r["custom_id"] for r in requests])
    # Later sweeps leave the failed batch as it is: its input is not read again.
    reads = []
    real_get = svc.blobs.get
    svc.blobs.get = lambda key: reads.append(key) or real_get(key)
    invoke("sweeper", {})
    assert not [key for key in reads if poisoned["id"] in key]
