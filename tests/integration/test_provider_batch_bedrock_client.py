"""The Bedrock batch tier client (model invocation jobs) against the simulated backend's control plane and moto's
S3: the input JSONL in the bucket holds each request's Converse body as a direct call sends it, the job is made
with the service role, a Converse invocation type, 24 hours and a token of the job's key (a create tried again
makes no second job, and the job is found again by its name), results are read in bounded pages from the
`.jsonl.out` file, per-record errors are a direct call's, and a stop keeps what was finished. A Titan text
model's embeddings go as InvokeModel records, one text each, and come back as a direct call's embeddings list."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from batchinfer.catalog import Model
from batchinfer.layout import PROVIDER_JOBS_INPUT_PREFIX
from batchinfer.providers.batch_tiers import Staging, TierError, min_requests, takes_request, tier_takes
from batchinfer.providers.batch_tiers import bedrock_jobs as tier

ROLE = "arn:aws:iam::123456789012:role/batchinfer-bedrock-batch"
MODEL_ID = "us.anthropic.claude-haiku-4-5-20251001-v1:0"


@pytest.fixture
def model(sim, sim_control):
    sim_control.post("/_sim/batches/reset")
    yield Model.model_validate({"id": "claude-bedrock", "backend": {
        "kind": "bedrock", "model_id": MODEL_ID, "region": "us-east-1", "endpoint_url": sim.url}})
    sim_control.post("/_sim/batches/reset")


@pytest.fixture
def staging(svc) -> Staging:
    return Staging(svc.blobs, ROLE)


def chat(i: int, text: str = "question", **extra) -> dict:
    return {"model": "claude-bedrock", "max_tokens": 16, "messages": [{"role": "user", "content": f"{text} {i}"}],
            **extra}


def lines(n: int, **extra) -> list[tuple[str, dict]]:
    return [(str(i), chat(i, **extra)) for i in range(n)]


def stats(sim_control) -> dict:
    return sim_control.get("/_sim/batches").json()["bedrock_jobs"]


def config(sim_control, **knobs) -> None:
    assert sim_control.put("/_sim/batches/config", json=knobs).status_code == 200


def test_a_job_runs_each_request_as_a_direct_converse_call_and_its_answers_are_shown_as_one(
        model, staging, sim_control):
    assert tier_takes(model, "/v1/chat/completions") and tier_takes(model, "/v1/messages")
    assert not tier_takes(model, "/v1/embeddings") and min_requests(model) == 100
    made = tier.submit(model, None, "job-1", "/v1/chat/completions", lines(100), staging=staging)
    assert made.provider_id.startswith("arn:aws:bedrock:") and "model-invocation-job/" in made.provider_id
    assert stats(sim_control) | {"by_status": None} == {
        "jobs": 1, "stops": 0, "records": 100, "by_status": None, "role_arns": [ROLE], "timeouts": [24],
        "invocation_types": ["Converse"]}
    [source] = staging.blobs.keys(PROVIDER_JOBS_INPUT_PREFIX)
    first = json.loads(staging.blobs.get(source).splitlines()[0])
    asked = [{"role": "user", "content": [{"text": "question 0"}]}]
    assert first == {"recordId": "0", "modelInput": {"messages": asked, "inferenceConfig": {"maxTokens": 16}}}
    ended = tier.look(model, None, made.provider_id)
    assert ended.ended and not ended.failed and ended.status == "Completed" and ended.output_file
    page = tier.results(model, None, ended.output_file, 0, 1000, staging=staging)
    assert page.next is None and sorted((a.key for a in page.answers), key=int) == [str(i) for i in range(100)]
    answer = page.answers[0]
    assert answer.attempt.ok and answer.attempt.input_tokens > 0 and answer.attempt.output_tokens > 0
    shown = tier.as_asked(model, "/v1/chat/completions", chat(int(answer.key)), answer.attempt)
    body = shown.body
    assert body["object"] == "chat.completion" and body["model"] == "claude-bedrock"
    assert body["choices"][0]["message"]["content"].startswith(f"Simulated answer from {MODEL_ID} to: question")
    assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (shown.input_tokens,
                                                                                    shown.output_tokens)
    message = tier.as_asked(model, "/v1/messages", chat(0), answer.attempt).body
    assert message["type"] == "message" and message["content"][0]["type"] == "text"


def test_titan_embeddings_go_as_invoke_model_records_one_text_each_and_come_back_as_an_embeddings_list(
        sim, staging, sim_control):
    titan, cohere = (Model.model_validate({"id": name, "endpoints": ["/v1/embeddings"], "backend": {
        "kind": "bedrock", "model_id": model_id, "region": "us-east-1", "endpoint_url": sim.url,
        "embedding_format": embedding_format}})
        for name, model_id, embedding_format in (("titan", "amazon.titan-embed-text-v2:0", "titan"),
                                                 ("cohere", "cohere.embed-english-v3", "cohere")))
    assert tier_takes(titan, "/v1/embeddings") and not tier_takes(cohere, "/v1/embeddings")
    texts = [(str(i), {"model": "titan", "input": f"text {i}" if i % 2 else [f"text {i}"], "dimensions": 256})
             for i in range(100)]
    assert all(takes_request(titan, "/v1/embeddings", body) for _, body in texts)
    assert not takes_request(titan, "/v1/embeddings", {"model": "titan", "input": ["one", "two"]})
    assert not takes_request(titan, "/v1/embeddings", {"model": "titan", "input": [[1, 2]]})  # token arrays
    assert not takes_request(titan, "/v1/embeddings", {"model": "titan", "input": "x", "unknown": 1})

    made = tier.submit(titan, None, "job-embed", "/v1/embeddings", texts, staging=staging)
    assert stats(sim_control)["invocation_types"] == ["InvokeModel"]
    [source] = staging.blobs.keys(PROVIDER_JOBS_INPUT_PREFIX)
    records = [json.loads(line) for line in staging.blobs.get(source).splitlines()]
    assert records[:2] == [{"recordId": "0", "modelInput": {"inputText": "text 0", "dimensions": 256}},
                           {"recordId": "1", "modelInput": {"inputText": "text 1", "dimensions": 256}}]
    output = tier.look(titan, None, made.provider_id).output_file
    answers = {a.key: a.attempt for a in tier.results(titan, None, output, 0, 1000, staging=staging).answers}
    assert len(answers) == 100 and answers["5"].input_tokens == 2 and answers["5"].output_tokens == 0
    shown = tier.as_asked(titan, "/v1/embeddings", dict(texts[5][1], encoding_format=None), answers["5"])
    assert shown.body == {"object": "list", "model": "titan", "usage": {"prompt_tokens": 2, "total_tokens": 2},
                          "data": [{"object": "embedding", "index": 0, "embedding": answers["5"].body["embedding"]}]}
    broken = tier.as_asked(titan, "/v1/embeddings", texts[5][1], replace(answers["5"], body={"vector": []}))
    assert broken.status_code == 502 and broken.input_tokens == 2  # it ran: its cost counts


def test_a_create_tried_again_makes_no_second_job_and_the_job_is_found_by_its_name(model, staging, sim_control):
    config(sim_control, never_finish=True)
    assert tier.find(model, None, "job-f") is None
    made = tier.submit(model, None, "job-f", "/v1/chat/completions", lines(100), staging=staging)
    again = tier.submit(model, None, "job-f", "/v1/chat/completions", lines(100), staging=staging)
    assert again.provider_id == made.provider_id and stats(sim_control)["jobs"] == 1
    assert tier.find(model, None, "job-f") == tier.look(model, None, made.provider_id)
    assert tier.find(model, None, "job-other") is None
    assert tier.job_name("job-f") != tier.job_name("job-other")


def test_large_output_is_read_in_pages_each_from_where_the_last_ended(model, staging):
    made = tier.submit(model, None, "job-big", "/v1/chat/completions", lines(450), staging=staging)
    output = tier.look(model, None, made.provider_id).output_file
    keys, cursor, pages = [], 0, 0
    while cursor is not None:
        page = tier.results(model, None, output, cursor, 200, staging=staging)
        assert len(page.answers) <= 200
        keys += [a.key for a in page.answers]
        cursor, pages = page.next, pages + 1
    assert pages == 3 and sorted(keys, key=int) == [str(i) for i in range(450)]


def test_record_errors_are_a_direct_calls_and_a_record_never_run_is_not_in_the_output(model, staging):
    job = lines(100)
    job[0] = ("0", chat(0, "refused [[sim:400]]"))
    job[1] = ("1", chat(1, "flaky [[sim:tier-500]]"))
    job[2] = ("2", chat(2, "late [[sim:batch-expired]]"))
    made = tier.submit(model, None, "job-err", "/v1/chat/completions", job, staging=staging)
    output = tier.look(model, None, made.provider_id).output_file
    answers = {a.key: a.attempt for a in tier.results(model, None, output, 0, 1000, staging=staging).answers}
    assert answers["0"].status_code == 400 and answers["0"].message == "Amazon Bedrock: Simulated batch line error 400"
    assert answers["1"].status_code == 500
    assert "2" not in answers and len(answers) == 99 and answers["3"].ok


def test_tools_structured_output_and_streaming_are_not_sent_to_a_job(model):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    assert takes_request(model, "/v1/chat/completions", chat(0))
    assert not takes_request(model, "/v1/chat/completions", chat(0, tools=[tool]))
    assert not takes_request(model, "/v1/chat/completions", chat(0, stream=True))
    structured = Model.model_validate({"id": "s", "backend": {
        "kind": "bedrock", "model_id": MODEL_ID, "region": "us-east-1", "features": ["structured_outputs"]}})
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    assert takes_request(structured, "/v1/chat/completions", chat(0))
    assert not takes_request(structured, "/v1/chat/completions", chat(0, response_format=schema))


def test_a_stop_ends_the_job_with_what_it_finished(model, staging, sim_control):
    config(sim_control, never_finish=True, answered_before_cancel=3)
    made = tier.submit(model, None, "job-s", "/v1/chat/completions", lines(100), staging=staging)
    assert tier.look(model, None, made.provider_id).status == "InProgress"
    assert tier.cancel(model, None, made.provider_id).status == "Stopping"
    ended = tier.look(model, None, made.provider_id)
    assert ended.ended and not ended.failed and ended.status == "Stopped" and stats(sim_control)["stops"] == 1
    answers = tier.results(model, None, ended.output_file, 0, 1000, staging=staging).answers
    assert sorted(a.key for a in answers) == ["0", "1", "2"]
    assert tier.cancel(model, None, made.provider_id).status == "Stopped"  # ended: nothing more to stop


def test_a_job_too_small_or_failing_as_a_whole_and_no_role(model, staging, sim_control):
    with pytest.raises(TierError, match="fewer than the 100"):
        tier.submit(model, None, "job-small", "/v1/chat/completions", lines(99), staging=staging)
    with pytest.raises(TierError, match="BEDROCK_BATCH_ROLE_ARN"):
        tier.submit(model, None, "job-r", "/v1/chat/completions", lines(100), staging=Staging(staging.blobs))
    config(sim_control, fail_jobs=True)
    made = tier.submit(model, None, "job-x", "/v1/chat/completions", lines(100), staging=staging)
    ended = tier.look(model, None, made.provider_id)
    assert ended.ended and ended.failed and ended.message == "Simulated job failure"
    assert tier.results(model, None, ended.output_file, 0, 10, staging=staging).answers == []
    with pytest.raises(TierError, match="ResourceNotFoundException"):
        tier.look(model, None, made.provider_id + "x")


def test_records_longer_than_a_range_are_read_whole_one_page_after_another(model, staging, monkeypatch):
    made = tier.submit(model, None, "job-long", "/v1/chat/completions", lines(100), staging=staging)
    output = tier.look(model, None, made.provider_id).output_file
    monkeypatch.setattr(tier, "RANGE_BYTES", 64)  # every record is longer than a range
    keys, cursor = [], 0
    while cursor is not None:
        page = tier.results(model, None, output, cursor, 30, staging=staging)
        assert 1 <= len(page.answers) <= 30
        keys += [a.key for a in page.answers]
        cursor = page.next
    assert sorted(keys, key=int) == [str(i) for i in range(100)]
