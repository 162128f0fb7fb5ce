"""Runs the Lambda handlers locally the way AWS would: scheduled calls, and SQS event source mappings
(batches of records, partial-batch failures) fed from the moto server's queues."""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class FakeContext:
    """The attributes of a Lambda context that Powertools reads."""

    function_name: str = "local"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:000000000000:function:local"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    log_group_name: str = "/aws/lambda/local"
    log_stream_name: str = "local"
    # Set when the local runtime stops: the invocation's time is up, as at a Lambda's timeout, so a handler
    # that loops on its remaining time (the dispatcher) returns within one pass.
    ended: threading.Event | None = None

    def get_remaining_time_in_millis(self) -> int:
        return 0 if self.ended is not None and self.ended.is_set() else 300_000


_loading = threading.Lock()
_handlers: dict[str, ModuleType] = {}


def load_handler(function: str, environment: str = "") -> ModuleType:
    """Import functions/<function>/handler.py under a unique module name (every one is called handler).

    Each `environment` gets its own copy of the module, as each Lambda execution environment has its own:
    a handler's module-level state (the worker's BatchProcessor) serves one invocation at a time."""
    key = f"{function}{environment}"
    with _loading:  # pollers start together; a half-imported module must not be handed out
        if key not in _handlers:
            name = f"batchinfer_fn_{function}{environment}"
            spec = importlib.util.spec_from_file_location(name, ROOT / "functions" / function / "handler.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[name] = module
            _handlers[key] = module
        return _handlers[key]


def invoke(function: str, event: dict, environment: str = "", ended: threading.Event | None = None) -> dict:
    try:
        return load_handler(function, environment).handler(event, FakeContext(function_name=function, ended=ended))
    finally:
        # With POWERTOOLS_METRICS_DISABLED, Powertools keeps what it did not print; one process runs every
        # function here, so drop it after each call as a fresh Lambda invocation would.
        from batchinfer.observability import metrics

        metrics.clear_metrics()


def sqs_event(queue_arn: str, messages: list[dict]) -> dict:
    return {"Records": [{
        "messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"], "body": m["Body"],
        "attributes": {"ApproximateReceiveCount": m.get("Attributes", {}).get("ApproximateReceiveCount", "1"),
                       "SentTimestamp": "0", "SenderId": "local", "ApproximateFirstReceiveTimestamp": "0"},
        "messageAttributes": {}, "md5OfBody": m.get("MD5OfBody", ""), "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn, "awsRegion": "us-east-1"} for m in messages]}


def poll_once(sqs, queue_url: str, wait_seconds: int = 0, environment: str = "", function: str = "worker",
              stopping: threading.Event | None = None) -> int:
    """One event source mapping poll: receive up to 10 records, invoke the function (the worker, or the
    webhooks function on the delivery queue), delete what succeeded. Once `stopping` is set, what a receive
    returns is left on the queue (the stack is going away with it)."""
    answer = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_seconds,
                                 AttributeNames=["ApproximateReceiveCount"])
    messages = answer.get("Messages", [])
    if not messages or (stopping is not None and stopping.is_set()):
        return 0
    arn = "arn:aws:sqs:us-east-1:000000000000:" + queue_url.rsplit("/", 1)[-1]
    result = invoke(function, sqs_event(arn, messages), environment)
    failed = {f["itemIdentifier"] for f in result.get("batchItemFailures", [])}
    done = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            if m["MessageId"] not in failed]
    if done:
        sqs.delete_message_batch(QueueUrl=queue_url, Entries=done)
    return len(messages)


POLL_WAIT_SECONDS = 5  # how long a poller's receive waits for a message (Loops.stop wakes it)


class Loops:
    """Background threads: dispatcher and sweeper on their schedule, pollers per model queue and on the
    webhook delivery queue."""

    def __init__(self, sqs, queue_urls: dict[str, str], pollers_per_queue: dict[str, int] | int = 2,
                 dispatch_seconds: float = 5.0, sweep_interval: float = 1.0, webhook_queue_url: str | None = None,
                 webhook_pollers: int = 2) -> None:
        self.sqs = sqs
        self.queue_urls = queue_urls
        self.webhook_queue_url = webhook_queue_url
        self.webhook_pollers = webhook_pollers
        self.pollers_per_queue = pollers_per_queue
        self.dispatch_seconds = dispatch_seconds
        self.sweep_interval = sweep_interval
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self.waiting: dict[str, int] = {}  # pollers per queue

    def _guard(self, step, pause: float) -> None:
        while not self.stopping.is_set():
            try:
                step()
            except Exception as error:  # keep the loop alive, as a scheduled Lambda would be called again
                if self.stopping.is_set():
                    return
                self.errors.append(error)
                print(f"local runtime: {type(error).__name__}: {error}", file=sys.stderr)
                time.sleep(1)
            if pause:
                self.stopping.wait(pause)

    def start(self) -> None:
        def dispatch() -> None:
            invoke("dispatcher", {"seconds": self.dispatch_seconds}, ended=self.stopping)

        def sweep() -> None:
            invoke("sweeper", {}, ended=self.stopping)

        targets = [(dispatch, 0.0), (sweep, self.sweep_interval)]
        for q, (model, url) in enumerate(self.queue_urls.items()):
            count = self.pollers_per_queue if isinstance(self.pollers_per_queue, int) else self.pollers_per_queue[model]
            for p in range(count):
                env = f"_q{q}p{p}"  # one execution environment per poller
                # Long polls, as the event source mapping's (20 s there): an idle poller costs moto one call
                # per wait, and moto serves every call of the stack one at a time.
                targets.append((lambda u=url, e=env: poll_once(self.sqs, u, wait_seconds=POLL_WAIT_SECONDS,
                                                               environment=e, stopping=self.stopping), 0.0))
                self.waiting[url] = self.waiting.get(url, 0) + 1
        if self.webhook_queue_url:  # the delivery queue's event source mapping
            for p in range(self.webhook_pollers):
                targets.append((lambda e=f"_wh{p}": poll_once(self.sqs, self.webhook_queue_url, POLL_WAIT_SECONDS,
                                                              environment=e, function="webhooks",
                                                              stopping=self.stopping), 0.0))
            self.waiting[self.webhook_queue_url] = self.webhook_pollers
        for step, pause in targets:
            thread = threading.Thread(target=self._guard, args=(step, pause), daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self) -> None:
        """End every loop and wait for it: the dispatcher's invocation sees its time is up, and each poller
        waiting in a receive is woken by messages it leaves where they are (a receive takes up to 10, so ten
        per poller wake them all), instead of waiting out POLL_WAIT_SECONDS."""
        self.stopping.set()
        for url, pollers in self.waiting.items():
            for _ in range(pollers):
                try:
                    self.sqs.send_message_batch(QueueUrl=url, Entries=[
                        {"Id": str(i), "MessageBody": "{}"} for i in range(10)])
                except Exception:  # noqa: BLE001 - its pollers then wait out their receive
                    break
        for thread in self.threads:
            thread.join(timeout=10)
