"""What the SDK scripts share: where the service is and the key (from the environment, as a user's own program
would have them), the model they batch on, an OpenAI batch line, waiting for an OpenAI-shaped batch to end, and
what an ended one on a provider's batch tier shows. A script runs as `python <script>`, so this module, beside
it, is importable as it is."""

import os
import time

BASE, KEY = os.environ["FREEINFERENCE_BASE_URL"], os.environ["FREEINFERENCE_API_KEY"]
MODEL = "glm-5.3-flash"
ENDED = ("completed", "failed", "expired", "cancelled")


def chat(custom_id, content, **body):
    """One line of an OpenAI batch: a chat completion of `content` on MODEL."""
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": content}], **body}}


def wait(client, batch_id, timeout=60):
    """The batch once it has ended, read with the openai client as a user polls it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ENDED:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"{batch_id} did not end")


def on_tier(batch):
    """What an ended OpenAI-shaped batch shows of a run on a provider's batch tier: its status, `execution`,
    counts, `cost_usd`, `saved_usd` (extensions, read as the SDK keeps unknown fields) and usage."""
    return {"status": batch.status, "execution": getattr(batch, "execution", None),
            "counts": [batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed],
            "cost_usd": getattr(batch, "cost_usd", None), "saved_usd": getattr(batch, "saved_usd", None),
            "usage": [batch.usage.input_tokens, batch.usage.output_tokens] if batch.usage else None}
