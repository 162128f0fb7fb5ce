"""Worker function: the records of one SQS batch run concurrently; failures are reported per record."""

import json

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import AsyncBatchProcessor, EventType, async_process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from batchinfer.observability import logger, metrics, tracer
from batchinfer.runtime import services
from batchinfer.service.work import process

processor = AsyncBatchProcessor(event_type=EventType.SQS)


async def record_handler(record: SQSRecord) -> str:
    message = json.loads(record.body)
    outcome = await process(services(), message)
    metrics.add_metric(name="RequestOutcome" + outcome.title().replace("_", ""), unit=MetricUnit.Count, value=1)
    return outcome


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: object) -> dict:
    return async_process_partial_response(event=event, record_handler=record_handler, processor=processor,
                                          context=context)
