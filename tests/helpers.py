"""Helpers for tests: services on moto, accounts, and driving the pipeline step by step."""

from __future__ import annotations

import time

from batchinfer.runtime import Services, build_services
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service import accounts
from batchinfer.service.background.sweep import sweep_once
from batchinfer.settings import Settings
from batchinfer.storage import bootstrap
from batchinfer.storage.aws import client, clients_for
from local.lambda_runtime import invoke, poll_once


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


def drive(svc: Services, batch_id: str, timeout: float = 30.0, clock_step: float = 0.0) -> dict:
    """Run the pipeline until the batch reaches a final status."""
    from batchinfer.layout import batch_key

    dispatcher = Dispatcher(svc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        step(svc, dispatcher)
        batch = svc.table.get(*batch_key(batch_id))
        if batch is None or batch["status"] in ("completed", "failed", "expired", "cancelled"):
            return batch
        if clock_step:
            base = svc.clock
            svc.clock = lambda b=base, s=clock_step: b() + s
    raise AssertionError(f"batch {batch_id} did not finish in {timeout} s")
