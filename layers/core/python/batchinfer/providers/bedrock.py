"""Amazon Bedrock models: one attempt, one `bedrock-runtime` call, signed with the function's IAM role (no key).
Chat completions and Anthropic Messages go through `Converse` (translated by `providers.converse`), or for an
interactive `stream: true` through `ConverseStream` (relayed by `streaming`), embeddings through `InvokeModel`
(Titan text or Cohere embed bodies, by the catalog's `embedding_format`).

Its batch tier (model invocation jobs, `batch_tiers.bedrock_jobs`) calls the control plane, the `bedrock`
client, through `control_call` here, so that boto3 stays in this one module of the kind.

This is the one module outside `storage/` that touches boto3 (an allowance tests/unit/test_architecture.py
names): Bedrock is a model backend like the HTTP ones, reached only through the AWS SDK's SigV4 signing, and
splitting its one kind across two layers would spread what a Bedrock attempt is over both. Its session (the
credential chain, or dummy credentials for a local endpoint) is storage's own.

boto3 blocks; a call runs on a thread of a pool per model, sized to what the model can have in flight, so the
worker's event loop never waits on it and a model cannot take the threads of another. botocore's own retries
are off: the service retries with its own rules and counts every attempt (and backs off on 429s).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from ..catalog import CHAT_ENDPOINT, MESSAGES_ENDPOINT, Model
from ..domain import Attempt
from ..storage.aws import session
from ..translating import Untranslatable
from .bedrock_embeddings import EMBEDDINGS_ENDPOINT, embedding_bodies, to_embeddings, vectors_of
from .converse import from_chat, from_messages
from .converse_answers import StreamedChat, to_chat_completion, to_message, usage_of
from .http import CutOff

CONNECT_TIMEOUT_SECONDS = 10.0
# Beyond the read timeout, how long the event loop waits for the thread before it gives the call up (the
# thread ends on its own when botocore's timeout fires).
THREAD_GRACE_SECONDS = 5.0
# Threads per model beyond its batch budget: interactive calls shrink the batch budget, they are not in it.
INTERACTIVE_THREADS = 8

# Bedrock's error classes (botocore's `Error.Code`) to the status the service's retry rules read: 429 is
# retried and makes the adaptive concurrency back off, 5xx and 504 are retried, other 4xx are final.
ERROR_STATUS = {
    "ThrottlingException": 429,
    "ServiceQuotaExceededException": 429,
    "ModelTimeoutException": 504,
    "ServiceUnavailableException": 503,
    "ModelNotReadyException": 503,
    "InternalServerException": 500,
    "ValidationException": 400,
    "AccessDeniedException": 403,
    "ResourceNotFoundException": 404,
    "ModelErrorException": 502,
}

_lock = threading.Lock()  # boto3 sessions are not safe to build clients from on many threads at once
_clients: dict[tuple, object] = {}
_pools: dict[tuple[str, int], ThreadPoolExecutor] = {}


def client(region: str, endpoint_url: str | None, timeout: float, connections: int):
    """The `bedrock-runtime` client of a region and endpoint (one per process, built once)."""
    key = (region, endpoint_url, timeout, connections)
    with _lock:
        found = _clients.get(key)
        if found is None:
            config = Config(retries={"total_max_attempts": 1, "mode": "standard"},
                            connect_timeout=min(timeout, CONNECT_TIMEOUT_SECONDS), read_timeout=timeout,
                            max_pool_connections=connections,
                            # AWS_ENDPOINT_URL (the moto server locally) must never send Bedrock calls elsewhere.
                            ignore_configured_endpoint_urls=True)
            found = session(endpoint_url).client("bedrock-runtime", region_name=region,
                                                  endpoint_url=endpoint_url, config=config)
            _clients[key] = found
        return found


class ControlError(Exception):
    """A call to Bedrock's control plane (`bedrock`: model invocation jobs) that did not go through."""


def control_call(region: str, endpoint_url: str | None, operation: str, **params: object) -> dict:
    """One call to Bedrock's control plane (the `bedrock` client of a region and endpoint, built once), its
    answer without botocore's metadata; ControlError naming Bedrock's error class when it did not go through.
    botocore's standard retries stay on: every operation used is idempotent (a create carries its
    clientRequestToken)."""
    key = ("control", region, endpoint_url)
    with _lock:
        found = _clients.get(key)
        if found is None:
            config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                            read_timeout=60.0, ignore_configured_endpoint_urls=True)
            found = session(endpoint_url).client("bedrock", region_name=region, endpoint_url=endpoint_url,
                                                 config=config)
            _clients[key] = found
    try:
        answer = getattr(found, operation)(**params)
    except (BotoCoreError, ClientError) as error:
        raise ControlError(f"Amazon Bedrock {operation}: {_failed(error).message}") from error
    answer.pop("ResponseMetadata", None)
    return answer


def _threads(model: Model) -> int:
    return max(1, model.batch_budget) + INTERACTIVE_THREADS


