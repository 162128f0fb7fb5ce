"""A model's provider batch tier in the catalog: read into a typed value, and refused, naming the field, when the
service could not honour it (a price above the model's, a guard as long as the window, a job smaller or larger than
its kind takes, an unknown key); and a part split into jobs of at most `max_requests`, as even as can be."""

from __future__ import annotations

import pytest

from batchinfer.catalog import CatalogError, parse_catalog
from batchinfer.service.offloading.execution import MAX_PLANNED_JOBS, job_sizes

PRICE = {"input_per_mtok": 0.40, "output_per_mtok": 1.60}
TIER = {"price": {"input_per_mtok": 0.20, "output_per_mtok": 0.80}, "min_requests": 100, "max_requests": 50000,
        "poll_seconds": 60, "guard_seconds": 7200, "default": "auto"}


def model(tier: dict, kind: str = "openai") -> dict:
    backend = ({"kind": "bedrock", "model_id": "m", "region": "us-east-1"} if kind == "bedrock"
               else {"kind": kind, "base_url": "https://backend.example/v1"})
    return {"id": "gpt-mini", "backend": backend, "price": PRICE, "provider_batch": tier}


def test_a_tier_is_read_into_a_typed_value():
    tier = parse_catalog({"models": [model(TIER)]}, {}).get("gpt-mini").provider_batch
    assert tier is not None
    assert (tier.price.input_per_mtok, tier.min_requests, tier.max_requests, tier.poll_seconds, tier.guard_seconds,
            tier.default) == (0.20, 100, 50000, 60, 7200, "auto")
    assert tier.cost_usd(1_000_000, 1_000_000) == pytest.approx(1.00)


def test_an_anthropic_model_may_have_a_tier_of_up_to_100000_requests_a_job():
    tier = parse_catalog({"models": [model({**TIER, "max_requests": 100_000}, "anthropic")]}, {}).get("gpt-mini")
    assert tier.provider_batch.max_requests == 100_000


def test_a_bedrock_model_may_have_a_tier_of_at_least_100_requests_a_job():
    tier = parse_catalog({"models": [model({**TIER, "min_requests": 100}, "bedrock")]}, {}).get("gpt-mini")
    assert (tier.provider_batch.min_requests, tier.provider_batch.max_requests) == (100, 50000)


def test_a_model_without_a_tier_has_none_and_a_tier_defaults_to_direct():
    catalog = parse_catalog({"models": [{"id": "a", "backend": {"kind": "openai", "base_url": "http://x/v1"}},
                                        model({"price": {"input_per_mtok": 0.1}})]}, {})
    assert catalog.get("a").provider_batch is None
    assert catalog.get("gpt-mini").provider_batch.default == "direct"


@pytest.mark.parametrize(("tier", "kind", "named"), [
    ({**TIER, "price": {"input_per_mtok": 0.50, "output_per_mtok": 0.80}}, "openai",
     "provider_batch.price.input_per_mtok is above the model's own price"),
    ({**TIER, "guard_seconds": 86400}, "openai", "provider_batch.guard_seconds"),
    ({**TIER, "poll_seconds": 0}, "openai", "provider_batch.poll_seconds"),
    ({**TIER, "max_requests": 50001}, "openai", "provider_batch.max_requests"),
    ({**TIER, "min_requests": 10, "max_requests": 5}, "openai", "provider_batch.max_requests is below min_requests"),
    ({**TIER, "default": "provider_batch"}, "openai", "provider_batch.default"),
    ({**TIER, "guard_secs": 60}, "openai", "unknown key 'provider_batch.guard_secs'"),
    ({**TIER, "min_requests": 99}, "bedrock", "provider_batch.min_requests (99) is below the fewest requests one "
                                            "bedrock job takes (100)"),
    ({**TIER, "max_requests": 50_001}, "bedrock", "above what one bedrock job takes (50000)"),
    ({**TIER, "max_requests": 100_001}, "anthropic", "above what one anthropic job takes (100000)"),
])
def test_a_tier_the_service_cannot_honour_is_refused_naming_the_field(tier, kind, named):
    with pytest.raises(CatalogError) as raised:
        parse_catalog({"models": [model(tier, kind)]}, {})
    assert "model 'gpt-mini'" in str(raised.value)
    assert named in str(raised.value)


@pytest.mark.parametrize(("total", "most", "sizes"), [
    (100, 50_000, [100]),
    (50_000, 50_000, [50_000]),
    (50_001, 50_000, [25_001, 25_000]),  # never a job of one request beside a full one
    (250, 100, [84, 83, 83]),
    (100 * MAX_PLANNED_JOBS + 1, 100, [100] * MAX_PLANNED_JOBS),  # the rest runs directly
])
def test_a_part_is_split_into_as_few_jobs_as_its_tier_allows_as_even_as_can_be(total, most, sizes):
    assert job_sizes(total, most) == sizes
