"""Auto-pagination of the official OpenAI SDK over /v1/files and /v1/batches, one item a page.

The SDK asks for the next page with `after=<id of the page's last item>` until `has_more` is false or a page is
empty, so a server that ignores `after` or never says `has_more: false` makes these loops endless (wire contracts
2.7). Each loop here is cut off a few items past the one-page listing, and the test compares the two.

Needs FREEINFERENCE_BASE_URL (e.g. http://127.0.0.1:8000/v1) and FREEINFERENCE_API_KEY. Prints one JSON object.
"""

import itertools
import json
import os
import time

import openai
from openai import OpenAI

client = OpenAI(base_url=os.environ["FREEINFERENCE_BASE_URL"], api_key=os.environ["FREEINFERENCE_API_KEY"])

# Two uploads and a batch from each, waited for, so their result files exist and nothing changes while paging.
uploads, batches = [], []
for i in range(2):
    line = {"custom_id": f"page-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": f"Page {i}."}]}}
    upload = client.files.create(file=("paging.jsonl", json.dumps(line).encode() + b"\n"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  extra_headers={"Idempotency-Key": f"paging-{upload.id}"})
    uploads.append(upload.id)
    batches.append(batch.id)
deadline = time.monotonic() + 60
finished = {}
while len(finished) < len(batches) and time.monotonic() < deadline:
    for batch_id in set(batches) - set(finished):
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            finished[batch_id] = batch
    time.sleep(0.2)

files_page = client.files.list()  # the server's default limit (10000): everything on one page
batches_page = client.batches.list(limit=100)
first_files, first_batches = client.files.list(limit=1), client.batches.list(limit=1)
print(json.dumps({
    "openai": openai.__version__,
    "uploads": uploads,
    "batches": {b: (finished[b].status, finished[b].output_file_id) if b in finished else None for b in batches},
    "files_one_page": [f.id for f in files_page.data],
    "files_one_page_has_more": files_page.has_more,
    "files_first_page": [len(first_files.data), first_files.has_more],
    "files_paged": [f.id for f in itertools.islice(client.files.list(limit=1), len(files_page.data) + 5)],
    "batches_one_page": [b.id for b in batches_page.data],
    "batches_one_page_has_more": batches_page.has_more,
    "batches_first_page": [len(first_batches.data), first_batches.has_more],
    "batches_paged": [b.id for b in itertools.islice(client.batches.list(limit=1), len(batches_page.data) + 5)],
}))
