"""A batch input file larger than one API request may carry, sent with the official `openai` SDK's
`client.uploads.upload_file_chunked` (the Uploads API) against the local stack, then run as a batch."""

from __future__ import annotations

import hashlib
import json
import time

import openai
import pytest
from openai import OpenAI

from tests.e2e.conftest import local_stack

pytestmark = pytest.mark.e2e
LINES, CONTENT_BYTES = 150, 80_000  # 12 MB in few requests: parts of 4 MiB, 4 MiB and 3.6 MB
LAMBDA_PAYLOAD_BYTES = 6_291_456


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with local_stack(tmp_path_factory, file_batches_enabled=True) as running:
        yield running


def batch_file(path) -> bytes:
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa " * (CONTENT_BYTES // 50)
    lines = [{"custom_id": f"r-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "glm-5.3-flash", "max_tokens": 20, "messages": [
                  {"role": "user", "content": f"{i}: {text[i % 50:][:CONTENT_BYTES]}"}]}}
             for i in range(LINES)]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    path.write_bytes(data)
    return data


def test_a_large_file_uploads_in_parts_with_the_sdk_and_its_batch_runs(stack, tmp_path):
    client = OpenAI(base_url=stack["base"], api_key=stack["key"])
    limit = stack["svc"].settings.max_upload_part_bytes
    path = tmp_path / "requests.jsonl"
    data = batch_file(path)
    assert len(data) > 2 * limit and len(data) > LAMBDA_PAYLOAD_BYTES  # no single request could carry it

    # The SDK's default part (64 MiB) is refused, with the part_size to pass instead (and no retries).
    with pytest.raises(openai.APIStatusError) as refused:
        client.uploads.upload_file_chunked(file=path, mime_type="application/jsonl", purpose="batch")
    assert refused.value.status_code == 413 and f"pass part_size={limit}" in refused.value.message

    upload = client.uploads.upload_file_chunked(file=path, mime_type="application/jsonl", purpose="batch",
                                                part_size=limit)
    assert upload.status == "completed" and upload.filename == "requests.jsonl" and upload.bytes == len(data)
    assert upload.file is not None and upload.file.bytes == len(data) and upload.file.purpose == "batch"
    assert client.files.retrieve(upload.file.id).bytes == len(data)
    downloaded = client.files.with_raw_response.content(upload.file.id)
    assert hashlib.sha256(downloaded.content).hexdigest() == hashlib.sha256(data).hexdigest()

    batch = client.batches.create(input_file_id=upload.file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.monotonic() + 60
    while batch.status not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.3)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (LINES, LINES, 0)
    outputs = client.files.content(batch.output_file_id).text.splitlines()
    assert sorted(json.loads(x)["custom_id"] for x in outputs) == sorted(f"r-{i}" for i in range(LINES))
