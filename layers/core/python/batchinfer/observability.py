"""Powertools Logger, Metrics (EMF) and Tracer shared by every handler."""

from __future__ import annotations

import logging
import traceback
import warnings

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

from .catalog import METRIC_BACKGROUND_ITEM_FAILURES
from .settings import get_settings

logger = Logger()
# The stack's POWERTOOLS_METRICS_NAMESPACE (per stage: its dashboard and alarms read the same), else the
# default; passed explicitly, since an explicit namespace is what Powertools prefers over the environment.
# Its only dimension is `service` (POWERTOOLS_SERVICE_NAME): the alarms read its metrics (the storage layer's
# TransactionConflicts, ...) per function, so no handler may add a dimension to it.
metrics = Metrics(namespace=get_settings().powertools_metrics_namespace)
tracer = Tracer()
# An invocation whose storage calls all went through has nothing for `metrics`: expected, not worth a warning.
warnings.filterwarnings("ignore", message="No application metrics to publish")


def metrics_with(**dimensions: str) -> EphemeralMetrics:
    """A metric set of its own, in `metrics`' namespace and service, with these dimensions besides `service`
    (the worker's `model`). Every Metrics instance shares one dimension set per process: a dimension added to
    `metrics` would reach every metric the invocation emits, and the per-function alarms would miss them.
    Flush it before the invocation ends."""
    own = EphemeralMetrics(namespace=metrics.namespace, service=metrics.service)
    for name, value in dimensions.items():
        own.add_dimension(name=name, value=value)
    return own


_loops = logging.getLogger("batchinfer.background")


def item_failed(loop: str, item_id: str, step: str, error: BaseException, passed_over: bool = True) -> None:
    """One item of a background loop raised unexpectedly (a bulkhead): logged with the item's id and the step,
    counted (BackgroundItemFailures, alarmed on); the caller goes on with the next item (`passed_over`), or
    raises it again for its event source to hand back (a worker's or webhooks' SQS record). The log names the
    exception's type and where it was raised (the frames), not its message: a message may quote what it was
    handling, and prompts and results never go to logs."""
    frames = "".join(traceback.format_tb(error.__traceback__))
    _loops.error("%s: %s of %s failed: %s raised at\n%s", loop, step, item_id, type(error).__name__, frames,
                 extra={"loop": loop, "item_id": item_id, "step": step, "error_type": type(error).__name__,
                        "passed_over": passed_over})
    metrics.add_metric(name=METRIC_BACKGROUND_ITEM_FAILURES, unit=MetricUnit.Count, value=1)


class Bulkhead:
    """One item of a background loop, isolated: an unexpected exception inside the `with` is logged with the
    item's id and the step it was at (`step`, which the work moves on as it goes), counted, kept in `error`,
    and does not escape: the loop goes on with the next item. `failed`, if given, is the set of items whose
    step raised the last time (the walk takes them last): the item joins it on a failure and leaves it when
    its step goes through. BaseExceptions that are not Exceptions (a KeyboardInterrupt, an exit) pass."""

    def __init__(self, loop: str, item_id: str, step: str, failed: set[str] | None = None) -> None:
        self.loop, self.item_id, self.step, self.failed = loop, item_id, step, failed
        self.error: Exception | None = None

    def __enter__(self) -> Bulkhead:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> bool:
        if error is None:
            if self.failed is not None:
                self.failed.discard(self.item_id)
            return False
        if not isinstance(error, Exception):
            return False
        self.error = error
        item_failed(self.loop, self.item_id, self.step, error)
        if self.failed is not None:
            self.failed.add(self.item_id)
        return True