def _pool(model: Model) -> ThreadPoolExecutor:
    key = (model.id, _threads(model))
    with _lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = ThreadPoolExecutor(max_workers=key[1], thread_name_prefix=f"bedrock-{model.id}")
        return pool


async def call(model: Model, endpoint: str, body: dict, api_key: str | None, timeout: float,
               version: str | None = None) -> Attempt:
    """Send one request to the model on Bedrock and describe what came back (`api_key` is unused: the role
    signs the call)."""
    backend = model.backend
    assert backend is not None and backend.model_id and backend.region
    name = str(body.get("model") or model.id)
    try:
        if endpoint == CHAT_ENDPOINT:
            request = from_chat(body, backend.features)
        elif endpoint == MESSAGES_ENDPOINT:
            request = from_messages(body, backend.features)
        elif endpoint == EMBEDDINGS_ENDPOINT:
            bodies = embedding_bodies(body, backend.embedding_format)
        else:
            return Attempt(status_code=400, sent=False, message=f"{endpoint} is not served by Amazon Bedrock models.")
    except Untranslatable as error:  # intake checks the same rules; a catalog change may still get here
        return Attempt(status_code=400, sent=False, message=str(error))
    # The client is built (once) on the pool's thread too: building one takes a while, and blocks.
    runtime = lambda: client(backend.region, backend.endpoint_url, timeout, _threads(model))  # noqa: E731
    if endpoint == EMBEDDINGS_ENDPOINT:
        work = lambda: _embed(runtime(), backend.model_id, bodies, backend.embedding_format,  # noqa: E731
                              name, body.get("encoding_format"))
    else:
        stops = tuple(body.get("stop_sequences") or ())
        work = lambda: _converse(runtime(), backend.model_id, request, endpoint, name, stops)  # noqa: E731
    future = asyncio.get_running_loop().run_in_executor(_pool(model), work)
    try:
        return await asyncio.wait_for(future, timeout + CONNECT_TIMEOUT_SECONDS + THREAD_GRACE_SECONDS)
    except TimeoutError:
        return Attempt(status_code=None, cost_known=False, message="Amazon Bedrock did not answer in time.")


def _converse(runtime, model_id: str, request: dict, endpoint: str, name: str, stops: tuple[str, ...]) -> Attempt:
    try:
        answer = runtime.converse(modelId=model_id, **request)
    except Exception as error:  # noqa: BLE001 - every failure becomes the attempt it was
        return _failed(error)
    request_id = (answer.get("ResponseMetadata") or {}).get("RequestId") or ""
    prompt, completion, cached = usage_of(answer)
    ran = Attempt(status_code=200, request_id=request_id, input_tokens=prompt, output_tokens=completion,
                  cached_tokens=cached)
    try:
        if endpoint == CHAT_ENDPOINT:
            shown = to_chat_completion(answer, name, request_id, int(time.time()))
        else:
            shown = to_message(answer, name, request_id, stops)
    except ValueError as error:  # the model ran (its cost counts) but its answer cannot be shown
        return Attempt(status_code=502, request_id=request_id, input_tokens=prompt, output_tokens=completion,
                       message=f"Amazon Bedrock's answer could not be translated: {error}")
    return dataclasses.replace(ran, body=shown)


def _embed(runtime, model_id: str, bodies: list[dict], embedding_format: str | None, name: str,
           encoding_format: str | None) -> Attempt:
    vectors: list[list[float]] = []
    tokens = 0
    request_id = None
    for body in bodies:  # Titan embeds one text a call: one attempt is all of them, or the first failure
        try:
            answer = runtime.invoke_model(modelId=model_id, body=json.dumps(body), contentType="application/json",
                                          accept="application/json")
            parsed = json.loads(answer["body"].read())
        except Exception as error:  # noqa: BLE001
            failed = _failed(error)
            # What the calls before it cost is known and counts; an unknown one stays unknown.
            return dataclasses.replace(failed, input_tokens=tokens) if failed.cost_known else failed
        meta = answer.get("ResponseMetadata") or {}
        request_id = meta.get("RequestId")
        counted = (meta.get("HTTPHeaders") or {}).get("x-amzn-bedrock-input-token-count")
        tokens += int(counted) if counted and counted.isdigit() else int(parsed.get("inputTextTokenCount") or 0)
        try:
            vectors += vectors_of(parsed, embedding_format)
        except ValueError as error:
            return Attempt(status_code=502, request_id=request_id, input_tokens=tokens,
                           message=f"Amazon Bedrock's answer could not be translated: {error}")
    return Attempt(status_code=200, request_id=request_id, input_tokens=tokens,
                   body=to_embeddings(vectors, name, tokens, encoding_format))


