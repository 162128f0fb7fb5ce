"""The API's own latency metric: `ApiLatency` (milliseconds), one value per request, in the api function's EMF
blob ({service: batchinfer-api}), which the p99 latency alarm reads instead of API Gateway's `Latency`.

A long poll is left out: a results page asked for with `wait` (the finished-order feed of a batch or of a
Message Batch) is held open until a result finishes or the wait runs out, up to 25 s by design, so its
duration says how busy the batch is, not how fast the service answers. Counted in API Gateway's latency,
a few clients following their batches would put a healthy service's p99 over the alarm's threshold.
"""

from __future__ import annotations

import time
from urllib.parse import parse_qs

from aws_lambda_powertools.metrics import MetricUnit
from starlette.types import ASGIApp, Receive, Scope, Send

from ..catalog import METRIC_API_LATENCY
from ..observability import metrics


def is_long_poll(scope: Scope) -> bool:
    """A results page asked to wait (`wait` a whole number of seconds above 0); a `wait` the route refuses
    answers at once, so it counts."""
    if not scope.get("path", "").endswith("/results"):
        return False
    waits = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("wait", [])
    return any(w.isdigit() and int(w) > 0 for w in waits)


class RequestLatency:
    """Times each HTTP request from its arrival to its last byte sent (a streamed answer included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_long_poll(scope):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            metrics.add_metric(name=METRIC_API_LATENCY, unit=MetricUnit.Milliseconds,
                               value=round((time.perf_counter() - started) * 1000, 3))
