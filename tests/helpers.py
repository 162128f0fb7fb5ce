"""Helpers for tests: services on moto, accounts, driving the pipeline step by step, and what the API tests
assert of an answer (`ok`, the two error envelopes)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from batchinfer.catalog import DEFAULT_MODELS_FILE
from batchinfer.layout import batch_key
from batchinfer.runtime import Services, build_services, use_services
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service import accounts
from batchinfer.service.background.sweep import sweep_once
from batchinfer.settings import Settings
from batchinfer.storage import bootstrap
from batchinfer.storage.aws import client, clients_for
from local.lambda_runtime import invoke, poll_once, sqs_event
from tests.integration.apigw import Reply


def make_services(sim_url: str, **overrides) -> Services:
    settings = Settings(**{"table_name": "batchinfer-test", "bucket_name": "batchinfer-test", "stage": "test",
                           "backend_timeout_seconds": 5.0, "retry_base_seconds": 0.0, "retry_max_seconds": 0.0,
                           # Tests step the pipeline one stage at a time; pulling is tested on its own.
                           "worker_pull": False,
                           # Tests step the clock and sweep when they mean to recover; the look's pace is
                           # tested on its own.
                           "lease_scan_seconds": 0, **overrides})
    ddb, s3, sqs = clients_for(settings)
    bootstrap.create_table(ddb, settings.table_name)
    bootstrap.create_bucket(s3, settings.bucket_name)
    env = {"SIMULATED_BACKEND_URL": sim_url}
    probe = build_services(settings, env)
    urls = bootstrap.create_queues(sqs, settings.stage, [m.id for m in probe.catalog.runnable])
    webhook_queue = bootstrap.create_webhook_queue(sqs, settings.stage)
    bootstrap.create_webhook_key(client("kms", settings.aws_endpoint_url, settings.aws_region), settings.webhook_key_id)
    settings = settings.model_copy(update={"model_queues": urls, "webhook_queue_url": webhook_queue})
    return build_services(settings, env)



@contextmanager
def services_in_use(previous: Services, sim_url: str, name: str, **overrides) -> Iterator[Services]:
    """Services on the same moto with a table and bucket of their own (`batchinfer-<name>`) and these settings:
    the ones the API handler uses until the block ends, then `previous` again."""
    services = make_services(sim_url, table_name=f"batchinfer-{name}", bucket_name=f"batchinfer-{name}", **overrides)
    use_services(services)
    try:
        yield services
    finally:
        use_services(previous)

def new_key(svc: Services, tier: str = "pro", **kwargs) -> tuple[dict, str]:
    account = accounts.create_account(svc, tier=tier, batch_access=kwargs.pop("batch_access", True), **kwargs)
    return account, accounts.create_key(svc, account["id"])


def chat_request(custom_id: str, content: str, model: str = "glm-5.3-flash", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}], **body}}


def step(svc: Services, dispatcher: Dispatcher | None = None, handler: bool = True) -> int:
    """One round of the pipeline: dispatch, run what is queued through the worker handler, sweep."""
    dispatcher = dispatcher or Dispatcher(svc)
    moved = dispatcher.pass_once()
    sqs = svc.queues.sqs
    for url in svc.queues.urls.values():
        while poll_once(sqs, url):
            moved += 1
    sweep_once(svc) if not handler else invoke("sweeper", {})
    return moved


def drive(svc: Services, batch_id: str, timeout: float = 30.0, clock_step: float = 0.0,
          step_once: Callable[[Services, Dispatcher], object] = step) -> dict:
    """Run the pipeline until the batch reaches a final status, a round (`step_once`) at a time."""
    dispatcher = Dispatcher(svc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        step_once(svc, dispatcher)
        batch = svc.table.get(*batch_key(batch_id))
        if batch is None or batch["status"] in ("completed", "failed", "expired", "cancelled"):
            return batch
        if clock_step:
            base = svc.clock
            svc.clock = lambda b=base, s=clock_step: b() + s
    raise AssertionError(f"batch {batch_id} did not finish in {timeout} s")


# --- The API tests' answers and steps ------------------------------------------------------------------

_UNSET = object()


def ok(reply: Reply, status: int = 200) -> dict:
    assert reply.status == status, f"{reply.status}: {reply.text}"
    assert reply.content_type.startswith("application/json"), reply.headers
    return reply.json()


# The batch object of the spec's "Create a batch" example: every field a user may rely on.
SPEC_BATCH_FIELDS = {
    "id", "object", "endpoint", "model", "errors", "input_file_id", "completion_window", "status", "output_file_id",
    "error_file_id", "created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
    "expired_at", "cancelling_at", "cancelled_at", "request_counts", "metadata", "usage", "cost_usd",
    "cost_unknown_attempts", "results_expires_at", "error",
    "paused_at",  # an extension (pause and resume): null unless paused
    "priority",  # an extension: the batch's priority among its account's batches
    "analytics",  # an extension: how the batch ran (rates, latencies, attempts, errors by code)
    "execution", "saved_usd",  # extensions: how its parts run (provider batch tiers) and what that saved
}


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error", 410: "gone_error",
               413: "request_too_large", 429: "rate_limit_error"}


def error(reply: Reply, status: int, *contains: str, message: str | None = None, code: object = _UNSET,
          param: object = _UNSET) -> dict:
    """Assert the OpenAI error envelope, exactly, and return its `error` object."""
    assert reply.status == status, f"expected {status}, got {reply.status}: {reply.text}"
    assert reply.content_type.startswith("application/json"), reply.headers
    body = reply.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert err["type"] == ERROR_TYPES[status], err
    if message is not None:
        assert err["message"] == message, err
    for part in contains:
        assert part in err["message"], (part, err)
    if code is not _UNSET:
        assert err["code"] == code, err
    if param is not _UNSET:
        assert err["param"] == param, err
    return err


def anthropic_error(reply: Reply, status: int, kind: str, *contains: str) -> dict:
    assert reply.status == status, f"expected {status}, got {reply.status}: {reply.text}"
    body = reply.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind, body
    for part in contains:
        assert part in body["error"]["message"], (part, body)
    return body["error"]


def req(custom_id: str, content: str = "Hello", **kwargs) -> dict:
    return chat_request(custom_id, content, **kwargs)


def tiny(i: int) -> dict:
    return {"custom_id": str(i), "body": {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": "x"}]}}


def settings(svc, **update) -> None:
    svc.settings = svc.settings.model_copy(update=update)


def sim_requests(sim_control) -> int:
    return sim_control.get("/_sim/stats").json()["total_requests"]


def step_by_record(svc, dispatcher: Dispatcher | None = None) -> None:
    """One round of the pipeline through the real worker and sweeper handlers: dispatch, run every queued
    message, sweep. Unlike `step`, the worker gets one record per invocation (an event source
    mapping with batch size 1): the worker runs the records of one invocation concurrently in threads, and
    in-process moto is not thread-safe (its transact_write_items deep-copies and, on any failure, restores whole
    tables), which makes multi-record polls flaky here."""
    (dispatcher or Dispatcher(svc)).pass_once()
    sqs = svc.queues.sqs
    for url in svc.queues.urls.values():
        arn = "arn:aws:sqs:us-east-1:000000000000:" + url.rsplit("/", 1)[-1]
        while True:
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1,
                                      AttributeNames=["ApproximateReceiveCount"]).get("Messages", [])
            if not got:
                break
            failures = invoke("worker", sqs_event(arn, got)).get("batchItemFailures", [])
            assert failures == [], failures
            sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    invoke("sweeper", {})


def finish(svc, batch_id: str, timeout: float = 600.0, passes: int = 200, clock_step: float = 0.0) -> dict:
    """Run the pipeline until the batch reaches a final status, one record at a time (`step_by_record`).

    Bounded by passes of the pipeline, not by seconds: a busy machine makes each pass slower, never more of
    them. `timeout` only stops a pipeline that hangs. `clock_step`: how far the services' clock (one a test
    moves, `harness.Clock`) moves after each pass, so that work due later (a provider job looked at on its
    schedule, a step tried again) comes in passes rather than in real seconds spent sweeping."""
    dispatcher = Dispatcher(svc)
    deadline = time.monotonic() + max(timeout, 600.0)
    for _ in range(passes):
        step_by_record(svc, dispatcher)
        batch = svc.table.get(*batch_key(batch_id))
        if batch is None or batch["status"] in ("completed", "failed", "expired", "cancelled"):
            return batch
        if time.monotonic() > deadline:
            break
        if clock_step:
            svc.clock.advance(clock_step)
    raise AssertionError(f"batch {batch_id} did not finish in {passes} passes of the pipeline")


def no_batches(api, key: str) -> bool:
    return ok(api("GET", "/v1/batches", key))["data"] == []


def s3_keys(svc, prefix: str = "batches/") -> list[str]:
    answer = svc.blobs.s3.list_objects_v2(Bucket=svc.settings.bucket_name, Prefix=prefix)
    return [o["Key"] for o in answer.get("Contents", [])]


def tick(svc, seconds: int = 1) -> None:
    base = svc.clock
    svc.clock = lambda: base() + seconds

SIM_REJECTED = {"error": {"message": "Request rejected by the simulated backend", "type": "invalid_request_error",
                          "param": None, "code": "sim_rejected"}}
CONTEXT_OVERFLOW = "the request exceeds the available context size, try increasing it"

# Members a backend adds to its answers, numbers spelt as llama-server spells them (`timings.*_per_second`
# whole floats with their ".0"), an exponent, an integer past 64 bits (and past DynamoDB's 38 digits), nested
# floats.
AS_SENT = ('"timings":{"prompt_n":12,"prompt_per_second":12500.0,"predicted_ms":1e-7,'
           '"big":123456789012345678901234567890123456789012,"nested":{"draft":[0.5,2.0,-0.0,1E+2]}}')


def check_as_sent(timings: dict) -> None:
    assert timings["prompt_per_second"] == 12500.0 and isinstance(timings["prompt_per_second"], float)
    assert timings["predicted_ms"] == 1e-7 and timings["big"] == 123456789012345678901234567890123456789012
    assert [type(x) for x in timings["nested"]["draft"]] == [float] * 4


def worker_dies_before_recording_the_job(monkeypatch) -> list[str]:  # noqa: ANN001
    """The first provider job step that would record the provider's job as running raises instead, as a worker
    dying between making the provider's job and recording it: the jobs it hit (their sort keys)."""
    from batchinfer.service.offloading import jobs

    real_state, died = jobs._state, []

    def dies_before_recording(svc_, job, state, **sets):  # noqa: ANN001, ANN202
        if state == "running" and not died:
            died.append(job["sk"])
            raise RuntimeError("the worker died before it recorded the provider's job")
        return real_state(svc_, job, state, **sets)

    monkeypatch.setattr(jobs, "_state", dies_before_recording)
    return died


def catalog_with(folder: Path, *models: dict) -> Path:
    """A models file in `folder`: the default catalog with these models added after its own."""
    catalog = yaml.safe_load(Path(DEFAULT_MODELS_FILE).read_text())
    catalog["models"].extend(models)
    path = folder / "models.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


def bedrock_embedder(model_id: str, bedrock_model_id: str, embedding_format: str, **fields) -> dict:
    """A catalog entry of an embeddings model on (the simulated) Bedrock: Titan text or Cohere embed bodies."""
    return {"id": model_id, "endpoints": ["/v1/embeddings"], "batch_budget": 2, "price": {"input_per_mtok": 0.13},
            "backend": {"kind": "bedrock", "model_id": bedrock_model_id, "region": "us-east-1",
                        "endpoint_url": "${SIMULATED_BACKEND_URL}", "embedding_format": embedding_format},
            **fields}
