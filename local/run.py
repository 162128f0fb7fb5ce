"""`make run`: the whole service on this machine, no AWS and no model keys needed.

A moto server stands in for DynamoDB, S3 and SQS; the simulated backend serves the default catalog;
the dispatcher and sweeper handlers run on their schedule; the worker handler is fed from the per-model
queues as an SQS event source mapping would; the API runs under uvicorn. Ctrl-C stops everything.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")

from batchinfer.api.app import create_app  # noqa: E402
from batchinfer.runtime import build_services, use_services  # noqa: E402
from batchinfer.service import accounts  # noqa: E402
from batchinfer.settings import Settings  # noqa: E402
from batchinfer.storage import bootstrap  # noqa: E402
from batchinfer.storage.aws import client, clients_for  # noqa: E402
from local.lambda_runtime import Loops  # noqa: E402
from local.servers import MotoServer, UvicornThread  # noqa: E402
from local.simulated_backend import SimConfig  # noqa: E402
from local.simulated_backend import create_app as create_sim  # noqa: E402

STATE = Path(".local")
# The service role the simulated backend's Bedrock batch jobs are created with (it checks the ARN's shape only).
LOCAL_BEDROCK_BATCH_ROLE = "arn:aws:iam::123456789012:role/batchinfer-local-bedrock-batch"


def start(settings: Settings, moto_port: int, sim_port: int, sim_config: SimConfig | None = None,
          pollers: int = 0, state_dir: Path = STATE, api_url: str | None = None):
    """Start every piece; returns (services, api key, stop function). Used by `make run` and e2e tests.
    `api_url`: where the caller serves the API, written to the stack file for batchctl's user commands."""
    moto = MotoServer(moto_port).start()
    sim = UvicornThread(create_sim(sim_config, s3_endpoint_url=moto.url), sim_port).start()
    settings = settings.model_copy(update={"aws_endpoint_url": moto.url})
    ddb, s3, sqs = clients_for(settings)
    bootstrap.create_table(ddb, settings.table_name)
    bootstrap.create_bucket(s3, settings.bucket_name)
    env = {**os.environ, "SIMULATED_BACKEND_URL": os.environ.get("SIMULATED_BACKEND_URL", sim.url)}
    probe = build_services(settings, env)
    urls = bootstrap.create_queues(sqs, settings.stage, [m.id for m in probe.catalog.runnable],
                                   visibility_seconds=900)  # > a worker invocation (FakeContext: 300 s)
    webhook_queue = bootstrap.create_webhook_queue(sqs, settings.stage)
    bootstrap.create_webhook_key(client("kms", settings.aws_endpoint_url, settings.aws_region),
                                 settings.webhook_key_id)
    settings = settings.model_copy(update={"model_queues": urls, "webhook_queue_url": webhook_queue})
    svc = build_services(settings, env)
    use_services(svc)
    account = accounts.create_account(svc, tier="internal", batch_access=True, daily_quota_usd=1000.0)
    key = accounts.create_key(svc, account["id"])
    state_dir.mkdir(exist_ok=True)
    (state_dir / "api-key").write_text(key + "\n")
    # The settings batchctl admin needs (it reads them as Settings), and the API's URL for the user commands.
    (state_dir / "stack.json").write_text(json.dumps({
        "aws_endpoint_url": settings.aws_endpoint_url, "table_name": settings.table_name,
        "bucket_name": settings.bucket_name, "model_queues": urls, "stage": settings.stage,
        **({"api_url": api_url} if api_url else {})}, indent=2))
    # Like an event source mapping's MaximumConcurrency (the model's budget): as many concurrent worker
    # invocations per queue as the model may have requests in flight, unless told otherwise.
    per_queue = {m.id: pollers or max(2, m.batch_budget) for m in svc.catalog.runnable}
    loops = Loops(sqs, urls, pollers_per_queue=per_queue, webhook_queue_url=webhook_queue)
    loops.start()

    def stop() -> None:
        loops.stop()
        sim.stop()
        moto.stop()

    return svc, key, stop


def local_settings() -> Settings:
    """The settings of `make run`: the environment's, with the extensions that are built on unless the
    environment says otherwise (a deployment turns them on in its config)."""
    settings = Settings()
    built: dict[str, object] = {
        name: True for name in ("file_batches_enabled", "message_batches_enabled", "batch_webhooks_enabled",
                                "embeddings_responses_batches_enabled", "interactive_streaming_enabled",
                                "api_docs_enabled")
        if name not in settings.model_fields_set}
    if "bedrock_batch_role_arn" not in settings.model_fields_set:  # the simulated Bedrock jobs take any role
        built["bedrock_batch_role_arn"] = LOCAL_BEDROCK_BATCH_ROLE
    return settings.model_copy(update=built) if built else settings


def main() -> None:
    settings = local_settings()
    moto_port, sim_port = settings.moto_port, settings.sim_port
    base = f"http://127.0.0.1:{settings.port}/v1"
    svc, key, stop = start(settings, moto_port, sim_port, pollers=settings.local_pollers_per_queue, api_url=base)
    print(f"""
Batch inference is running locally (Ctrl-C stops it).
  API base URL       {base}   (OpenAI SDK: base_url={base})
  Anthropic base URL http://127.0.0.1:{settings.port}/anthropic   (Anthropic SDK: base_url=...)
  API key            {key}   (also in .local/api-key)
  moto (AWS)         http://127.0.0.1:{moto_port}
  simulated backend  http://127.0.0.1:{sim_port}  (a test double: deterministic answers, not a model)
  models             {", ".join(m.id for m in svc.catalog.runnable)}

  export FREEINFERENCE_API_KEY=$(cat .local/api-key)
  curl {base}/batches -H "Authorization: Bearer $FREEINFERENCE_API_KEY"
  ./batchctl submit requests.jsonl --wait -o results.jsonl   (./batchctl list, status, results ...)
""", flush=True)
    api = UvicornThread(create_app(), settings.port, log_level=settings.log_level.lower())
    try:
        api.server.run()  # in the foreground: uvicorn handles Ctrl-C
    finally:
        stop()
        print("stopped", file=sys.stderr)


if __name__ == "__main__":
    main()
