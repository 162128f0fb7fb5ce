"""Worker function: the records of one SQS batch run concurrently; failures are reported per record."""

import json

from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit
from aws_lambda_powertools.utilities.batch import AsyncBatchProcessor, EventType, async_process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from batchinfer.catalog import METRIC_BACKEND_ERRORS, METRIC_REQUESTS_COMPLETED
from batchinfer.observability import item_failed, logger, metrics, metrics_with, tracer
from batchinfer.runtime import services
from batchinfer.service.running.run_request import process_and_pull

processor = AsyncBatchProcessor(event_type=EventType.SQS)
_seconds_left = {"value": 60.0}  # set per invocation from the Lambda context
# This invocation's per-model metrics ({service, model}), apart from `metrics` ({service}: the storage layer's
# counts, which the alarms read per function).
_per_model: dict[str, EphemeralMetrics] = {}


async def record_handler(record: SQSRecord) -> str:
    message = json.loads(record.body)
    try:
        outcome = await process_and_pull(services(), message, _seconds_left["value"])
    except Exception as error:
        # Logged with what the message names and counted; raised again, so that only this record goes back to
        # the queue (its leases recover what it held) while the others of the call run.
        item_failed("worker", str(message.get("batch_id") or record.message_id), "run", error, passed_over=False)
        raise
    model_metrics = _per_model["metrics"]
    if ended := outcome["completed"] + outcome["failed"]:
        model_metrics.add_metric(name=METRIC_REQUESTS_COMPLETED, unit=MetricUnit.Count, value=ended)
    if refused := outcome["waiting"] + outcome["failed"]:  # retries and final failures: the backend said no
        model_metrics.add_metric(name=METRIC_BACKEND_ERRORS, unit=MetricUnit.Count, value=refused)
    return json.dumps(outcome)


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: object) -> dict:
    _seconds_left["value"] = context.get_remaining_time_in_millis() / 1000
    records = event.get("Records") or []
    # One event source mapping per model queue: every record of a call names the same model.
    model = json.loads(records[0]["body"]).get("model", "unknown") if records else "unknown"
    _per_model["metrics"] = model_metrics = metrics_with(model=model)
    try:
        return async_process_partial_response(event=event, record_handler=record_handler, processor=processor,
                                              context=context)
    finally:
        if model_metrics.metric_set:  # what the records that ran counted, even if a later one raised
            model_metrics.flush_metrics()
