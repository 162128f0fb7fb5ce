"""Webhooks function: each record of the delivery queue is one attempt at one event. The records of a call
run at once (a slow receiver holds only its own record, for at most the attempt's timeout), and a record
whose bookkeeping failed is reported on its own, so SQS hands back only that one."""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import AsyncBatchProcessor, EventType, async_process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from batchinfer.catalog import METRIC_WEBHOOK_ATTEMPTS_FAILED, METRIC_WEBHOOK_DELIVERIES_FAILED
from batchinfer.observability import item_failed, logger, metrics, tracer
from batchinfer.runtime import services
from batchinfer.service.background.webhooks import deliver

processor = AsyncBatchProcessor(event_type=EventType.SQS)
# One thread per record of a call (the event source's batch size): the default pool has cpu + 4 threads, and a
# record waiting for one behind a slow receiver's attempt would be delayed by it.
RECORDS_PER_CALL = 10
_pool = ThreadPoolExecutor(max_workers=RECORDS_PER_CALL, thread_name_prefix="delivery")


async def record_handler(record: SQSRecord) -> str:
    loop = asyncio.get_running_loop()
    message = json.loads(record.body)
    try:
        result = await loop.run_in_executor(_pool, deliver, services(), message)
    except Exception as error:
        # Logged with the event and counted; raised again, so that only this record goes back to the queue
        # (and, failing on, to its dead-letter queue) while the others of the call are delivered.
        item_failed("webhook delivery", str(message.get("sk") or record.message_id), "delivery", error,
                    passed_over=False)
        raise
    if result in ("retry", "failed"):
        metrics.add_metric(name=METRIC_WEBHOOK_ATTEMPTS_FAILED, unit=MetricUnit.Count, value=1)
    if result == "failed":  # the last attempt failed: the receiver will not hear of this event
        metrics.add_metric(name=METRIC_WEBHOOK_DELIVERIES_FAILED, unit=MetricUnit.Count, value=1)
    return result


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: object) -> dict:
    return async_process_partial_response(event=event, record_handler=record_handler, processor=processor,
                                          context=context)
