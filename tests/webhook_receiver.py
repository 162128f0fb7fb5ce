"""A webhook receiver on 127.0.0.1 for the webhook tests (integration and e2e), as a module-scoped fixture."""

from __future__ import annotations

import asyncio
import threading

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from local.servers import UvicornThread, free_port


class Receiver:
    """A webhook receiver on 127.0.0.1: records every delivery; `plan[path]` lists the status codes its next
    calls answer (then 200); `hang[path]` seconds to wait before answering."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.plan: dict[str, list[int]] = {}
        self.hang: dict[str, float] = {}
        self.lock = threading.Lock()

        async def hook(request: Request) -> Response:
            path = request.url.path
            body = await request.body()
            with self.lock:
                self.calls.append({"path": path, "headers": dict(request.headers), "body": body.decode()})
                planned = self.plan.get(path) or []
                status = planned.pop(0) if planned else 200
            if self.hang.get(path):
                await asyncio.sleep(self.hang[path])
            return Response("ok" if status < 300 else "no", status_code=status)

        self.server = UvicornThread(Starlette(routes=[Route("/{path:path}", hook, methods=["POST"])]), free_port())

    def url(self, path: str = "/hooks") -> str:
        return f"{self.server.url}{path}"

    def at(self, path: str) -> list[dict]:
        return [c for c in self.calls if c["path"] == path]


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    r.server.start()
    yield r
    r.server.stop()
