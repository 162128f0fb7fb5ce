"""output.jsonl of a large batch: written to S3 when the batch ends, downloaded through a presigned URL."""

import json
import urllib.parse

from local.lambda_runtime import FakeContext, load_handler
from tests.helpers import chat_request, drive, new_key
from tests.integration.apigw import http_event


def call_api(method: str, path: str, key: str) -> dict:
    import asyncio

    asyncio.set_event_loop(asyncio.new_event_loop())  # Mangum needs a loop; the worker's asyncio.run closed it
    return load_handler("api").handler(http_event(method, path, headers={"authorization": f"Bearer {key}"}),
                                       FakeContext())


def test_large_export_redirects_to_the_object_written_when_the_batch_ended(svc):
    svc.settings = svc.settings.model_copy(update={"export_redirect_bytes": 500})
    _, key = new_key(svc)
    from batchinfer.operations.openai import batches
    from batchinfer.service.accounts import authenticate
    from batchinfer.service.reading import results

    who = authenticate(svc, key)
    raw = json.dumps({"requests": [chat_request(f"x-{i}", f"export {i}") for i in range(5)]}).encode()
    batch, _ = batches.create_batch(svc, who, raw, None)
    final = drive(svc, batch["id"])
    assert final["status"] == "completed" and final["export_object"]

    answer = call_api("GET", f"/v1/batches/{batch['id']}/output.jsonl", key)
    assert answer["statusCode"] == 302
    location = urllib.parse.urlparse(answer["headers"]["location"])
    assert "X-Amz-Signature" in location.query and location.path.endswith("/output.jsonl")
    stored = svc.blobs.get(final["export_object"]).decode().splitlines()
    streamed = b"".join(results.export_stream(svc, final)).decode().splitlines()
    assert stored == streamed
    assert [json.loads(line)["custom_id"] for line in stored] == [f"x-{i}" for i in range(5)]


def test_small_export_is_streamed_by_the_api(svc):
    _, key = new_key(svc)
    from batchinfer.operations.openai import batches
    from batchinfer.service.accounts import authenticate

    who = authenticate(svc, key)
    raw = json.dumps({"requests": [chat_request("only", "small")]}).encode()
    batch, _ = batches.create_batch(svc, who, raw, None)
    final = drive(svc, batch["id"])
    assert "export_object" not in final
    answer = call_api("GET", f"/v1/batches/{batch['id']}/output.jsonl", key)
    assert answer["statusCode"] == 200
    assert json.loads(answer["body"].splitlines()[0])["custom_id"] == "only"
