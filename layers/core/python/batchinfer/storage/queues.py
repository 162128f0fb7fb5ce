"""SQS: one queue per model carries dispatched requests to the workers; one carries webhook deliveries."""

from __future__ import annotations

import json

MAX_DELAY_SECONDS = 900  # SQS's longest message delay


class Queues:
    def __init__(self, sqs_client, urls: dict[str, str], webhook_url: str | None = None) -> None:
        self.sqs = sqs_client
        self.urls = urls
        self.webhook_url = webhook_url

    def send_webhook(self, message: dict, delay_seconds: float = 0) -> None:
        """One webhook delivery to make, after up to 15 minutes (a longer wait comes back early, and waits
        again: service.background.webhooks)."""
        if self.webhook_url is None:
            raise RuntimeError("WEBHOOK_QUEUE_URL is not set")
        delay = max(0, min(MAX_DELAY_SECONDS, int(delay_seconds)))
        self.sqs.send_message(QueueUrl=self.webhook_url, MessageBody=json.dumps(message), DelaySeconds=delay)

    def send(self, model: str, messages: list[dict]) -> list[dict]:
        """Send messages to the model's queue; returns the ones SQS did not take."""
        failed: list[dict] = []
        url = self.urls[model]
        for i in range(0, len(messages), 10):
            chunk = messages[i:i + 10]
            entries = [{"Id": str(n), "MessageBody": json.dumps(m)} for n, m in enumerate(chunk)]
            answer = self.sqs.send_message_batch(QueueUrl=url, Entries=entries)
            failed.extend(chunk[int(f["Id"])] for f in answer.get("Failed", []))
        return failed
