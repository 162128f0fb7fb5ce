"""A deterministic backend for scheduler tests that need no HTTP server: the provider of backend kind `fake`.

Importing this module registers `BACKEND` for the kind (`batchinfer.providers.register`). The catalog file
admits only real kinds, so models are put on it in code (`on_fake`). Every call is answered from a script
keyed by the request's text (its last message's content, or its `input`): the answers scripted for that
text in turn, then success. An answer is a status code (2xx: a chat completion echoing the text; otherwise
an error answer of that status), None (no answer: a timeout), an `Attempt` as it is, or an exception
(raised, as a provider's bug would be). Each call takes `latency` seconds on an injectable `sleep` (none at
all by default), and the backend counts the calls by text and the calls in flight by model, so a test can
say that every request ran exactly once and that a model never had more calls at once than its budget.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from batchinfer.catalog import CHAT_ENDPOINT, Catalog, Model
from batchinfer.domain import Attempt
from batchinfer.providers import register

KIND = "fake"
NO_SERVER = "http://127.0.0.1:9"  # where the fake models' base URL points: nothing answers there

Answer = int | None | Attempt | BaseException


@dataclass(frozen=True)
class Call:
    """One call the backend answered: the model it was for, the request's text and the status it gave."""

    model: str
    endpoint: str
    text: str
    status: int | None


def text_of(body: dict) -> str:
    """The request's text: its last message's content (chat, Messages) or its `input` (embeddings, responses)."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        content = messages[-1].get("content")
        return content if isinstance(content, str) else repr(content)
    return str(body.get("input", ""))


def answer_body(model: Model, endpoint: str, text: str, number: int) -> dict:
    """A success body of the endpoint's shape, the same for the same text (but for its id)."""
    usage = {"prompt_tokens": len(text.split()), "completion_tokens": 3,
             "total_tokens": len(text.split()) + 3}
    if endpoint == CHAT_ENDPOINT:
        return {"id": f"chatcmpl-fake-{number}", "object": "chat.completion", "created": 0,
                "model": model.backend_model, "usage": usage,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": f"fake answer to {text}"}}]}
    return {"id": f"fake-{number}", "object": "fake", "model": model.backend_model, "echo": text, "usage": usage}


class FakeBackend:
    """The provider of kind `fake` (see the module's docstring). `reset` before each test."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self, script: dict[str, Iterable[Answer]] | None = None, latency: float = 0.0,
              sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> FakeBackend:
        """Forget every call and count; answer from `script` from now on, each call taking `latency`."""
        with self._lock:
            self.script = {text: list(answers) for text, answers in (script or {}).items()}
            self.latency = latency
            self.sleep = sleep
            self.calls: list[Call] = []
            self.in_flight: Counter[str] = Counter()
            self.max_in_flight: Counter[str] = Counter()
        return self

    def counts(self) -> Counter[str]:
        """Calls answered per request text."""
        with self._lock:
            return Counter(call.text for call in self.calls)

    async def call(self, model: Model, endpoint: str, body: dict, api_key: str | None, timeout: float,
                   version: str | None = None) -> Attempt:
        text = text_of(body)
        with self._lock:
            scripted = self.script.get(text)
            answer: Answer = scripted.pop(0) if scripted else 200
            self.in_flight[model.id] += 1
            self.max_in_flight[model.id] = max(self.max_in_flight[model.id], self.in_flight[model.id])
            number = len(self.calls) + 1
        try:
            if self.latency:
                await self.sleep(self.latency)
            attempt = self._attempt(model, endpoint, text, answer, number)
        finally:
            with self._lock:
                self.in_flight[model.id] -= 1
                status = answer.status_code if isinstance(answer, Attempt) else (
                    None if isinstance(answer, BaseException) else answer)
                self.calls.append(Call(model.id, endpoint, text, status))
        return attempt

    @staticmethod
    def _attempt(model: Model, endpoint: str, text: str, answer: Answer, number: int) -> Attempt:
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, Attempt):
            return answer
        if answer is None:
            return Attempt(status_code=None, cost_known=False, message="The fake backend did not answer in time.")
        request_id = f"fake-req-{number}"
        if 200 <= answer < 300:
            body = answer_body(model, endpoint, text, number)
            usage = body["usage"]
            return Attempt(status_code=answer, body=body, request_id=request_id,
                           input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"])
        message = f"The fake backend answered {answer}."
        return Attempt(status_code=answer, body={"error": {"message": message, "type": "fake_error"}},
                       request_id=request_id, message=message)


BACKEND = FakeBackend()
register(KIND, BACKEND)


def on_fake(catalog: Catalog, budgets: dict[str, int] | None = None) -> Catalog:
    """The catalog with every runnable model on the fake backend (kind `fake`, no server behind its URL), and
    the budgets given (a model's floor then 1). Copies skip validation, which would refuse the kind."""
    budgets = budgets or {}
    models = []
    for model in catalog.models:
        if not model.auto and model.backend is not None:
            backend = model.backend.model_copy(update={"kind": KIND, "base_url": NO_SERVER})
            update: dict = {"backend": backend, "provider_batch": None}  # the fake kind has no batch tier
            if model.id in budgets:
                update |= {"batch_budget": budgets[model.id], "batch_floor": 1}
            model = model.model_copy(update=update)
        models.append(model)
    return Catalog(models=models)
