"""The ledger invariants every finished batch must satisfy, checked against the table, S3 and the read API.

`assert_ledger_consistent` is the one checker the fault suite runs after every scenario. It reads the
stored records directly (not only the batch's own counters) so that a counter that drifted from the
request records it summarises is caught.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter

from batchinfer.domain import (
    FINAL_BATCH,
    FINAL_REQUEST,
    RequestState,
    Stop,
    counts_as_failed_unstarted,
    final_status,
    unstarted_stop,
)
from batchinfer.layout import account_key, batch_key, file_key, file_object, requests_object, retry_due
from batchinfer.operations.anthropic import message_batches
from batchinfer.operations.openai import batches
from batchinfer.protocols import anthropic, of_batch
from batchinfer.protocols.anthropic import shapes
from batchinfer.records import Budget
from batchinfer.runtime import Services
from batchinfer.scheduling import capacity
from batchinfer.service.accounts import Principal
from batchinfer.service.reading import results as results_module

FINAL_RESULT = {"completed", "failed", "cancelled", "expired"}
# What a never-run request reads as, by final batch status.
NEVER_RUN = {"completed": None, "failed": "failed", "expired": "expired", "cancelled": "cancelled"}


def budget_of(svc: Services, model_id: str) -> dict:
    """The model's budget summed over its shards (as many as the settings give it now), with each shard's."""
    model = svc.catalog.lookup(model_id)
    shards = capacity.budget_shards(svc, model) if model else 1
    return Budget.get(svc.table, model_id, True, shards)


def counted_waiting(svc: Services, model_id: str) -> list[dict]:
    """The model's requests (of every batch) waiting for a retry and in its `waiting` count: each waiting item
    but those a pause put off (`uncounted`)."""
    keys = svc.table.query_all("due_pk = :d", {":d": retry_due(model_id)}, index="by_due")
    items = [svc.table.get(k["pk"], k["sk"]) for k in keys]
    return [i for i in items if i and i["state"] == RequestState.WAITING.value and not i.get("uncounted")]


def assert_waiting_count(svc: Services, model_id: str) -> None:
    """The model's `waiting` count, summed over its budget shards, is exactly its counted waiting requests."""
    waiting = budget_of(svc, model_id).get("waiting", 0)
    counted = counted_waiting(svc, model_id)
    assert waiting == len(counted), (f"model {model_id} waiting count {waiting}, requests waiting and counted "
                                     f"{len(counted)}", [(i["batch_id"], i["index"]) for i in counted])


def _close(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def stored_requests(svc: Services, batch_id: str) -> list[dict]:
    """The request items of a batch, straight from the table (pk BATCH#<id>, sk REQ#...)."""
    return list(svc.table.query_all("pk = :pk AND begins_with(sk, :r)", {":pk": f"BATCH#{batch_id}", ":r": "REQ#"},
                                    consistent=True))


def _submitted_custom_ids(svc: Services, batch_id: str) -> list[str]:
    """The custom ids in submission order: the index's (the bodies are stored in the order their lanes run),
    each checked against its body's own line."""
    raw = svc.blobs.get(requests_object(batch_id)) or b""
    total = int((svc.table.get(*batch_key(batch_id)) or {}).get("total", 0))
    entries = results_module.index_entries(svc, batch_id, 0, total) if total else []
    for entry in entries:
        if entry.model_id is not None:
            assert json.loads(raw[entry.offset:entry.offset + entry.length])["custom_id"] == entry.custom_id
    return [entry.custom_id for entry in entries if entry.model_id is not None]


def _all_results(svc: Services, who: Principal, batch_id: str, page_size: int) -> list[dict]:
    out: list[dict] = []
    after = None
    while True:
        page = batches.results_page(svc, who, batch_id, page_size, after)
        out += page["data"]
        if page["data"]:
            assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][-1]["id"]
        if not page["has_more"]:
            return out
        assert page["data"], "has_more with an empty page"
        after = page["last_id"]


