"""The simulated backend's prompt cache (a TEST DOUBLE's model of one, not a cache of anything real).

A prompt is its tokens (each message: 3 tokens of its own, then its words, as `Prompt.prompt_tokens` counts
them). What a request finds cached is not evaluated again: only its uncached tokens take
`prompt_token_seconds` each, and its answer reports the cached ones (`usage.prompt_tokens_details.cached_tokens`
in OpenAI's shape, `cache_read_input_tokens` in Anthropic's), as a real server does. Two kinds:

- `slot` (llama.cpp's server, `--parallel N`): `cache_slots` slots, each holding the prompt it last
  evaluated; a request takes the idle slot whose prompt shares the longest prefix with its own, or, when no
  slot shares half of its prompt, the least recently used one (llama-server's choice), and waits for one
  when every slot is busy; slots share nothing.
- `shared` (vLLM, SGLang): one cache of blocks of `BLOCK` tokens across every sequence; a request finds the
  blocks of its prefix that some earlier request computed, whole blocks only. A block is there once the
  request that computes it has evaluated its prompt, so requests of a new prefix sent together each compute it.
- `off`: nothing cached (every prompt token is evaluated).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections import OrderedDict
from dataclasses import dataclass

BLOCK = 16  # tokens per block of the shared cache (vLLM's default block size)
SIMILARITY = 0.5  # llama-server's --slot-prompt-similarity: below it a slot's cache is no match
SHARED_BLOCKS = 200_000  # blocks the shared cache keeps, the least recently used going first


def tokens_of(texts: list[str], per_message: bool) -> list[str]:
    """A prompt's tokens: each text's 3 tokens of its own (for messages), then its words."""
    tokens: list[str] = []
    for text in texts:
        if per_message:
            tokens += ["<|m|>"] * 3
        tokens += text.split()
    return tokens


def common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class _Slot:
    tokens: list[str]
    busy: bool = False
    used: int = 0  # when it was last taken (a counter): the least recently used goes on a tie


@dataclass
class Held:
    """A request's place in the cache while it runs: its slot (slot kind), its tokens, what it found cached."""

    tokens: list[str]
    cached: int
    slot: _Slot | None = None


class PromptCache:
    def __init__(self) -> None:
        self.kind, self.size = "off", 0
        self.slots: list[_Slot] = []
        self.blocks: OrderedDict[bytes, None] = OrderedDict()
        self.turn = itertools.count(1)
        self.freed = asyncio.Condition()

    def configure(self, kind: str, slots: int) -> None:
        """Take a kind and slot count; a change empties the cache (as a restarted server's is)."""
        if (kind, slots) != (self.kind, self.size):
            self.kind, self.size = kind, slots
            self.clear()

    def clear(self) -> None:
        self.slots = [_Slot([]) for _ in range(self.size)] if self.kind == "slot" else []
        self.blocks.clear()

    async def take(self, tokens: list[str]) -> Held:
        """Where a request's prompt is evaluated, and how much of it is cached there (waits for an idle slot)."""
        if self.kind == "slot" and self.slots:
            async with self.freed:
                await self.freed.wait_for(lambda: any(not s.busy for s in self.slots))
                idle = [s for s in self.slots if not s.busy]
                slot = max(idle, key=lambda s: (common_prefix(s.tokens, tokens), -s.used))
                if common_prefix(slot.tokens, tokens) < SIMILARITY * len(tokens):  # none is like it: the
                    slot = min(idle, key=lambda s: s.used)  # least recently used (llama-server's choice)
                cached = common_prefix(slot.tokens, tokens)
                slot.busy, slot.used, slot.tokens = True, next(self.turn), tokens
                return Held(tokens, min(cached, max(len(tokens) - 1, 0)), slot)
        if self.kind == "shared":
            found = 0
            for key in self._block_keys(tokens):
                if key not in self.blocks:
                    break
                self.blocks.move_to_end(key)
                found += BLOCK
            return Held(tokens, min(found, max(len(tokens) - 1, 0)))
        return Held(tokens, 0)

    def evaluated(self, held: Held) -> None:
        """Its prompt is evaluated: in the shared cache, its blocks are there for the requests after it."""
        if self.kind == "shared":
            for key in self._block_keys(held.tokens):
                self.blocks[key] = None
                self.blocks.move_to_end(key)
            while len(self.blocks) > SHARED_BLOCKS:
                self.blocks.popitem(last=False)

    async def give(self, held: Held) -> None:
        if held.slot is not None:
            async with self.freed:
                held.slot.busy = False
                self.freed.notify_all()

    @staticmethod
    def _block_keys(tokens: list[str]) -> list[bytes]:
        keys, running = [], hashlib.sha256()
        for start in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
            running.update("\x00".join(tokens[start:start + BLOCK]).encode() + b"\x01")
            keys.append(running.copy().digest())
        return keys
