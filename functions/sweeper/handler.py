"""Sweeper function: expiry, cancel completion, final statuses, retention and lease recovery."""

from aws_lambda_powertools.metrics import MetricUnit

from batchinfer.observability import logger, metrics, tracer
from batchinfer.runtime import services
from batchinfer.service.sweep import sweep_once


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: object) -> dict:
    counts = sweep_once(services())
    for name, value in counts.items():
        metrics.add_metric(name=f"Batches{name.capitalize()}", unit=MetricUnit.Count, value=value)
    return counts
