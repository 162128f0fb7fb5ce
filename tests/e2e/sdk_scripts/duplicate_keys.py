"""A body that names a key twice, as the official SDKs see the refusal. An SDK writes its body from a dict, so it
cannot send one: its HTTP client here rewrites the body bytes it sends (`"model":` gains an earlier twin naming
another model), the way a hand-written client or a proxy could. Also one sent with plain httpx.

Needs FREEINFERENCE_BASE_URL (e.g. http://127.0.0.1:8000/v1) and FREEINFERENCE_API_KEY. Prints one JSON object.
"""

import json
import os

import httpx

BASE, KEY = os.environ["FREEINFERENCE_BASE_URL"], os.environ["FREEINFERENCE_API_KEY"]
MODEL = "glm-5.3-flash"
PROMPT = [{"role": "user", "content": "Name three primes."}]
out = {}


def twice_client(http):
    """A client of `http` (httpx, or httpx2 where the SDK is built on it) whose requests name the model twice."""

    class NamesTheModelTwice(http.HTTPTransport):
        def handle_request(self, request):
            body = request.content.replace(b'"model":', b'"model":"no-such-model","model":', 1)
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            return super().handle_request(http.Request(request.method, request.url, headers=headers, content=body))

    return http.Client(transport=NamesTheModelTwice(), timeout=30)


def sdk_client(sdk_class, **options):
    """The SDK's client on a rewriting HTTP client of the package it is built on (it refuses the other)."""
    try:
        return sdk_class(http_client=twice_client(httpx), **options)
    except TypeError:
        import httpx2
        return sdk_class(http_client=twice_client(httpx2), **options)


raw = httpx.post(f"{BASE}/chat/completions", headers={"Authorization": f"Bearer {KEY}",
                                                       "Content-Type": "application/json"}, timeout=30,
                 content=b'{"model":"no-such-model","model":"' + MODEL.encode() + b'","messages":[]}')
out["raw"] = [raw.status_code, raw.json()]

try:
    import openai
except ImportError:
    openai = None
if openai is not None:
    client = sdk_client(openai.OpenAI, base_url=BASE, api_key=KEY, max_retries=0)
    try:
        client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=20)
        out["openai"] = "served"
    except openai.BadRequestError as error:
        out["openai"] = [error.status_code, error.code, error.param, error.message]

try:
    import anthropic
except ImportError:
    anthropic = None
if anthropic is not None:
    client = sdk_client(anthropic.Anthropic, base_url=BASE.removesuffix("/v1") + "/anthropic", api_key=KEY,
                        max_retries=0)
    try:
        client.messages.create(model=MODEL, max_tokens=20, messages=PROMPT)
        out["anthropic"] = "served"
    except anthropic.BadRequestError as error:
        out["anthropic"] = [error.status_code, type(error).__name__, error.body["error"]["type"],
                            error.body["error"]["message"]]
print(json.dumps(out))
