"""SQS: one queue per model carries dispatched requests to the workers."""

from __future__ import annotations

import json


class Queues:
    def __init__(self, sqs_client, urls: dict[str, str]) -> None:
        self.sqs = sqs_client
        self.urls = urls

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
