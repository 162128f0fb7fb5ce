"""The interactive endpoints with the official SDKs, as a user calls them: `openai` (chat completions,
embeddings, Responses, models, a refused body) and `anthropic` (messages), whichever this interpreter has.

Needs FREEINFERENCE_BASE_URL (e.g. http://127.0.0.1:8000/v1) and FREEINFERENCE_API_KEY. Prints one JSON object.
"""

import json
import os

BASE, KEY = os.environ["FREEINFERENCE_BASE_URL"], os.environ["FREEINFERENCE_API_KEY"]
MODEL = "glm-5.3-flash"
PROMPT = [{"role": "user", "content": "Name three primes."}]
out = {}

try:
    import openai
except ImportError:
    openai = None
if openai is not None:
    client = openai.OpenAI(base_url=BASE, api_key=KEY, max_retries=0)
    chat = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=20)
    out["chat"] = {"object": chat.object, "content": chat.choices[0].message.content, "model": chat.model,
                   "usage": [chat.usage.prompt_tokens, chat.usage.completion_tokens]}
    embedded = client.embeddings.create(model=MODEL, input=["a", "b"])
    out["embeddings"] = [len(item.embedding) for item in embedded.data]
    response = client.responses.create(model=MODEL, input="Say hi", store=False)
    out["responses"] = {"object": response.object, "text": response.output_text}
    out["models"] = [model.id for model in client.models.list()]
    out["model"] = client.models.retrieve("qwen3.6-35b").id
    out["auto"] = client.chat.completions.create(model="auto-pro", messages=PROMPT).model
    try:
        client.chat.completions.create(model=MODEL, messages=PROMPT, temperature="hot")
    except openai.BadRequestError as error:
        out["refused"] = [error.status_code, error.param, error.message]
    try:
        client.chat.completions.create(model="no-such-model", messages=PROMPT)
    except openai.NotFoundError as error:
        out["not_found"] = [error.status_code, error.code]

try:
    import anthropic
except ImportError:
    anthropic = None
if anthropic is not None:
    client = anthropic.Anthropic(base_url=BASE.removesuffix("/v1") + "/anthropic", api_key=KEY, max_retries=0)
    message = client.messages.create(model=MODEL, max_tokens=64, messages=PROMPT)
    out["message"] = {"type": message.type, "role": message.role, "text": message.content[0].text,
                      "stop_reason": message.stop_reason, "output_tokens": message.usage.output_tokens}
    try:
        client.messages.create(model="no-such-model", max_tokens=5, messages=PROMPT)
    except anthropic.NotFoundError as error:
        out["message_not_found"] = [error.status_code, type(error).__name__]

print(json.dumps(out))
