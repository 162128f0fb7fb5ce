# The specification's "Batches from a file (OpenAI SDK)" script, verbatim. The e2e test changes only the base URL,
# the key and the 30 s poll.
import json
import os
import time

from openai import OpenAI

client = OpenAI(
    base_url="https://freeinference.org/v1",
    api_key=os.environ["FREEINFERENCE_API_KEY"],
)

# 1. Write the requests, one per line. Every line uses the same model.
prompts = ["Summarize the plot of Hamlet in two sentences.", "Name three prime numbers."]
with open("requests.jsonl", "w", encoding="utf-8") as f:
    for i, prompt in enumerate(prompts):
        line = {
            "custom_id": f"q-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": prompt}]},
        }
        f.write(json.dumps(line) + "\n")

# 2. Upload the file and create the batch.
with open("requests.jsonl", "rb") as f:
    upload = client.files.create(file=f, purpose="batch")
batch = client.batches.create(
    input_file_id=upload.id,
    endpoint="/v1/chat/completions",
    completion_window="24h",
    metadata={"project": "eval-42"},
    # The SDK retries failed calls on its own; the key keeps a retry from creating a second batch.
    extra_headers={"Idempotency-Key": f"eval-42-{upload.id}"},
)

# 3. Wait for a final status.
while batch.status not in ("completed", "failed", "expired", "cancelled"):
    time.sleep(30)
    batch = client.batches.retrieve(batch.id)
print(batch.status, batch.request_counts)

if batch.errors and batch.errors.data:  # the input file was invalid; nothing ran
    for problem in batch.errors.data:
        print(f"line {problem.line}: {problem.message}")


def read_lines(file_id):
    """Download a result file, or nothing when the batch has none (file_id is None)."""
    if file_id is None:
        return []
    text = client.files.content(file_id).text
    return [json.loads(line) for line in text.splitlines() if line]


# 4. Successes, then everything else.
for line in read_lines(batch.output_file_id):
    print(line["custom_id"], line["response"]["body"]["choices"][0]["message"]["content"])
for line in read_lines(batch.error_file_id):
    # A request that got an HTTP error carries it in response.body.error;
    # one that never ran (cancelled, expired, batch failed) carries it in error.
    problem = line["error"] or line["response"]["body"]["error"]
    print(line["custom_id"], problem["code"], problem["message"])
