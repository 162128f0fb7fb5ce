"""Dispatcher function: scheduled every minute; refills free slots until the next run takes over."""

from aws_lambda_powertools.metrics import MetricUnit

from batchinfer.catalog import METRIC_REQUESTS_DISPATCHED
from batchinfer.observability import logger, metrics, tracer
from batchinfer.runtime import services
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.service.steering.spending_cap import stop_if_reached

# A pass that starts just before the loop ends must finish (and the metrics flush) inside the invocation.
STOP_BEFORE_TIMEOUT_SECONDS = 10


def loop_seconds(event: object, context: object, configured: float) -> float:
    """How long this invocation keeps refilling: what the event or the setting asks, cut to the invocation's
    remaining time less a margin (a shorter timeout, or a late start, must not be overrun)."""
    wanted = float(event.get("seconds", configured)) if isinstance(event, dict) else 0.0
    remaining = context.get_remaining_time_in_millis() / 1000 - STOP_BEFORE_TIMEOUT_SECONDS
    return max(0.0, min(wanted, remaining))


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: object) -> dict:
    svc = services()
    # A capped batch its claims find can start nothing more stops (and settles) at once.
    dispatcher = Dispatcher(svc, stop_at_cap=lambda batch_id: stop_if_reached(svc, batch_id))
    sent = dispatcher.run(loop_seconds(event, context, svc.settings.dispatcher_loop_seconds),
                          time_left=lambda: context.get_remaining_time_in_millis() / 1000 - STOP_BEFORE_TIMEOUT_SECONDS)
    metrics.add_metric(name=METRIC_REQUESTS_DISPATCHED, unit=MetricUnit.Count, value=sent)
    return {"dispatched": sent}
