"""JSON kept as the text it came in. A backend's answer is stored and shown with the bytes the backend sent,
never re-encoded: a number read into Python and written back may change its spelling (`1e-7` comes back
`1e-07`), and one stored as a DynamoDB number changes its type (`12500.0` came back `12500`).

`Text` is a parsed JSON object that keeps its text; `to_json` writes JSON with every `Text` in it as that text.
"""

from __future__ import annotations

import json
import re
import secrets


class Text(dict):
    """A JSON object, parsed, with the text it was parsed from (`text`). Read it as the dict it is; `to_json`
    writes the text. Do not change it: the text would no longer say the same."""

    __slots__ = ("text",)

    def __init__(self, value: dict, text: str) -> None:
        super().__init__(value)
        self.text = text


def read_object(text: str | bytes) -> Text | None:
    """The JSON object `text` holds, keeping its text; None when it is not JSON or not an object."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return Text(value, text) if isinstance(value, dict) else None


def parse_object(text: str) -> Text:
    """The JSON object `text` holds, keeping its text (ValueError when it holds no object)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return Text(value, text)


# --- Reading a client's JSON: I-JSON (RFC 7493) --------------------------------------------------------------

class DuplicateKey(ValueError):
    """A JSON object names `key` twice. RFC 7493 (I-JSON) forbids it: readers disagree on which one counts
    (Python's json takes the last, others the first), so a proxy or firewall in front could read another
    request than the one that runs. `path`: where the object is, from the top ('requests', 3, 'body'), and
    `value`: the text read as Python would (the last one winning), to say more of where it is."""

    def __init__(self, key: str, path: tuple[str | int, ...], value: object) -> None:
        super().__init__(f"the key {key!r} appears more than once in one object")
        self.key = key
        self.path = path
        self.value = value


class _Twice(Exception):
    """Raised by `_unique` mid-parse: cheap, no path (found afterwards, only for a refused body)."""


def _unique(pairs: list[tuple[str, object]]) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise _Twice
    return value


class _Pairs(dict):
    """An object read by the slow second pass, with its first key named twice (or None)."""

    __slots__ = ("twice",)


def _marking(pairs: list[tuple[str, object]]) -> _Pairs:
    value = _Pairs(pairs)
    value.twice = None
    if len(value) != len(pairs):
        seen: set[str] = set()
        value.twice = next(k for k, _ in pairs if k in seen or seen.add(k))
    return value


def _first_twice(value: object) -> tuple[str, tuple[str | int, ...]] | None:
    """The first object (depth first, in document order) that names a key twice: (key, its path)."""
    stack: list[tuple[object, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, _Pairs):
            if node.twice is not None:
                return node.twice, path
            stack.extend((v, (*path, k)) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((v, (*path, i)) for i, v in reversed(list(enumerate(node))))
    return None


def loads(text: str | bytes) -> object:
    """A client's JSON, read as `json.loads` reads it, but refusing an object that names a key twice
    (DuplicateKey, a ValueError). The check costs one dict build per object; where the key is, is looked
    for only in a body that is refused."""
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except _Twice:
        value = json.loads(text, object_pairs_hook=_marking)
        found = _first_twice(value)
        assert found is not None  # the first pass found one
        raise DuplicateKey(found[0], found[1], value) from None


def where(path: tuple[str | int, ...]) -> str:
    """A path as a parameter's name: ('requests', 3, 'body') -> 'requests[3].body'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def text_of(value: dict) -> str:
    """A JSON object's text: a `Text`'s own, else compact JSON."""
    return value.text if isinstance(value, Text) else json.dumps(value, separators=(",", ":"))


# Valid JSON holds a line break only as whitespace between tokens (inside strings they are escaped), so
# writing it as a space keeps the value and puts the text on one line (JSONL). U+2028, U+2029 and U+0085 may
# stand in a string unescaped, and split a line for readers that take them as line ends: they are escaped.
_LINE_BREAKS = str.maketrans({"\n": " ", "\r": " ", "\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def one_line(text: str) -> str:
    return text.translate(_LINE_BREAKS)


def to_json(value: object, ensure_ascii: bool = True) -> str:
    """Compact JSON of `value` on one line, each `Text` in it written as its own text (on one line)."""
    token = secrets.token_hex(8)
    kept: list[str] = []

    def swap(node: object) -> object:
        if isinstance(node, Text):
            kept.append(one_line(node.text))
            return f"{token}:{len(kept) - 1}"
        if isinstance(node, dict):
            return {k: swap(v) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return [swap(v) for v in node]
        return node

    out = json.dumps(swap(value), separators=(",", ":"), ensure_ascii=ensure_ascii)
    if not kept:
        return out
    return re.sub(f'"{token}:(\\d+)"', lambda m: kept[int(m.group(1))], out)
