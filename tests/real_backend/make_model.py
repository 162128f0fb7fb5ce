"""A tiny llama-architecture GGUF model with random weights and a byte-level BPE tokenizer trained on local text.

Nothing is downloaded: the tokenizer is trained with `tokenizers` on the repository's README (or any text given),
the weights are random (seeded, so the same file every time), and `gguf`'s GGUFWriter writes the file with the
tokenizer metadata llama.cpp needs (a "gpt2" vocabulary: tokens, token types, merges, BOS/EOS, a chat template).
The model says nothing sensible, but llama.cpp runs it as it runs any llama model: it tokenizes, decodes,
stops at EOS or max_tokens, counts usage and embeds.

Runs in the real-backend venv (.venv-real-backend, where `gguf`, `tokenizers` and `numpy` are installed):

    .venv-real-backend/bin/python -m tests.real_backend.make_model OUT.gguf [--text FILE ...] [--shape prefix]

Three sizes (`--shape`): `tiny` (the default; decodes in microseconds); `prefix`, larger (about 3.6 M
weights, 4,096 tokens of context), whose prompt evaluation takes long enough on one thread that a long shared
prefix dominates a request's time, as on a real model: the prompt cache test runs on it; and `medium` (about
8 M weights), about twice as slow a token, so that a server's fixed cost per step (which every short answer
pays) weighs less beside a prompt's evaluation: the prompt cache benchmark runs on it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOS, EOS = "<s>", "</s>"
# The roles are marked in plain text (no special tokens), so the chat template needs nothing beyond BOS/EOS.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def render_chat(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """The prompt CHAT_TEMPLATE makes of text `messages`: what the server tokenizes for a chat completion."""
    text = BOS + "".join(f"<|{m['role']}|>\n{m['content']}{EOS}\n" for m in messages)
    return text + ("<|assistant|>\n" if add_generation_prompt else "")


@dataclass(frozen=True)
class Shape:
    """The model's size: a llama with these dimensions (head_dim = hidden / heads)."""

    vocab: int = 768
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    ffn: int = 128
    context: int = 2048


# The sizes `--shape` names: the tiny model of the flow tests, and two whose prompt evaluation dominates.
SHAPES = {"tiny": Shape(), "prefix": Shape(hidden=256, layers=4, heads=4, ffn=768, context=4096),
          "medium": Shape(hidden=384, layers=4, heads=6, ffn=1152, context=4096)}


@dataclass(frozen=True)
class Vocabulary:
    tokens: list[str]
    merges: list[str]
    bos_id: int
    eos_id: int


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> Vocabulary:
    """A byte-level BPE (GPT-2's byte-to-unicode alphabet, as llama.cpp's "gpt2" vocabulary expects) trained
    on `texts`, with BOS and EOS as its first two tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    model = json.loads(tokenizer.to_str())["model"]
    by_id = sorted(model["vocab"].items(), key=lambda item: item[1])
    tokens = [token for token, _ in by_id]
    assert [i for _, i in by_id] == list(range(len(by_id))), "token ids must be 0..n-1"
    # tokenizers writes merges as "a b" strings (older releases) or ["a", "b"] pairs (newer ones).
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return Vocabulary(tokens=tokens, merges=merges, bos_id=tokens.index(BOS), eos_id=tokens.index(EOS))


def write_model(path: Path, vocabulary: Vocabulary, shape: Shape = Shape(), seed: int = 0,
                name: str = "tiny-llama") -> Path:
    """Write a llama GGUF of `shape` with random float32 weights (seeded) and `vocabulary`."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    n_vocab, n_embd, n_ff = len(vocabulary.tokens), shape.hidden, shape.ffn

    def weight(rows: int, cols: int, scale: float = 0.5) -> np.ndarray:
        # numpy's (rows, cols) is GGUF's ne = [cols, rows]: a matrix from `cols` inputs to `rows` outputs.
        return rng.normal(0.0, scale / np.sqrt(cols), size=(rows, cols)).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.heads)
    writer.add_rope_dimension_count(n_embd // shape.heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    # Mean pooling: an embedding is one vector per input (used only by a context made for embeddings).
    writer.add_pooling_type(gguf.PoolingType.MEAN)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocabulary.tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in (BOS, EOS) else gguf.TokenType.NORMAL
                            for t in vocabulary.tokens])
    writer.add_token_merges(vocabulary.merges)
    writer.add_bos_token_id(vocabulary.bos_id)
    writer.add_eos_token_id(vocabulary.eos_id)
    writer.add_add_bos_token(False)  # the chat template writes BOS itself
    writer.add_chat_template(CHAT_TEMPLATE)

    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
    for i in range(shape.layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones(n_embd))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones(n_embd))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", ones(n_embd))
    # Logits far apart (a standard deviation of about 10): greedy decoding picks the same token however the
    # server batches the prompt's evaluation (its prompt cache changes the float rounding from call to call).
    writer.add_tensor("output.weight", weight(n_vocab, n_embd, scale=40.0))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def make_model(path: Path, texts: Sequence[str] | None = None, shape: Shape = Shape(), seed: int = 0) -> Path:
    """The whole model: a tokenizer trained on `texts` (default: the repository's README) and random weights."""
    if texts is None:
        texts = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    return write_model(path, train_tokenizer(texts, shape.vocab), shape, seed)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    parser.add_argument("--text", type=Path, action="append", help="text to train the tokenizer on (README.md)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="the model's size (tiny)")
    args = parser.parse_args(argv)
    texts = None
    if args.text:
        texts = [line for f in args.text for line in f.read_text(encoding="utf-8").splitlines()]
    make_model(args.out, texts, SHAPES[args.shape], seed=args.seed)
    print(args.out)


if __name__ == "__main__":
    main()
