"""The Anthropic batch tier client (Message Batches) against the simulated backend: params as a direct call
sends them with the backend's model name and the key and version headers, a job found again after a create
whose answer was lost (and never by another job of the same size), results read in bounded pages, per-line
errors as a direct call's, and a cancel that keeps what was finished."""

from __future__ import annotations

import time

import pytest

from batchinfer.catalog import Model
from batchinfer.providers.batch_tiers import anthropic_batches as tier
from batchinfer.providers.batch_tiers import tier_takes


@pytest.fixture
def model(sim, sim_control):
    sim_control.post("/_sim/batches/reset")
    yield Model.model_validate({"id": "claude-sim", "backend": {"kind": "anthropic", "base_url": f"{sim.url}/v1",
                                                                "model": "backend-claude"}})
    sim_control.post("/_sim/batches/reset")


def params(i: int, text: str = "question") -> dict:
    return {"model": "claude-sim", "max_tokens": 5, "messages": [{"role": "user", "content": f"{text} {i}"}]}


def stats(sim_control) -> dict:
    return sim_control.get("/_sim/batches").json()["message_batches"]


def config(sim_control, **knobs) -> None:
    assert sim_control.put("/_sim/batches/config", json=knobs).status_code == 200


def all_pages(model, output: str, size: int) -> tuple[list, int]:
    answers, cursor, pages = [], 0, 0
    while cursor is not None:
        page = tier.results(model, "k", output, cursor, size)
        assert len(page.answers) <= size
        answers += page.answers
        cursor, pages = page.next, pages + 1
    return answers, pages


def test_a_job_runs_its_params_as_sent_directly_and_its_messages_land_with_usage(model, sim_control):
    assert tier_takes(model, "/v1/messages") and not tier_takes(model, "/v1/chat/completions")
    made = tier.submit(model, "secret", "job-1", "/v1/messages", [(str(i), params(i)) for i in range(3)])
    assert made.provider_id.startswith("msgbatch_") and stats(sim_control)["api_keys"] == ["secret"]
    ended = tier.look(model, "secret", made.provider_id)
    assert ended.ended and not ended.failed and ended.output_file and ended.error_file is None
    answers = tier.results(model, "secret", ended.output_file, 0, 10).answers
    assert sorted(a.key for a in answers) == ["0", "1", "2"]
    for answer in answers:
        attempt = answer.attempt
        assert attempt.ok and attempt.body["type"] == "message" and attempt.body["model"] == "backend-claude"
        assert (attempt.input_tokens, attempt.output_tokens) == (attempt.body["usage"]["input_tokens"],
                                                                attempt.body["usage"]["output_tokens"]) != (0, 0)
        assert attempt.body.text.startswith('{"id":"msg_')  # the message's text as the provider sent it


def test_a_large_output_is_read_in_pages_each_from_where_the_last_ended(model):
    made = tier.submit(model, "k", "job-big", "/v1/messages", [(str(i), params(i)) for i in range(450)])
    answers, pages = all_pages(model, tier.look(model, "k", made.provider_id).output_file, 200)
    assert pages == 3 and sorted((a.key for a in answers), key=int) == [str(i) for i in range(450)]


def test_errored_lines_are_a_direct_calls_errors_and_canceled_or_expired_ones_never_ran(model):
    lines = [("0", params(0, "refused [[sim:400]]")), ("1", params(1, "flaky [[sim:tier-500]]")),
             ("2", params(2, "late [[sim:batch-expired]]")), ("3", params(3))]
    made = tier.submit(model, "k", "job-err", "/v1/messages", lines)
    answers = {a.key: a.attempt for a in tier.results(model, "k", tier.look(model, "k", made.provider_id).output_file,
                                                      0, 10).answers}
    assert answers["0"].status_code == 400 and answers["0"].body["error"]["type"] == "invalid_request_error"
    assert answers["0"].message == "Simulated batch line error 400"
    assert answers["0"].body.text.startswith('{"type":"error"')  # the error's body as the provider sent it
    assert answers["1"].status_code == 500 and answers["1"].body["error"]["type"] == "api_error"
    assert answers["2"] is None and answers["3"].ok


def test_a_cancel_ends_the_job_with_what_it_finished_and_the_rest_canceled(model, sim_control):
    config(sim_control, never_finish=True, answered_before_cancel=2)
    made = tier.submit(model, "k", "job-c", "/v1/messages", [(str(i), params(i)) for i in range(5)])
    assert not tier.look(model, "k", made.provider_id).ended
    assert tier.cancel(model, "k", made.provider_id).status == "canceling"
    ended = tier.look(model, "k", made.provider_id)
    assert ended.ended and stats(sim_control)["cancels"] == 1
    answers = {a.key: a.attempt for a in tier.results(model, "k", ended.output_file, 0, 10).answers}
    assert [k for k, a in sorted(answers.items()) if a is not None] == ["0", "1"] and len(answers) == 5


def test_a_job_is_found_again_only_after_a_create_was_tried_and_never_another_jobs(model, sim_control):
    config(sim_control, never_finish=True)
    lines = [(str(i), params(i)) for i in range(3)]
    assert tier.find(model, "k", "job-f", count=3, since=None) is None  # no create tried: nothing listed
    tried = int(time.time())
    made = tier.submit(model, "k", "job-f", "/v1/messages", lines)
    assert tier.find(model, "k", "job-f", count=3, since=tried) == tier.look(model, "k", made.provider_id)
    assert tier.find(model, "k", "job-f", count=4, since=tried) is None  # not its size
    assert tier.find(model, "k", "job-f", count=3, since=tried - 3600) is None  # made long after that create
    # Ended, a batch of the same size made by another job is told apart by its lines' tag.
    config(sim_control, never_finish=False)
    other = tier.submit(model, "k", "job-other", "/v1/messages", lines)
    tier.cancel(model, "k", made.provider_id)
    found = tier.find(model, "k", "job-f", count=3, since=tried)
    assert found is not None and found.provider_id == made.provider_id != other.provider_id
    # And a line of another job is never taken for one of this job's requests.
    foreign = tier.look(model, "k", other.provider_id).output_file.rpartition("#")[0] + "#" + tier.tag_of("job-f")
    assert all(not a.key.isdigit() for a in tier.results(model, "k", foreign, 0, 10).answers)


def test_a_job_that_fails_as_a_whole_has_every_request_errored_retryable(model, sim_control):
    config(sim_control, fail_jobs=True)
    made = tier.submit(model, "k", "job-x", "/v1/messages", [(str(i), params(i)) for i in range(2)])
    ended = tier.look(model, "k", made.provider_id)
    assert ended.ended and ended.failed
    answers = tier.results(model, "k", ended.output_file, 0, 10).answers
    assert [a.attempt.status_code for a in answers] == [500, 500]
