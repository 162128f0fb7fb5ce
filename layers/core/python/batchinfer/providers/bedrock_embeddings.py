"""Embeddings on Amazon Bedrock: an OpenAI embeddings body to the InvokeModel bodies of Titan text and Cohere
embed models, and their answers back to OpenAI's embeddings list. Pure: stdlib only, no I/O. As for chat
(`providers.converse`), nothing is silently dropped: a parameter neither body can carry is refused, named.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from ..translating import Untranslatable, not_a_parameter

EMBEDDINGS_ENDPOINT = "/v1/embeddings"
_TO = "Amazon Bedrock (Converse)"
_NOT_A_PARAMETER = not_a_parameter(_TO)

# --- embeddings: OpenAI body -> InvokeModel bodies -> OpenAI list ------------------------------------------------

_EMBEDDING_CARRIED = frozenset({"model", "input", "encoding_format", "dimensions", "user"})


def embedding_bodies(body: dict, embedding_format: str | None) -> list[dict]:
    """The InvokeModel bodies an embeddings request takes: one per text for Titan (it embeds one text a call),
    one for all texts for Cohere. `user` is not sent: neither body has a place for it, and it changes no
    vector."""
    for key, value in body.items():
        if key not in _EMBEDDING_CARRIED and value is not None:
            raise Untranslatable(f"{key}: {_NOT_A_PARAMETER}")
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise Untranslatable("input: only text (a string or a list of strings) can be embedded by a Bedrock model "
                             "(not token arrays)")
    dimensions = body.get("dimensions")
    if embedding_format == "titan":
        extra = {"dimensions": dimensions} if dimensions is not None else {}
        return [{"inputText": text, **extra} for text in texts]
    if embedding_format == "cohere":
        if dimensions is not None:
            raise Untranslatable("dimensions: Cohere embed models on Bedrock answer their own dimensions")
        # search_document: the input is embedded as text to be found (OpenAI's embeddings make no distinction).
        return [{"texts": texts, "input_type": "search_document", "embedding_types": ["float"]}]
    raise Untranslatable("model: this model's backend declares no embedding_format (titan or cohere)")


def vectors_of(answer: dict, embedding_format: str | None) -> list[list[float]]:
    """The vectors of one InvokeModel answer."""
    if embedding_format == "titan":
        vector = answer.get("embedding")
        if not isinstance(vector, list):
            raise ValueError("embedding: the answer holds no vector")
        return [vector]
    embeddings = answer.get("embeddings")
    if isinstance(embeddings, dict):  # asked with embedding_types: {"float": [...]}
        embeddings = embeddings.get("float")
    if not isinstance(embeddings, list):
        raise ValueError("embeddings: the answer holds no vectors")
    return embeddings


def to_embeddings(vectors: list[list[float]], model: str, tokens: int, encoding_format: str | None) -> dict:
    data = []
    for i, vector in enumerate(vectors):
        value: Any = vector
        if encoding_format == "base64":  # as OpenAI sends it: little-endian float32
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
