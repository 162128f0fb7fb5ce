"""Simulated model backend -- a TEST DOUBLE that stands in for real model servers.

This is NOT a model and runs no inference. Every answer is built deterministically from a hash
of the request (model + message texts), so the same input always gives the same output and
different inputs give different outputs. It exists for unit/integration tests and benchmarks.
This module is its HTTP server (routes, faults, latency, counters); the answers themselves are built in
`local.simulated_answers`.

Endpoints: POST /v1/chat/completions, /v1/embeddings, /v1/responses (OpenAI shapes), POST /v1/messages
(Anthropic shape), GET /v1/models; and Amazon Bedrock's runtime as boto3 calls it (`endpoint_url`, any SigV4
signature): POST /model/{modelId}/converse (Converse's JSON; tool use as the other routes; errors as Bedrock
sends them: the status of the error class, its name in `x-amzn-ErrorType`, a `{"message": ...}` body, the
request id in `x-amzn-RequestId`) and /model/{modelId}/invoke (Titan text `{"inputText"}` and Cohere embed
`{"texts", "input_type"}` embedding bodies; the token count in `X-Amzn-Bedrock-Input-Token-Count`) and
/model/{modelId}/converse-stream (the same answer as `application/vnd.amazon.eventstream` frames, as botocore
parses them: messageStart, a contentBlockDelta per word or the tool's input, contentBlockStop, messageStop,
metadata with the usage; `[[sim:cut-stream]]` ends it after its first delta, with no messageStop). Faults
there answer as Bedrock's classes: 429 ThrottlingException, 500 InternalServerException, a timeout 408
ModelTimeoutException, a 400 ValidationException. Chat completions and messages stream with `stream: true` (server-sent
events in each API's shapes: the same answer, a word per delta, after the latency; chat sends a usage chunk
only with `stream_options.include_usage`, as OpenAI does). The providers' batch tiers: OpenAI's Files and
Batches (`simulated_batches`), Anthropic's Message Batches (`simulated_message_batches`) and Bedrock's model
invocation jobs on its control plane (`simulated_bedrock_jobs`, reading and writing the moto bucket).

Faults, set at start-up (CLI / SimConfig) or at run time through the control API:
  latency_seconds        every model request sleeps this long (asyncio, so requests overlap): the mean
  latency_distribution   fixed (the default), lognormal (latency_sigma around the mean) or long_tail (one
                         request in ten takes ten times the others); drawn from the request's own body, so
                         the same request always takes the same time (a direct client sees the same times)
  hold                   true: every model request waits (in flight, unanswered) until it is set false again,
                         then goes on as configured; a test holds calls for as long as it needs them running
  rate_429/500/timeout   probabilities, drawn from random.Random(seed) (one draw per request);
                         a timeout sleeps timeout_sleep_seconds, then answers 504
  answer_extra_json      JSON members (text, e.g. '"timings":{"prompt_per_second":12500.0}') added as they
                         are to every whole answer, and to a streamed chat completion's finishing chunk: real
                         servers add fields of their own (llama-server's `timings`) and spell numbers their
                         own way (`12500.0`, `1e-7`)
  stream_usage           false: a streamed chat completion never sends its usage chunk, even when asked
                         (llama-cpp-python's server does not), and a streamed message has no token counts
  prompt_cache           off (the default), slot or shared: a prompt cache (local.simulated_cache) of
                         cache_slots slots (slot: llama.cpp's server) or across sequences (shared: vLLM's);
                         its cached tokens are reported in the answer's usage. A change, or a stats reset,
                         empties it
  prompt_token_seconds   each prompt token not found in the cache takes this long to evaluate (on top of
                         latency_seconds), so an order that finds the cache more finishes sooner
Every answer carries a request id header, as OpenAI's and Anthropic's do: `x-request-id` (OpenAI shapes),
`request-id` (Anthropic's).
Markers inside message content:
  [[sim:400]] (or model "reject-me")  -> 400, non-retryable
  [[sim:context-overflow]]            -> 400 with llama-server's body for a prompt over its context, its own
                                         fields and all: {"error": {"code": 400, "message": ..., "type":
                                         "exceed_context_size_error", "n_prompt_tokens": N, "n_ctx": 4096}}
  [[sim:fail-always]]                 -> 500 every time
  [[sim:big:N]]                       -> an answer of about N bytes
  [[sim:flaky:N:CODE]]                -> the first N requests with this exact body fail with CODE
                                         (429, 500 or timeout), later ones succeed
  [[sim:tool:NAME]]                   -> in the LAST message only (so a tool loop ends once the tool's answer
                                         is sent back): a call of tool NAME with input {"query": <the first word
                                         of the answer>}; chat answers finish_reason "tool_calls" with one
                                         tool_calls entry (id "call_<16 hex>") and content null, /v1/messages
                                         answers stop_reason "tool_use" with one tool_use block (id
                                         "toolu_<16 hex>"); max_tokens is not applied to it
  [[sim:bedrock:CLASS]]               -> (Bedrock routes) the error class CLASS (ThrottlingException,
                                         AccessDeniedException, ModelErrorException, ...) with its status
  [[sim:tag:NAME]]                    -> the request is listed under NAME in GET /_sim/timeline's `tags`
                                         (a benchmark tells its kinds of traffic apart); no other effect
Anthropic tool_result blocks count as the text of their content; tool_use blocks add no text.
Control API:
  GET/PUT /_sim/config      read / update any subset of the SimConfig fields (seed re-seeds)
  GET /_sim/stats           total_requests, by_status, by_path, in_flight, max_in_flight, busy_seconds (the sum
                            of every request's time in flight), first_started_at, last_ended_at (epoch seconds),
                            prompt_tokens and prompt_tokens_cached (of model requests: evaluated = their
                            difference)
  GET /_sim/timeline        [started, ended] (epoch seconds) of every request since the last reset, and
                            beside them each one's [[sim:tag:NAME]] (or null)
  POST /_sim/stats/reset    reset the counters, the timeline, the flaky-attempt memory and the prompt cache
Run: python -m local.simulated_backend --host 127.0.0.1 --port 8100 [--latency 0.0]
     [--latency-distribution fixed|lognormal|long_tail] [--latency-sigma 0.5] [--rate-429 0]
     [--rate-500 0] [--rate-timeout 0] [--timeout-sleep 30] [--seed 0] [--prompt-cache off|slot|shared]
     [--cache-slots 4] [--prompt-token-seconds 0]   (defaults from SIM_* env vars)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from itertools import accumulate
from statistics import NormalDist
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from local import simulated_batches, simulated_bedrock_jobs, simulated_message_batches
from local.simulated_answers import (
    BEDROCK_BY_STATUS,
    BEDROCK_ERRORS,
    BEDROCK_RE,
    FLAKY_RE,
    MARK_400,
    MARK_CONTEXT,
    MARK_FAIL,
    SIM_CONTEXT_SIZE,
    TAG_RE,
    Prompt,
    SimError,
    bedrock_invalid,
    build_anthropic,
    build_chat,
    build_converse,
    build_embeddings,
    build_invoke,
    build_responses,
    chat_chunks,
    converse_events,
    message_events,
    parse_chat,
    parse_converse,
    parse_embeddings,
    parse_invoke,
    parse_responses,
)
from local.simulated_cache import PromptCache, tokens_of

TIMELINE_MAX = 200_000  # requests whose start and end times GET /_sim/timeline keeps (since the last reset)
HOLD_CHECK_SECONDS = 0.05  # how often a held request looks whether it was let go
# status -> (OpenAI error type, OpenAI error code, Anthropic error type)
_ERROR_KINDS = {400: ("invalid_request_error", None, "invalid_request_error"),
                500: ("server_error", None, "api_error"),
                429: ("requests", "rate_limit_exceeded", "rate_limit_error"),
                504: ("timeout", "timeout", "timeout_error")}


class SimConfig(BaseModel):
    """Fault settings of the simulated backend."""

    model_config = ConfigDict(extra="forbid")
    latency_seconds: float = Field(0.0, ge=0)
    latency_distribution: Literal["fixed", "lognormal", "long_tail"] = "fixed"
    latency_sigma: float = Field(0.5, ge=0, le=3)
    hold: bool = False
    rate_429: float = Field(0.0, ge=0, le=1)
    rate_500: float = Field(0.0, ge=0, le=1)
    rate_timeout: float = Field(0.0, ge=0, le=1)
    timeout_sleep_seconds: float = Field(30.0, ge=0)
    seed: int = 0
    answer_extra_json: str = ""
    stream_usage: bool = True
    prompt_cache: Literal["off", "slot", "shared"] = "off"
    cache_slots: int = Field(4, ge=1, le=256)
    prompt_token_seconds: float = Field(0.0, ge=0)

    @field_validator("answer_extra_json")
    @classmethod
    def _members(cls, value: str) -> str:
        if value and not isinstance(json.loads("{" + value + "}"), dict):
            raise ValueError("answer_extra_json: JSON object members, such as '\"a\":1.0'")
        return value


def _bedrock_error(err: SimError) -> Response:
    name = err.code if err.code in BEDROCK_ERRORS else BEDROCK_BY_STATUS.get(err.status, "InternalServerException")
    return JSONResponse({"message": err.message}, status_code=BEDROCK_ERRORS.get(name, err.status),
                        headers={"x-amzn-ErrorType": f"{name}:http://internal.amazon.com/coral/com.amazon.bedrock/"})


def _streamed(answer: dict[str, Any], body: dict[str, Any], flavour: str, usage: bool = True,
              extra: str = "") -> StreamingResponse:
    async def events() -> Any:
        if flavour == "anthropic":
            for name, data in message_events(answer, usage):
                yield f"event: {name}\ndata: {json.dumps(data)}\n\n"
        else:
            for data in chat_chunks(answer, body, usage):
                text = json.dumps(data)
                if extra and any(c.get("finish_reason") for c in data["choices"]):  # as llama-server's timings
                    text = text[:-1] + ", " + extra + "}"
                yield f"data: {text}\n\n"
            yield "data: [DONE]\n\n"
    return StreamingResponse(events(), media_type="text/event-stream")


class _SimState:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.in_flight = 0
        self.cache = PromptCache()
        self.cache.configure(config.prompt_cache, config.cache_slots)
        self.reset()

    def reset(self) -> None:
        self.total = 0
        self.by_status: Counter[str] = Counter()
        self.by_path: Counter[str] = Counter()
        self.max_in_flight = self.in_flight
        self.flaky: dict[str, int] = {}
        self.busy_seconds = 0.0
        self.first_started_at: float | None = None
        self.last_ended_at: float | None = None
        self.timeline: list[tuple[float, float]] = []  # (started, ended) of each request, the last TIMELINE_MAX
        self.tags: list[str | None] = []  # beside each: its [[sim:tag:NAME]]
        self.prompt_tokens = 0  # of the model requests that got as far as their prompt's evaluation
        self.prompt_tokens_cached = 0
        self.cache.clear()

    def stats(self) -> dict[str, Any]:
        return {"total_requests": self.total, "by_status": dict(sorted(self.by_status.items())),
                "by_path": dict(sorted(self.by_path.items())), "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight, "busy_seconds": round(self.busy_seconds, 6),
                "first_started_at": self.first_started_at, "last_ended_at": self.last_ended_at,
                "prompt_tokens": self.prompt_tokens, "prompt_tokens_cached": self.prompt_tokens_cached}


def _error_response(err: SimError, flavour: str) -> Response:
    if flavour == "bedrock":
        return _bedrock_error(err)
    oa_type, oa_code, an_type = _ERROR_KINDS.get(err.status, ("server_error", None, "api_error"))
    if err.body is not None:
        content = err.body
    elif flavour == "anthropic":
        content: dict[str, Any] = {"type": "error", "error": {"type": an_type, "message": err.message}}
    else:
        content = {"error": {"message": err.message, "type": oa_type, "param": err.param,
                             "code": err.code or oa_code}}
    return JSONResponse(content, status_code=err.status, headers=err.headers)


LONG_TAIL_SHARE, LONG_TAIL_FACTOR = 0.1, 10.0


def latency_of(config: SimConfig, body: dict[str, Any]) -> float:
    """The request's latency: the configured mean, spread by the distribution; the draw comes from a hash of
    the body (not the shared random stream), so it is the same for the same request whoever sends it."""
    mean = config.latency_seconds
    if config.latency_distribution == "fixed" or mean <= 0:
        return mean
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
    u = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64  # in (0, 1)
    if config.latency_distribution == "lognormal":  # mu chosen so the mean stays `mean`
        sigma = config.latency_sigma
        return mean * math.exp(sigma * NormalDist().inv_cdf(u) - sigma * sigma / 2)
    base = mean / (1 - LONG_TAIL_SHARE + LONG_TAIL_SHARE * LONG_TAIL_FACTOR)
    return base * (LONG_TAIL_FACTOR if u < LONG_TAIL_SHARE else 1.0)


async def _apply_faults(request: Request, state: _SimState, prompt: Prompt, body: dict[str, Any]) -> None:
    joined = "\n".join(prompt.texts)
    if prompt.model == "reject-me" or MARK_400 in joined:
        raise SimError(400, "Request rejected by the simulated backend", code="sim_rejected")
    if MARK_CONTEXT in joined:  # as llama-server answers it
        message = "the request exceeds the available context size, try increasing it"
        raise SimError(400, message, body={"error": {
            "code": 400, "message": message, "type": "exceed_context_size_error",
            "n_prompt_tokens": SIM_CONTEXT_SIZE + prompt.prompt_tokens, "n_ctx": SIM_CONTEXT_SIZE}})
    while state.config.hold:
        await asyncio.sleep(HOLD_CHECK_SECONDS)
    cfg = state.config
    if cfg.latency_seconds > 0:
        await asyncio.sleep(latency_of(cfg, body))
    if MARK_FAIL in joined:
        raise SimError(500, "Simulated permanent server error")
    fault = None
    flaky = FLAKY_RE.search(joined)
    if flaky:
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        attempts = state.flaky[key] = state.flaky.get(key, 0) + 1
        fault = flaky.group(2) if attempts <= int(flaky.group(1)) else None
    draw = state.rng.random()  # always one draw per request, so runs are reproducible
    if fault is None:
        limits = accumulate((cfg.rate_429, cfg.rate_500, cfg.rate_timeout))
        fault = next((f for f, limit in zip(("429", "500", "timeout"), limits, strict=True) if draw < limit), None)
    if fault == "timeout":
        deadline = time.monotonic() + cfg.timeout_sleep_seconds
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.2))
            if await request.is_disconnected():  # stop early so in_flight stays truthful
                raise SimError(499, "Client closed the request")
        raise SimError(504, "Simulated upstream timeout")
    if fault in ("429", "500"):
        headers = {"retry-after": "1"} if fault == "429" else None
        raise SimError(int(fault), f"Simulated HTTP {fault} error", headers=headers)


async def _evaluate_prompt(state: _SimState, prompt: Prompt) -> Any:
    """The prompt's evaluation: its place in the prompt cache (a slot, waited for when all are busy), the time
    its uncached tokens take, and the cached count its answer reports (only while a cache is on: off, the
    answers' usage stays as it always was)."""
    cfg = state.config
    held = await state.cache.take(tokens_of(prompt.texts, prompt.n_messages > 0))
    try:
        if cfg.prompt_cache != "off":
            prompt.cached_tokens = held.cached
        state.prompt_tokens += prompt.prompt_tokens
        state.prompt_tokens_cached += held.cached
        if cfg.prompt_token_seconds > 0:
            await asyncio.sleep((prompt.prompt_tokens - held.cached) * cfg.prompt_token_seconds)
        state.cache.evaluated(held)
    except BaseException:
        await state.cache.give(held)
        raise
    return held


def _endpoint(state: _SimState, parse: Callable[[Any], Prompt], build: Callable[..., dict[str, Any]],
              flavour: str) -> Callable[..., Any]:
    async def handle(request: Request) -> Response:
        try:
            try:
                body = json.loads(await request.body())
            except ValueError:
                raise SimError(400, "We could not parse the JSON body of your request") from None
            if flavour == "bedrock":  # the model is in the path; faults by marker answer as Bedrock's classes
                if not isinstance(body, dict):
                    raise bedrock_invalid("The request body must be a JSON object.")
                body = {**body, "modelId": request.path_params["model_id"]}
                named = BEDROCK_RE.search(json.dumps(body))
                if named and named.group(1) in BEDROCK_ERRORS:
                    raise SimError(BEDROCK_ERRORS[named.group(1)], f"Simulated {named.group(1)}", code=named.group(1))
            prompt = parse(body)
            held = await _evaluate_prompt(state, prompt)
            try:
                await _apply_faults(request, state, prompt, body)
            finally:
                await state.cache.give(held)
            if request.url.path.endswith("/converse-stream"):
                frames = converse_events(build(prompt, body), cut="[[sim:cut-stream]]" in "\n".join(prompt.texts))
                return StreamingResponse(iter(frames), media_type="application/vnd.amazon.eventstream")
            if body.get("stream") is True:
                return _streamed(build(prompt, body), body, flavour, state.config.stream_usage,
                                 state.config.answer_extra_json)
            answer = json.dumps(build(prompt, body), ensure_ascii=False, separators=(",", ":"))
            if state.config.answer_extra_json:
                answer = answer[:-1] + "," + state.config.answer_extra_json + "}"
            counted = ({"X-Amzn-Bedrock-Input-Token-Count": str(prompt.prompt_tokens)} if parse is parse_invoke
                       else None)
            return Response(answer, media_type="application/json", headers=counted)
        except SimError as err:
            return _error_response(err, flavour)

    async def identified(request: Request) -> Response:
        response = await handle(request)
        header = {"anthropic": "request-id", "bedrock": "x-amzn-RequestId"}.get(flavour, "x-request-id")
        response.headers[header] = f"req_sim_{uuid.uuid4().hex}"
        return response

    async def endpoint(request: Request) -> Response:
        state.total += 1
        state.by_path[request.url.path] += 1
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        started = time.time()
        if state.first_started_at is None:
            state.first_started_at = started
        status = 499  # recorded as such if the request is cancelled (client went away)
        tag = TAG_RE.search(await request.body())
        try:
            response = await identified(request)
            status = response.status_code
            return response
        finally:
            state.in_flight -= 1
            state.by_status[str(status)] += 1
            state.last_ended_at = time.time()
            state.busy_seconds += state.last_ended_at - started
            if len(state.timeline) < TIMELINE_MAX:
                state.timeline.append((started, state.last_ended_at))
                state.tags.append(tag.group(1).decode() if tag else None)

    return endpoint


def create_app(config: SimConfig | None = None, s3_endpoint_url: str | None = None) -> FastAPI:
    """Build the simulated backend app; its state is reachable as app.state.sim. `s3_endpoint_url`: where the
    bucket Bedrock's simulated batch jobs read and write is (None: AWS's own, which an in-process moto answers)."""
    app = FastAPI(title="Simulated model backend (test double, not a model)")
    app.state.sim = state = _SimState(config or SimConfig())
    routes: dict[str, tuple[Callable[..., Any], Callable[..., Any], str]] = {
        "/v1/chat/completions": (parse_chat, build_chat, "openai"),
        "/v1/embeddings": (parse_embeddings, build_embeddings, "openai"),
        "/v1/responses": (parse_responses, build_responses, "openai"),
        "/v1/messages": (lambda b: parse_chat(b, ("max_tokens",)), build_anthropic, "anthropic"),
        "/model/{model_id:path}/converse": (parse_converse, build_converse, "bedrock"),
        "/model/{model_id:path}/invoke": (parse_invoke, build_invoke, "bedrock"),
        "/model/{model_id:path}/converse-stream": (parse_converse, build_converse, "bedrock"),
    }
    for path, (parse, build, flavour) in routes.items():
        app.add_api_route(path, _endpoint(state, parse, build, flavour), methods=["POST"])
    simulated_batches.mount(app)  # OpenAI's Files and Batches API: the batch tier of `provider_batch` models
    simulated_message_batches.mount(app)  # Anthropic's Message Batches: the tier of anthropic-kind models
    simulated_bedrock_jobs.mount(app, s3_endpoint_url)  # Bedrock's model invocation jobs: the bedrock kind's tier

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": []}

    @app.get("/_sim/config")
    async def get_config() -> dict[str, Any]:
        return state.config.model_dump()

    @app.put("/_sim/config")
    async def put_config(request: Request) -> JSONResponse:
        try:
            update = json.loads(await request.body())
            new = SimConfig.model_validate({**state.config.model_dump(), **update})
        except (ValueError, TypeError, ValidationError) as exc:  # TypeError: body is not an object
            return _error_response(SimError(400, str(exc)), "openai")
        if "seed" in update:
            state.rng.seed(new.seed)
        state.config = new
        state.cache.configure(new.prompt_cache, new.cache_slots)
        return JSONResponse(new.model_dump())

    @app.get("/_sim/stats")
    async def get_stats() -> dict[str, Any]:
        return state.stats()

    @app.get("/_sim/timeline")
    async def get_timeline() -> dict[str, Any]:
        return {"requests": [[round(a, 6), round(b, 6)] for a, b in state.timeline], "tags": state.tags}

    @app.post("/_sim/stats/reset")
    async def reset_stats() -> dict[str, Any]:
        state.reset()
        return state.stats()

    return app


_CLI_OPTIONS = (("--latency", "latency_seconds", "SIM_LATENCY_SECONDS", float),
                ("--latency-distribution", "latency_distribution", "SIM_LATENCY_DISTRIBUTION", str),
                ("--latency-sigma", "latency_sigma", "SIM_LATENCY_SIGMA", float),
                ("--rate-429", "rate_429", "SIM_RATE_429", float), ("--rate-500", "rate_500", "SIM_RATE_500", float),
                ("--rate-timeout", "rate_timeout", "SIM_RATE_TIMEOUT", float),
                ("--timeout-sleep", "timeout_sleep_seconds", "SIM_TIMEOUT_SLEEP_SECONDS", float),
                ("--seed", "seed", "SIM_SEED", int),
                ("--prompt-cache", "prompt_cache", "SIM_PROMPT_CACHE", str),
                ("--cache-slots", "cache_slots", "SIM_CACHE_SLOTS", int),
                ("--prompt-token-seconds", "prompt_token_seconds", "SIM_PROMPT_TOKEN_SECONDS", float))


def main(argv: list[str] | None = None) -> None:
    """CLI entry point; SIM_* environment variables (read only here) provide the option defaults."""
    import uvicorn

    parser = argparse.ArgumentParser(description="Simulated model backend (deterministic test double, not a model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--log-level", default="warning")
    for flag, name, env_var, kind in _CLI_OPTIONS:
        default = kind(os.environ.get(env_var, SimConfig.model_fields[name].default))
        parser.add_argument(flag, dest=name, type=kind, default=default, help=f"default from ${env_var}")
    args = parser.parse_args(argv)
    config = SimConfig(**{name: getattr(args, name) for _, name, _, _ in _CLI_OPTIONS})
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
