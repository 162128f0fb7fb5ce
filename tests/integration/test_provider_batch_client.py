"""The OpenAI batch tier client against the simulated backend's Batches API: the input as it would be sent
directly (the backend's model name), a job found again by its key, and a large output read in bounded pages
that pick up where the last one ended."""

from __future__ import annotations

import pytest

from batchinfer.catalog import Model
from batchinfer.providers.batch_tiers import openai_batches


@pytest.fixture
def model(sim, sim_control):
    sim_control.post("/_sim/batches/reset")
    yield Model.model_validate({"id": "gpt-mini", "backend": {"kind": "openai", "base_url": f"{sim.url}/v1",
                                                              "model": "backend-name"}})
    sim_control.post("/_sim/batches/reset")


def chat(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 5}


def test_a_job_is_made_once_and_found_again_by_its_key(model, sim_control):
    made = openai_batches.submit(model, "k", "job-1", "/v1/chat/completions", [(str(i), chat(i)) for i in range(3)])
    assert openai_batches.find(model, "k", "job-1") == openai_batches.look(model, "k", made.provider_id)
    assert openai_batches.find(model, "k", "job-2") is None
    ended = openai_batches.look(model, "k", made.provider_id)
    assert ended.ended and not ended.failed and ended.output_file and ended.error_file is None
    page = openai_batches.results(model, "k", ended.output_file, 0, 10)
    assert sorted(a.key for a in page.answers) == ["0", "1", "2"] and page.next is None
    assert all(a.attempt.ok and a.attempt.body["model"] == "backend-name" for a in page.answers)


def test_a_large_output_is_read_in_pages_each_from_where_the_last_ended(model):
    made = openai_batches.submit(model, None, "job-big", "/v1/chat/completions",
                                 [(str(i), chat(i)) for i in range(450)])
    output = openai_batches.look(model, None, made.provider_id).output_file
    keys, cursor, pages = [], 0, 0
    while cursor is not None:
        page = openai_batches.results(model, None, output, cursor, 200)
        assert len(page.answers) <= 200
        keys += [a.key for a in page.answers]
        cursor, pages = page.next, pages + 1
    assert pages == 3 and sorted(keys, key=int) == [str(i) for i in range(450)]


def test_error_lines_keep_the_providers_status_and_body_and_never_run_lines_have_no_attempt(model):
    lines = [("0", {"messages": [{"role": "user", "content": "refused [[sim:400]]"}]}),
             ("1", {"messages": [{"role": "user", "content": "late [[sim:batch-expired]]"}]})]
    made = openai_batches.submit(model, None, "job-err", "/v1/chat/completions", lines)
    errors = openai_batches.look(model, None, made.provider_id).error_file
    answers = {a.key: a.attempt for a in openai_batches.results(model, None, errors, 0, 10).answers}
    assert answers["0"].status_code == 400 and answers["0"].body["error"]["code"] == "sim_rejected"
    assert answers["0"].body.text.startswith('{"error"')  # the body's text as the provider sent it
    assert answers["1"] is None