def _failed(error: Exception) -> Attempt:
    """What a failed call was: Bedrock's error class by its status (ERROR_STATUS), a connection never made
    (cost nothing), or a call lost after it was sent (cost unknown), as httpx's are for the HTTP kinds."""
    if isinstance(error, ClientError):
        info = error.response.get("Error") or {}
        meta = error.response.get("ResponseMetadata") or {}
        code = str(info.get("Code") or "")
        status = ERROR_STATUS.get(code) or int(meta.get("HTTPStatusCode") or 502)
        message = str(info.get("Message") or "")
        return Attempt(status_code=status, request_id=meta.get("RequestId"),
                       body={"error": {"type": code, "message": message}},
                       message=f"Amazon Bedrock {code}: {message}" if message else f"Amazon Bedrock {code}")
    if isinstance(error, ParamValidationError):  # botocore refused it before sending: a request Bedrock cannot take
        return Attempt(status_code=400, sent=False, message=f"Amazon Bedrock would refuse the request: {error}")
    if isinstance(error, ConnectTimeoutError | EndpointConnectionError):
        return Attempt(status_code=None, sent=False,
                       message=f"Could not connect to Amazon Bedrock ({type(error).__name__}).")
    if isinstance(error, NoCredentialsError):
        return Attempt(status_code=None, sent=False, message="No AWS credentials to sign the Bedrock call with.")
    if isinstance(error, ReadTimeoutError):
        return Attempt(status_code=None, cost_known=False, message="Amazon Bedrock did not answer in time.")
    if isinstance(error, BotoCoreError):  # a connection lost after sending, a body cut off: it may have run
        return Attempt(status_code=None, cost_known=False,
                       message=f"Could not reach Amazon Bedrock: {type(error).__name__}")
    return Attempt(status_code=None, cost_known=False, message=f"The Bedrock call failed: {type(error).__name__}")


# --- interactive `stream: true`: ConverseStream ----------------------------------------------------------------

class ConverseChunks:
    """A ConverseStream answer being read, as chat completion chunks (`StreamedChat`): each event is read on
    the model's thread pool (botocore parses the event-stream frames), so the event loop never blocks. The
    relay in `streaming` reads it as it reads an OpenAI-compatible backend's chunks."""

    def __init__(self, stream, pool: ThreadPoolExecutor, chat: StreamedChat, request_id: str) -> None:
        self.stream, self.pool, self.chat, self.request_id = stream, pool, chat, request_id
        self.ended = False  # the metadata event (the usage) came

    async def __aiter__(self):
        loop = asyncio.get_running_loop()
        events = iter(self.stream)
        while True:
            try:
                event = await loop.run_in_executor(self.pool, next, events, None)
            except Exception as error:  # an exception event (EventStreamError), a connection cut  # noqa: BLE001
                raise CutOff(f"Amazon Bedrock's stream broke off: {type(error).__name__}") from error
            if event is None:
                return
            for chunk in self.chat.feed(event):
                yield chunk
            if "metadata" in event:
                self.ended = True

    def outcome(self) -> Attempt:
        if not self.ended or self.chat.usage is None:
            return Attempt(status_code=200, request_id=self.request_id, cost_known=False,
                           message="The stream ended before Amazon Bedrock reported its usage.")
        prompt, completion, cached = usage_of({"usage": self.chat.usage})
        return Attempt(status_code=200, request_id=self.request_id, input_tokens=prompt, output_tokens=completion,
                       cached_tokens=cached)

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self.stream.close)


async def open_stream(model: Model, endpoint: str, body: dict, timeout: float) -> ConverseChunks | Attempt:
    """Start a ConverseStream answer: its chunks, or the Attempt it gave when it did not start."""
    backend = model.backend
    assert backend is not None and backend.model_id and backend.region
    params = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    thinking = params.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled"):
        # The chunks a stream is relayed as carry no thinking blocks: it would be lost on the way.
        return Attempt(status_code=400, sent=False, message="thinking: a Bedrock model's thinking is not streamed "
                       "by this service; send stream false (or leave it out)")
    try:
        request = from_chat(params, backend.features) if endpoint == CHAT_ENDPOINT else from_messages(
            params, backend.features)
    except Untranslatable as error:
        return Attempt(status_code=400, sent=False, message=str(error))
    pool = _pool(model)

    def start():
        try:
            runtime = client(backend.region, backend.endpoint_url, timeout, _threads(model))
            return runtime.converse_stream(modelId=backend.model_id, **request)
        except Exception as error:  # noqa: BLE001
            return _failed(error)

    future = asyncio.get_running_loop().run_in_executor(pool, start)
    try:
        answer = await asyncio.wait_for(future, timeout + CONNECT_TIMEOUT_SECONDS + THREAD_GRACE_SECONDS)
    except TimeoutError:
        return Attempt(status_code=None, cost_known=False, message="Amazon Bedrock did not answer in time.")
    if isinstance(answer, Attempt):
        return answer
    request_id = (answer.get("ResponseMetadata") or {}).get("RequestId") or ""
    chat = StreamedChat(str(body.get("model") or model.id), request_id, int(time.time()))
    return ConverseChunks(answer["stream"], pool, chat, request_id)
