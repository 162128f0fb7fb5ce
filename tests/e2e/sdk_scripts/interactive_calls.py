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
    chunks = list(client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=20, stream=True,
                                                 stream_options={"include_usage": True}))
    out["chat_stream"] = {"deltas": sum(1 for c in chunks if c.choices and c.choices[0].delta.content),
                          "text": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                          "finish": [c.choices[0].finish_reason for c in chunks if c.choices][-1],
                          "usage": [chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens]}
    plain = list(client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=20, stream=True))
    out["chat_stream_no_usage"] = [c.usage for c in plain if getattr(c, "usage", None)]
    try:
        client.responses.create(model=MODEL, input="Say hi", store=False, stream=True)
    except openai.BadRequestError as error:
        out["responses_stream"] = [error.status_code, error.param]

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
    with client.messages.stream(model=MODEL, max_tokens=64, messages=PROMPT) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    out["message_stream"] = {"pieces": len(pieces), "text": "".join(pieces), "final": final.content[0].text,
                             "stop_reason": final.stop_reason,
                             "usage": [final.usage.input_tokens, final.usage.output_tokens]}
    tool = {"name": "lookup", "description": "Look a word up.",
            "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}
    with client.messages.stream(model=MODEL, max_tokens=64, tools=[tool], messages=[
            {"role": "user", "content": "Look it up [[sim:tool:lookup]]"}]) as stream:
        called = stream.get_final_message()
    out["message_stream_tool"] = [called.stop_reason, called.content[0].type, called.content[0].name,
                                  called.content[0].input]

print(json.dumps(out))
