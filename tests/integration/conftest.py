"""Fixtures of the API tests: the API Lambda handler called with API Gateway events (through Mangum)."""

from __future__ import annotations

import asyncio

import pytest

from local.lambda_runtime import FakeContext, load_handler
from tests.integration.apigw import Reply, http_event

_UNSET = object()


class Api:
    """Calls the API Lambda handler the way API Gateway does and decodes its answer."""

    def __init__(self, module, loop: asyncio.AbstractEventLoop) -> None:
        self.module = module
        self.loop = loop
        self.events: list[dict] = []

    def __call__(self, method: str, path: str, key: str | None = None, *, header: str = "bearer",
                 headers: dict | None = None, query: dict | str | None = None, json_body: object = _UNSET,
                 body: bytes | str | None = None) -> Reply:
        hdrs = {"accept": "application/json"}
        if key is not None:
            hdrs.update({"authorization": f"Bearer {key}"} if header == "bearer" else {"x-api-key": key})
        hdrs.update(headers or {})
        kwargs = {} if json_body is _UNSET else {"json_body": json_body}
        event = http_event(method, path, headers=hdrs, query=query, body=body, **kwargs)
        self.events.append(event)
        # A Lambda process has its event loop; here the worker handler (asyncio.run, in `finish`) shares the
        # process and leaves none behind, and Mangum runs the app on asyncio.get_event_loop().
        asyncio.set_event_loop(self.loop)
        answer = self.module.handler(event, FakeContext(function_name="api"))
        return Reply.decode(answer)

    def create(self, key: str, requests: list | None = None, idem: str | None = None, **payload) -> Reply:
        body = {"requests": requests, **payload} if requests is not None else payload
        return self("POST", "/v1/batches", key, json_body=body,
                    headers={"idempotency-key": idem} if idem is not None else None)

    def created(self, key: str, requests: list, **payload) -> dict:
        reply = self.create(key, requests, **payload)
        assert reply.status == 200, reply.text
        return reply.json()

    def results(self, key: str, batch_id: str, **query) -> Reply:
        return self("GET", f"/v1/batches/{batch_id}/results", key, query=query or None)


@pytest.fixture(scope="module")
def api_module():
    return load_handler("api")


@pytest.fixture
def api(svc, api_module):
    loop = asyncio.new_event_loop()
    yield Api(api_module, loop)
    asyncio.set_event_loop(None)
    loop.close()


