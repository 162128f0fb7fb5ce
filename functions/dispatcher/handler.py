"""Dispatcher function: scheduled every minute; refills free slots until the next run takes over."""

from aws_lambda_powertools.metrics import MetricUnit

from batchinfer.catalog import METRIC_REQUESTS_DISPATCHED
from batchinfer.observability import logger, metrics, tracer
from batchinfer.runtime import services
from batchinfer.service.dispatch import Dispatcher


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: object) -> dict:
    svc = services()
    seconds = float(event.get("seconds", svc.settings.dispatcher_loop_seconds)) if isinstance(event, dict) else 0
    sent = Dispatcher(svc).run(seconds)
    metrics.add_metric(name=METRIC_REQUESTS_DISPATCHED, unit=MetricUnit.Count, value=sent)
    return {"dispatched": sent}
