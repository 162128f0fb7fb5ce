"""The real backend the service is tested against: llama-cpp-python's OpenAI-compatible server running the tiny
model, in its own venv (.venv-real-backend), and a recording proxy in front of it that keeps every answer's
bytes, so a batch result can be compared with exactly what the server sent."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from local.llama_server import REAL_PYTHON, real_env
from local.servers import LoggedServer, UvicornThread, free_port

ROOT = Path(__file__).resolve().parents[2]
BUILD_HINT = "run `make test-real-backend` (it builds .venv-real-backend from requirements-real-backend.txt)"
ALIAS = "tiny-llama"  # the name the server knows its model by


class LlamaServer(LoggedServer):
    """`python -m llama_cpp.server` on 127.0.0.1: started, killed (an outage: connections in flight are cut)
    and started again on the same port."""

    def __init__(self, model: Path, log: Path, embedding: bool = False, port: int | None = None) -> None:
        super().__init__(log, port)
        self.model, self.embedding = model, embedding

    def start(self, timeout: float = 120) -> LlamaServer:
        command = [str(REAL_PYTHON), "-m", "llama_cpp.server", "--model", str(self.model), "--model_alias", ALIAS,
                   "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "2048", "--n_threads", "1",
                   "--n_threads_batch", "1", "--embedding", "true" if self.embedding else "false"]
        self.launch(command, "/v1/models", "llama_cpp.server", timeout, ROOT, real_env())
        return self


@dataclass(frozen=True)
class Exchange:
    """One call the server answered: what was asked and the answer's exact bytes."""

    upstream: str
    path: str
    request: dict
    status: int
    request_id: str | None
    text: str

    @property
    def body(self) -> object:
        return json.loads(self.text)


class RecordingProxy:
    """Forwards /<upstream>/<path> to that upstream's server and keeps every exchange."""

    def __init__(self, upstreams: dict[str, str]) -> None:
        self.upstreams = upstreams
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        app = Starlette(routes=[Route("/{upstream}/{path:path}", self._forward, methods=["GET", "POST"])])
        self.server = UvicornThread(app, free_port())

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> RecordingProxy:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    async def _forward(self, request: Request) -> Response:
        upstream, path = request.path_params["upstream"], request.path_params["path"]
        sent = await request.body()
        async with httpx.AsyncClient(timeout=600) as client:
            answer = await client.request(request.method, f"{self.upstreams[upstream]}/{path}", content=sent,
                                          headers={"content-type": request.headers.get("content-type", "")})
        exchange = Exchange(upstream=upstream, path="/" + path, request=json.loads(sent) if sent else {},
                            status=answer.status_code, request_id=answer.headers.get("x-request-id"),
                            text=answer.text)
        with self._lock:
            self.exchanges.append(exchange)
        headers = {k: v for k, v in answer.headers.items() if k in ("content-type", "x-request-id")}
        return Response(answer.content, status_code=answer.status_code, headers=headers)

    def calls(self, upstream: str, path: str) -> list[Exchange]:
        with self._lock:
            return [e for e in self.exchanges if e.upstream == upstream and e.path == path]


def canonical(value: object) -> str:
    """JSON text that tells 12500 from 12500.0 (and keeps every float's digits), keys sorted."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def differences(got: object, sent: object, path: str = "$") -> list[str]:
    """Where `got` differs from `sent`, number types included (1 is not 1.0, True is not 1)."""
    if type(got) is not type(sent):
        return [f"{path}: {got!r} ({type(got).__name__}) where the server sent {sent!r} ({type(sent).__name__})"]
    if isinstance(got, dict):
        assert isinstance(sent, dict)
        found = [f"{path}.{k}: missing (the server sent {sent[k]!r})" for k in sent if k not in got]
        found += [f"{path}.{k}: {got[k]!r} added (the server sent no {k})" for k in got if k not in sent]
        for k in got.keys() & sent.keys():
            found += differences(got[k], sent[k], f"{path}.{k}")
        return found
    if isinstance(got, list):
        assert isinstance(sent, list)
        if len(got) != len(sent):
            return [f"{path}: {len(got)} items where the server sent {len(sent)}"]
        return [d for n, (g, s) in enumerate(zip(got, sent, strict=True)) for d in differences(g, s, f"{path}[{n}]")]
    return [] if got == sent else [f"{path}: {got!r} where the server sent {sent!r}"]