def _file_lines(svc: Services, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    item = svc.table.get(*file_key(file_id))
    assert item is not None, f"result file {file_id} has no record"
    data = svc.blobs.get(file_object(file_id))
    assert data is not None, f"result file {file_id} has no bytes"
    assert item["bytes"] == len(data) and item["sha256"] == hashlib.sha256(data).hexdigest(), "size or SHA-256 off"
    lines = [json.loads(line) for line in data.splitlines()]
    assert lines, f"result file {file_id} is empty (it should be null instead)"
    return lines


def _assert_result_files(svc: Services, batch: dict, results: list[dict]) -> None:
    """A batch from a file: its output and error files hold one line per request between them, the output
    file every success as /results shows it, the error file every other request."""
    outputs = _file_lines(svc, batch.get("output_file_id"))
    errors = _file_lines(svc, batch.get("error_file_id"))
    by_id = {r["custom_id"]: r for r in results}
    seen = [line["custom_id"] for line in outputs + errors]
    assert sorted(seen) == sorted(by_id), "result files do not hold one line per request"
    for line in outputs:
        result = by_id[line["custom_id"]]
        assert result["status"] == "completed" and line == {
            "id": result["id"], "custom_id": result["custom_id"], "response": result["response"], "error": None}
    for line in errors:
        result = by_id[line["custom_id"]]
        assert result["status"] != "completed" and line["id"] == result["id"]
        assert (line["response"] is None) != (line["error"] is None), line
        if line["response"] is not None:
            assert line["response"]["status_code"] == result["error"]["status"], (line, result)
            assert line["response"]["request_id"] == result["error"].get("request_id"), (line, result)
            sent = result["error"].get("body")
            if isinstance(sent, dict) and isinstance(sent.get("error"), dict):  # the backend's error, as it sent it
                assert line["response"]["body"] == sent, (line, result)
            else:
                assert line["response"]["body"]["error"]["code"] == result["error"]["code"], (line, result)
        else:
            assert line["error"]["code"] == (result["error"] or {}).get("code", "batch_cancelled"), (line, result)


ANTHROPIC_RESULT = {"completed": "succeeded", "failed": "errored", "cancelled": "canceled", "expired": "expired"}


def _assert_message_batch_results(svc: Services, who: Principal, batch: dict, results: list[dict]) -> None:
    """A Message Batch's results stream: LF-terminated lines, none blank, one per request in order, each
    the Anthropic form of its result."""
    raw = b"".join(message_batches.results_lines(svc, who, batch["id"]))
    assert b"\r" not in raw and b"\n\n" not in raw and (not raw or raw.endswith(b"\n")), raw[:200]
    lines = [json.loads(line) for line in raw.split(b"\n")[:-1]]
    assert len(lines) == len(results)
    for line, result in zip(lines, results, strict=True):
        assert line["custom_id"] == result["custom_id"]
        assert line["result"]["type"] == ANTHROPIC_RESULT[result["status"]], (line, result)
        if result["status"] == "completed":
            assert line["result"]["message"] == result["response"]["body"]
            assert line["result"]["message"]["type"] == "message"
        elif result["status"] == "failed":
            error = line["result"]["error"]
            assert error["type"] == "error" and error["error"]["message"], line
            assert error["error"]["type"] in shapes.ERROR_TYPES, line
        else:
            assert set(line["result"]) == {"type"}, line


def _assert_counts_add_up(batch: dict, by_index: dict[int, dict], rejected: int, dispatched: int) -> None:
    """Each request's outcome is counted once: the batch's counters are exactly what its stored outcomes
    say, and they add up to its total. The stored outcomes are the request items (completed, failed, or
    unstarted with the stop they ended under in their error), the requests rejected at intake, and the
    requests its lanes never dispatched, which never become items: they end under the batch's stop (or, for
    a retried batch that left them as they were, `parked`'s)."""
    total = int(batch["total"])
    states = Counter(item["state"] for item in by_index.values())
    never = total - rejected - dispatched
    assert never >= 0, f"lanes dispatched {dispatched} of {total - rejected} requests"
    fate = Stop(batch["parked"]) if batch.get("parked") else Stop(batch["stop"]) if batch.get("stop") else None
    assert not never or fate is not None, f"{never} requests never dispatched in a batch ended without a stop"
    unrun = Counter(unstarted_stop(item.get("error")) for item in by_index.values()
                    if item["state"] == RequestState.UNSTARTED.value)
    if never:
        unrun[fate] += never
    failed_unrun = sum(n for stop, n in unrun.items() if counts_as_failed_unstarted(stop))
    expected = {"completed": states[RequestState.COMPLETED.value],
                "failed": rejected + states[RequestState.FAILED.value] + failed_unrun,
                "unstarted": sum(unrun.values())}
    counted = {name: int(batch.get(name, 0)) for name in expected}
    assert counted == expected, f"counts {counted}, stored outcomes {expected} ({never} never dispatched)"
    cancelled = sum(unrun.values()) - failed_unrun  # never run in a cancelled run: counted neither way
    assert counted["completed"] + counted["failed"] + cancelled == total, (counted, cancelled, total)


def assert_ledger_consistent(svc: Services, batch_id: str, who: Principal,
                             custom_ids: list[str] | None = None) -> dict:
    """Assert every property of a finished batch's ledger; returns the batch item for further checks.

    custom_ids: the custom_ids in the order the test submitted them (defaults to the stored submission).
    """
    batch = svc.table.get(*batch_key(batch_id))
    assert batch is not None, f"batch {batch_id} is gone"
    status = batch["status"]
    assert status in {s.value for s in FINAL_BATCH}, f"batch is not final: {status}"
    total = batch["total"]
    obj = batches.batch_object(batch)

    # --- Every request has exactly one final status --------------------------------------------------
    items = stored_requests(svc, batch_id)
    by_index: dict[int, dict] = {}
    for item in items:
        index = item["index"]
        assert 0 <= index < total, f"request index {index} outside 0..{total - 1}"
        assert index not in by_index, f"request {index} stored twice"
        by_index[index] = item
        assert item["state"] in {s.value for s in FINAL_REQUEST}, f"request {index} not final: {item['state']}"
        assert "due_pk" not in item, f"final request {index} still due in {item['due_pk']} (would be recovered)"
        assert 0 <= item.get("attempt", 0) <= svc.settings.max_attempts, f"request {index}: {item.get('attempt')}"
    rejected = {i for i, e in enumerate(results_module.index_entries(svc, batch_id, 0, total)) if e[1] is None}
    assert len(rejected) == batch.get("rejected", 0), (rejected, batch.get("rejected"))
    assert not rejected & set(by_index), "a request rejected at intake was dispatched"
    if status == "completed":
        assert len(by_index) == total - len(rejected), \
            f"completed batch with {total - len(rejected) - len(by_index)} requests never dispatched"
    dispatched = sum(int(lane["next"]) for lane in batch["lanes"].values())
    assert dispatched == len(by_index), f"lanes say {dispatched} dispatched, {len(by_index)} request items exist"

    # --- Results: paged and exported, every request once, in submission order -----------------------
    expected_ids = custom_ids if custom_ids is not None else _submitted_custom_ids(svc, batch_id)
    assert len(expected_ids) == total
    message_batch = of_batch(batch) is anthropic.PROTOCOL
    if message_batch:  # read as the Anthropic API shows them: one stream, once ended
        results = list(results_module.iter_results(svc, batch, 0, total))
        assert [r["custom_id"] for r in results] == expected_ids, "results not one each in submission order"
        _assert_message_batch_results(svc, who, batch, results)
    else:
        for page_size in (max(7, total // 3 + 1), 1000):  # several pages, then one
            results = _all_results(svc, who, batch_id, page_size)
            assert [r["custom_id"] for r in results] == expected_ids, "results not one each in submission order"
            assert [r["id"] for r in results] == [f"batch_req_{i + 1}" for i in range(total)]
        exported = [json.loads(line) for chunk in batches.export_lines(svc, who, batch_id)
                    for line in chunk.splitlines() if line.strip()]
        assert [e["custom_id"] for e in exported] == expected_ids, "export not one each in submission order"
        for line, result in zip(exported, results, strict=True):
            assert line == {k: result[k] for k in ("id", "custom_id", "response", "error")}, \
                "export differs from results"

    stop = batch.get("stop") or batch.get("parked")  # parked: never-run requests a retry left as they ended
    for index, result in enumerate(results):
        assert result["status"] in FINAL_RESULT, f"result {index} not final: {result['status']}"
        item = by_index.get(index)
        if result["status"] == "completed":
            assert item is not None and item["state"] == RequestState.COMPLETED.value
            assert result["error"] is None and result["response"]["status_code"] == 200, result
            assert "usage" in result["response"]["body"], result
        elif result["status"] == "cancelled":
            assert result["response"] is None and result["error"] is None, result
        else:
            assert result["response"] is None, result
            assert result["error"] and result["error"].get("code"), f"result {index} without an error code: {result}"
        if index in rejected:
            assert result["status"] == "failed" and result["error"]["message"], result
        elif item is None or item["state"] == RequestState.UNSTARTED.value:  # never ran
            # A retried batch's runs may have ended differently: each never-run request keeps the fate of the
            # run it ended in (its item's error says which; the undispatched ones a retry left: `parked`).
            ended = status
            if batch.get("retry_count") and item is not None:
                ended = final_status(unstarted_stop(item.get("error"))).value
            elif batch.get("retry_count") and batch.get("parked"):
                ended = final_status(Stop(batch["parked"])).value
            assert NEVER_RUN[ended] is not None, f"request {index} never ran in a {ended} batch"
            assert result["status"] == NEVER_RUN[ended], (index, ended, result)
            expected_code = {"failed": "batch_failed", "expired": "batch_expired"}.get(ended)
            if expected_code:
                assert result["error"]["code"] == expected_code, result
            else:
                assert result["error"] is None, result
        elif item["state"] == RequestState.FAILED.value:
            assert result["status"] == "failed", result
        if status != "cancelled" and not batch.get("retry_count"):
            assert result["status"] != "cancelled"
        if status != "expired" and not batch.get("retry_count"):
            assert result["status"] != "expired"
        earlier = batch.get("retry_count") and item is not None and item["state"] == RequestState.UNSTARTED.value
        if stop is None and not earlier:  # a retried batch's never-run items keep their earlier run's fate
            assert result["status"] in ("completed", "failed"), result

    if batch.get("input_file_id") and not batch.get("errors"):
        _assert_result_files(svc, batch, results)

    # --- Counts ---------------------------------------------------------------------------------------
    n_completed = sum(r["status"] == "completed" for r in results)
    n_failed = sum(r["status"] in ("failed", "expired") for r in results)  # expired ones count as failed
    if message_batch:
        counts = message_batches.request_counts(batch)
        assert counts == {"processing": 0, "succeeded": n_completed,
                          "errored": sum(r["status"] == "failed" for r in results),
                          "canceled": sum(r["status"] == "cancelled" for r in results),
                          "expired": sum(r["status"] == "expired" for r in results)}, counts
    else:
        counts = obj["request_counts"]
        assert counts == {"total": total, "completed": n_completed, "failed": n_failed}, \
            (counts, n_completed, n_failed)

    _assert_counts_add_up(batch, by_index, len(rejected), dispatched)

    # --- Usage and cost add up to the stored request records ----------------------------------------
    input_tokens = output_tokens = 0
    cost = saved = 0.0
    attempts = 0
    for item in by_index.values():
        attempts += item.get("attempt", 0) + item.get("earlier_attempts", 0)  # and those before a retry
        if item["state"] != RequestState.COMPLETED.value:
            continue  # failed attempts in these scenarios answer without usage
        usage = results_module.stored_response(svc, item)["body"]["usage"]
        prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
        completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
        input_tokens += prompt
        output_tokens += completion
        model = svc.catalog.get(item["model"])
        if item.get("tier_job"):  # landed from a provider job: at its tier's price, the difference saved
            cost += model.provider_batch.cost_usd(prompt, completion)
            saved += model.cost_usd(prompt, completion) - model.provider_batch.cost_usd(prompt, completion)
        else:
            cost += model.cost_usd(prompt, completion)
    assert obj["usage"]["input_tokens"] == input_tokens, (obj["usage"], input_tokens)
    assert obj["usage"]["output_tokens"] == output_tokens, (obj["usage"], output_tokens)
    assert obj["usage"]["total_tokens"] == input_tokens + output_tokens
    assert _close(batch.get("cost_usd", 0), cost), (batch.get("cost_usd"), cost)
    assert _close(batch.get("saved_usd", 0), saved), (batch.get("saved_usd"), saved)
    assert 0 <= obj["cost_unknown_attempts"] <= attempts, (obj["cost_unknown_attempts"], attempts)

    # --- A spending cap: never passed; what was committed is what was spent (and unknown costs' worst) ---
    if batch.get("max_cost_usd") is not None:
        cap, committed = float(batch["max_cost_usd"]), float(batch.get("committed_usd", 0))
        assert float(batch.get("cost_usd", 0)) <= cap, (batch.get("cost_usd"), cap)
        assert committed <= cap + 1e-9, (committed, cap)
        assert committed >= float(batch.get("cost_usd", 0)) - 1e-9, (committed, batch.get("cost_usd"))
        if not batch.get("cost_unknown_attempts"):
            assert _close(committed, float(batch.get("cost_usd", 0))), (committed, batch.get("cost_usd"))
    else:
        assert not batch.get("committed_usd"), batch.get("committed_usd")

    # --- Slots all given back; nothing open ------------------------------------------------------------
    groups = list(svc.table.query_all("pk = :pk AND begins_with(sk, :g)", {":pk": f"BATCH#{batch_id}", ":g": "GRP#"},
                                      consistent=True))
    assert not groups, f"groups left behind: {[g['sk'] for g in groups]}"
    assert batch.get("in_flight", 0) == 0, f"batch in_flight {batch.get('in_flight')}"
    assert batch.get("open", 0) == 0, f"batch open {batch.get('open')}"
    for model_id in batch["lanes"]:
        budget = budget_of(svc, model_id)
        assert budget.get("in_flight", 0) == 0, f"model {model_id} in_flight {budget.get('in_flight')}"
        assert all(shard["in_flight"] == 0 for shard in budget["shards"]), f"model {model_id} shards {budget}"
        lanes = list(svc.table.query_all("pk = :pk AND begins_with(sk, :l)",
                                         {":pk": f"MODEL#{model_id}", ":l": "LANE#"}, consistent=True))
        assert not [lane for lane in lanes if lane["batch_id"] == batch_id], f"lane of {model_id} left behind"
    for model_id in batch["lanes"]:
        assert_waiting_count(svc, model_id)
    account = svc.table.get(*account_key(batch["account_id"]))
    assert account.get("in_flight", 0) == 0, f"account in_flight {account.get('in_flight')}"

    # --- Account counters: only unfinished batches count (all of an account's batches are final here) ---
    owned = [o for prefix in ("BATCH#", "MSGBATCH#") for o in svc.table.query_all(
        "owner_pk = :o AND begins_with(owner_sk, :b)", {":o": f"ACCOUNT#{batch['account_id']}", ":b": prefix},
        index="by_owner")]
    owned = [svc.table.get(o["pk"], o["sk"]) for o in owned]
    unfinished = [b for b in owned if b and b["status"] not in {s.value for s in FINAL_BATCH}]
    assert account.get("unfinished_batches", 0) == len(unfinished), (account.get("unfinished_batches"), unfinished)
    assert account.get("unfinished_requests", 0) == sum(b["total"] for b in unfinished), \
        account.get("unfinished_requests")
    if not unfinished:
        assert account["unfinished_batches"] == 0 and account["unfinished_requests"] == 0

    # --- The account's daily usage records charge each batch's known cost once ----------------------
    usage_items = svc.table.query_all("pk = :pk AND begins_with(sk, :u)",
                                      {":pk": f"ACCOUNT#{batch['account_id']}", ":u": "USAGE#"}, consistent=True)
    charged = sum(float(u.get("cost_usd", 0)) for u in usage_items)
    assert _close(charged, sum(float(b.get("cost_usd", 0)) for b in owned if b)), charged
    return batch
