"""The catalog's `prompt_cache` (what kind of prompt cache a model's backend has) and `cached_input_per_mtok`."""

from __future__ import annotations

import pytest

from batchinfer.catalog import CatalogError, parse_catalog

OPENAI = {"kind": "openai", "base_url": "https://backend.example/v1"}
ANTHROPIC = {"kind": "anthropic", "base_url": "https://anthropic.example"}
BEDROCK = {"kind": "bedrock", "model_id": "m", "region": "us-east-1"}


def one(**model) -> object:
    return parse_catalog({"models": [{"id": "m", **model}]}, {}).models[0]


def test_defaults_follow_the_backend_kind() -> None:
    assert one(backend=OPENAI).cache_kind == "slot"
    assert one(backend=ANTHROPIC, endpoints=["/v1/messages"]).cache_kind == "provider"
    assert one(backend=BEDROCK).cache_kind == "off"


@pytest.mark.parametrize("kind", ["slot", "shared", "provider", "off"])
def test_each_kind_may_be_named(kind: str) -> None:
    assert one(backend=OPENAI, prompt_cache=kind).cache_kind == kind


def test_an_unknown_kind_is_refused_naming_the_field() -> None:
    with pytest.raises(CatalogError) as raised:
        one(backend=OPENAI, prompt_cache="lru")
    assert "model 'm': prompt_cache:" in str(raised.value) and "'shared'" in str(raised.value)


def test_cached_input_is_charged_at_its_price_and_the_saving_shown() -> None:
    priced = one(backend=OPENAI, price={"input_per_mtok": 1.0, "output_per_mtok": 4.0, "cached_input_per_mtok": 0.1})
    assert priced.cost_usd(1_000_000, 0, cached_tokens=800_000) == pytest.approx(0.2 + 0.08)
    assert priced.cache_saving_usd(1_000_000, 800_000) == pytest.approx(0.72)
    plain = one(backend=OPENAI, price={"input_per_mtok": 1.0, "output_per_mtok": 4.0})
    assert plain.cost_usd(1_000_000, 0, cached_tokens=800_000) == pytest.approx(1.0)  # no cached price: input
    assert plain.cache_saving_usd(1_000_000, 800_000) == 0.0
    with pytest.raises(CatalogError):
        one(backend=OPENAI, price={"cached_input_per_mtok": -1})
