"""Anthropic Message Batches with the official `anthropic` SDK, as a user calls them: per-request errors in one
batch, results only once ended, cancel, delete, idempotent create, and auto-paging of the listing.

Runs with either SDK major (2.x: `Authorization: Bearer`, anthropic-version 2026-10-21; 1.x: `X-Api-Key`,
2023-06-01). Needs FREEINFERENCE_ANTHROPIC_BASE_URL (e.g. http://127.0.0.1:8000/anthropic) and
FREEINFERENCE_API_KEY, of an account with no Message Batches yet. Prints one JSON object.
"""

import itertools
import json
import os
import time

import anthropic

client = anthropic.Anthropic(base_url=os.environ["FREEINFERENCE_ANTHROPIC_BASE_URL"],
                             api_key=os.environ["FREEINFERENCE_API_KEY"])
MODEL = "glm-5.3-flash"  # an OpenAI-compatible backend: each request is translated


def request(custom_id, content="Hello", model=MODEL, **extra):
    return {"custom_id": custom_id,
            "params": {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": content}],
                       **extra}}


def raised(call):
    """What a call raised: [class name, HTTP status or None, message], or None when it returned."""
    try:
        call()
    except anthropic.AnthropicError as exc:
        return [type(exc).__name__, getattr(exc, "status_code", None), str(exc)]
    return None


def wait_ended(batch_ids, timeout=45):
    deadline, ended = time.monotonic() + timeout, {}
    while len(ended) < len(batch_ids) and time.monotonic() < deadline:
        for batch_id in set(batch_ids) - set(ended):
            batch = client.messages.batches.retrieve(batch_id)
            if batch.processing_status == "ended":
                ended[batch_id] = batch
        time.sleep(0.2)
    return ended


def counts(batch):
    c = batch.request_counts
    return {"processing": c.processing, "succeeded": c.succeeded, "errored": c.errored, "canceled": c.canceled,
            "expired": c.expired}


out = {"anthropic": anthropic.__version__}

# One batch, some requests invalid: only those become errored results; the others run.
mixed = client.messages.batches.create(requests=[
    request("ok-1", "Summarize the plot of Hamlet in two sentences."),
    request("unknown-model", model="no-such-model"),
    request("sampling", temperature=0.5),  # a parameter at anthropic-version 2023-06-01 only
    request("thinking", thinking={"type": "enabled", "budget_tokens": 1024}),  # not on an OpenAI-kind backend
    request("ok-2", "Name three prime numbers."),
])
out["mixed_created"] = [mixed.processing_status, counts(mixed), mixed.results_url]

# A large batch, checked and cancelled right after it is created (it cannot have ended by then).
big_total = 200
big = client.messages.batches.create(requests=[request(f"big-{i}", f"Count to {i}.") for i in range(big_total)])
before = client.messages.batches.retrieve(big.id)
out["big_before_cancel"] = [before.processing_status, counts(before), before.results_url]
out["results_before_end"] = raised(lambda: list(client.messages.batches.results(big.id)))
out["delete_before_end"] = raised(lambda: client.messages.batches.delete(big.id))
cancelled = client.messages.batches.cancel(big.id)
out["big_after_cancel"] = [cancelled.processing_status, cancelled.cancel_initiated_at is not None]

# The same create twice with one Idempotency-Key (as a retry would send it): one batch.
once = [request("idem-0", "Once.")]
first = client.messages.batches.create(requests=once, extra_headers={"Idempotency-Key": "flows-idem-1"})
again = client.messages.batches.create(requests=once, extra_headers={"Idempotency-Key": "flows-idem-1"})
out["idempotent_ids"] = [first.id, again.id]
out["idempotent_conflict"] = raised(lambda: client.messages.batches.create(
    requests=[request("idem-1", "Something else.")], extra_headers={"Idempotency-Key": "flows-idem-1"}))

ended = wait_ended([mixed.id, big.id, first.id])
out["ended"] = sorted(ended) == sorted([mixed.id, big.id, first.id])

if mixed.id in ended:
    out["mixed_counts"] = counts(ended[mixed.id])
    out["mixed_results_url"] = ended[mixed.id].results_url
    # The batch's tokens and known cost: extension fields, which the SDK keeps as extra fields.
    usage = getattr(ended[mixed.id], "usage", None)
    out["mixed_spend"] = [usage if isinstance(usage, dict) or usage is None else usage.model_dump(),
                          getattr(ended[mixed.id], "cost_usd", None)]
    entries = []
    for entry in client.messages.batches.results(mixed.id):
        result = entry.result
        row = {"custom_id": entry.custom_id, "type": result.type}
        if result.type == "errored":
            row["error_type"], row["message"] = result.error.error.type, result.error.error.message
        elif result.type == "succeeded":
            row["text"] = "".join(b.text for b in result.message.content if b.type == "text")
            row["model"] = result.message.model
            row["tokens"] = [result.message.usage.input_tokens, result.message.usage.output_tokens]
        entries.append(row)
    out["mixed_results"] = entries

if big.id in ended:
    out["big_total"] = big_total
    out["big_final"] = counts(ended[big.id])
    out["big_result_types"] = [e.result.type for e in client.messages.batches.results(big.id)]
    out["big_result_ids"] = [e.custom_id for e in client.messages.batches.results(big.id)]


def listed(limit):
    # Cut off a few items past what exists, so a server that never ends the paging fails instead of hanging.
    return [b.id for b in itertools.islice(client.messages.batches.list(limit=limit), 10)]


# Newest first, one batch a page (the SDK follows after_id=<last_id> until has_more is false).
first_page = client.messages.batches.list(limit=1)
out["first_page"] = [len(first_page.data), first_page.has_more]
out["created_newest_first"] = [first.id, big.id, mixed.id]
out["listed_one_page"] = [b.id for b in client.messages.batches.list(limit=100).data]
out["listed_paged"] = listed(1)

# An ended batch can be deleted; then it reads as not found, and the listing no longer has it.
if first.id in ended:
    deleted = client.messages.batches.delete(first.id)
    out["deleted"] = [deleted.id, deleted.type]
    out["retrieve_deleted"] = raised(lambda: client.messages.batches.retrieve(first.id))
    out["listed_paged_after_delete"] = listed(1)

print(json.dumps(out))
