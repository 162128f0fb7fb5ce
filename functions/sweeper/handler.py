"""Sweeper function: expiry, cancel completion, final statuses, retention and lease recovery."""

import time

from aws_lambda_powertools.metrics import MetricUnit

from batchinfer.catalog import METRIC_SWEEP_LAG
from batchinfer.observability import logger, metrics, tracer
from batchinfer.runtime import services
from batchinfer.service.background.sweep import Overdue, sweep_once

STOP_BEFORE_TIMEOUT_SECONDS = 15


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: object) -> dict:
    # Long steps (result files, exports) stop well before the invocation would time out; the next run
    # carries on where they stopped.
    deadline = time.monotonic() + context.get_remaining_time_in_millis() / 1000 - STOP_BEFORE_TIMEOUT_SECONDS
    overdue = Overdue()
    try:
        counts = sweep_once(services(), deadline=deadline, overdue=overdue)
    finally:
        # What the run saw before a step failed counts too; a run that looked at nothing emits none (the
        # sweeper-lag alarm treats missing data as breaching: a sweeper that never gets this far is behind).
        if overdue.seconds is not None:
            metrics.add_metric(name=METRIC_SWEEP_LAG, unit=MetricUnit.Seconds, value=overdue.seconds)
    for name, value in counts.items():
        metric = "WebhookEventsResent" if name == "webhook_events_resent" else f"Batches{name.capitalize()}"
        metrics.add_metric(name=metric, unit=MetricUnit.Count, value=value)
    return counts
