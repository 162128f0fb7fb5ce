# The specification's "Anthropic Message Batches" script, verbatim. The e2e test changes only the base URL, the key
# and the 30 s poll.
import os
import time

import anthropic

client = anthropic.Anthropic(
    base_url="https://freeinference.org/anthropic",
    api_key=os.environ["FREEINFERENCE_API_KEY"],
)

prompts = ["Summarize the plot of Hamlet in two sentences.", "Name three prime numbers."]
batch = client.messages.batches.create(
    requests=[
        {
            "custom_id": f"q-{i}",
            "params": {
                "model": "glm-5.3-flash",
                "max_tokens": 512,
                "messages": [{"role": "user", "content": prompt}],
            },
        }
        for i, prompt in enumerate(prompts)
    ],
    # The SDK retries failed calls on its own; the key keeps a retry from creating a second batch.
    extra_headers={"Idempotency-Key": "hamlet-primes-msgbatch-1"},
)

# Wait until the batch has ended; results are available only then.
while batch.processing_status != "ended":
    time.sleep(30)
    batch = client.messages.batches.retrieve(batch.id)
print(batch.request_counts)

for entry in client.messages.batches.results(batch.id):
    result = entry.result
    if result.type == "succeeded":
        text = "".join(block.text for block in result.message.content if block.type == "text")
        print(entry.custom_id, text)
    elif result.type == "errored":
        print(entry.custom_id, "errored:", result.error.error.type, result.error.error.message)
    else:  # "canceled" or "expired": the request never ran
        print(entry.custom_id, result.type)
