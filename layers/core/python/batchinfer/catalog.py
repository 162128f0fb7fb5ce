"""The model catalog: which models exist, their aliases, backends, budgets and prices."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class Backend(BaseModel):
    # Only OpenAI-compatible backends so far; Anthropic backends arrive with the Message Batches issue.
    kind: Literal["openai"] = "openai"
    base_url: str
    api_key_env: str | None = None
    api_key_secret: str | None = None
    model: str | None = None  # the name the backend knows the model by, if not its catalog id


class Price(BaseModel):
    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0


class Model(BaseModel):
    id: str
    aliases: list[str] = Field(default_factory=list)
    auto: bool = False
    backend: Backend | None = None
    batch_budget: int = 8
    batch_floor: int = 1
    price: Price = Field(default_factory=Price)
    endpoints: list[str] = Field(default_factory=lambda: ["/v1/chat/completions"])

    @property
    def backend_model(self) -> str:
        return (self.backend.model if self.backend else None) or self.id

    def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.price.input_per_mtok + output_tokens * self.price.output_per_mtok) / 1e6


class Catalog(BaseModel):
    models: list[Model]

    def model_post_init(self, _context: object) -> None:
        self._by_name: dict[str, Model] = {}
        for model in self.models:
            for name in [model.id, *model.aliases]:
                if name in self._by_name:
                    raise ValueError(f"model catalog: the name {name!r} is used twice")
                self._by_name[name] = model

    def lookup(self, name: str) -> Model | None:
        """The model a name (id or alias) points to now, or None."""
        return self._by_name.get(name)

    def get(self, model_id: str) -> Model:
        return self._by_name[model_id]

    @property
    def runnable(self) -> list[Model]:
        """Models that batches can run on (auto models are routed per request and refused)."""
        return [m for m in self.models if not m.auto and m.backend is not None]


def _expand(value: object, env: Mapping[str, str]) -> object:
    if isinstance(value, str):
        return _VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [_expand(v, env) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, env) for k, v in value.items()}
    return value


def load_catalog(path: str | Path, env: Mapping[str, str]) -> Catalog:
    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    return Catalog.model_validate(_expand(raw, env))
