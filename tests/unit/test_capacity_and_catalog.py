"""Model budgets under interactive load and 429s; the catalog file; settings parsing."""

import pytest

from batchinfer.catalog import Model, load_catalog
from batchinfer.scheduling.capacity import effective_budget
from batchinfer.settings import DEFAULT_MODELS_FILE, Settings

MODEL = Model(id="m", batch_budget=16, batch_floor=2, backend={"base_url": "http://127.0.0.1:1/v1"})


@pytest.mark.parametrize(("item", "expected"), [
    (None, 16), ({"in_flight": 10}, 16), ({"interactive": 5}, 11), ({"interactive": 100}, 2),
    ({"adaptive_cap": 6}, 6), ({"adaptive_cap": 1}, 2), ({"adaptive_cap": 12, "interactive": 8}, 8)])
def test_effective_budget(item, expected):
    assert effective_budget(MODEL, item, 1) == expected


def test_default_catalog_serves_the_spec_s_models_from_the_simulator():
    catalog = load_catalog(DEFAULT_MODELS_FILE, {"SIMULATED_BACKEND_URL": "http://127.0.0.1:9"})
    assert [m.id for m in catalog.runnable] == ["glm-5.3-flash", "qwen3.6-35b", "claude-bedrock"]
    bedrock = catalog.get("claude-bedrock").backend
    assert (bedrock.kind, bedrock.endpoint_url, bedrock.region) == ("bedrock", "http://127.0.0.1:9", "us-east-1")
    assert catalog.lookup("glm-flash").id == "glm-5.3-flash"
    assert catalog.lookup("auto").auto and catalog.lookup("nope") is None
    assert catalog.get("qwen3.6-35b").backend.base_url == "http://127.0.0.1:9/v1"
    assert catalog.get("glm-5.3-flash").cost_usd(1_000_000, 1_000_000) == pytest.approx(0.5)


def test_catalog_expands_defaults_and_refuses_a_name_used_twice(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - id: a\n    backend: {base_url: '${URL:-http://127.0.0.1:7}/v1'}\n"
                    "  - id: b\n    aliases: [a]\n    backend: {base_url: x}\n")
    with pytest.raises(ValueError, match="used twice"):
        load_catalog(path, {})
    path.write_text("models:\n  - id: a\n    backend: {base_url: '${URL:-http://127.0.0.1:7}/v1'}\n")
    assert load_catalog(path, {}).get("a").backend.base_url == "http://127.0.0.1:7/v1"


def test_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("TIER_LIMITS", "free=1,pro=2,internal=3")
    monkeypatch.setenv("BATCH_ACCESS_TIERS", "pro,internal")
    monkeypatch.setenv("FILE_BATCHES_ENABLED", "true")
    monkeypatch.setenv("BATCH_COMPLETION_WINDOW_SECONDS", "600")
    monkeypatch.setenv("MODEL_QUEUES", '{"m": "http://q"}')
    s = Settings()
    assert s.tier_limits == {"free": 1, "pro": 2, "internal": 3}
    assert s.batch_access_tiers == ["pro", "internal"]
    assert s.file_batches_enabled and s.batch_completion_window_seconds == 600
    assert s.model_queues == {"m": "http://q"}


def test_settings_defaults_match_the_spec():
    s = Settings()
    assert (s.max_requests_per_batch, s.max_body_bytes, s.max_result_bytes) == (50_000, 32 << 20, 4 << 20)
    assert (s.max_unfinished_batches, s.max_unfinished_requests, s.max_attempts) == (10, 100_000, 8)
    assert s.tier_limits == {"free": 8, "pro": 16, "internal": 64}
    assert (s.batch_completion_window_seconds, s.batch_retention_seconds) == (86_400, 604_800)
    assert not any([s.file_batches_enabled, s.message_batches_enabled, s.embeddings_responses_batches_enabled,
                    s.batch_webhooks_enabled])


def test_interactive_memory_gives_way_at_once_and_takes_room_back_after_its_window():
    """Back-to-back interactive calls dip the count for milliseconds between them; batch work must not take
    those dips as room (it would run for a whole request)."""
    from batchinfer.scheduling import capacity

    clock = [100.0]

    class HeldClock:
        def monotonic(self) -> float:
            return clock[0]

    memory = capacity.InteractiveMemory(window_seconds=2.0, clock=HeldClock())
    assert memory.level("m", {"interactive": 0}) == 0
    assert memory.level("m", {"interactive": 16}) == 16  # load arrives: at once
    clock[0] += 0.3
    assert memory.level("m", {"interactive": 15}) == 16  # a dip between two calls: ignored
    clock[0] += 0.5
    assert memory.level("m", {"interactive": 16}) == 16
    clock[0] += memory.window_seconds + 0.1
    assert memory.level("m", {}) == 0  # gone for the whole window: the room comes back
    assert memory.level("other", {"interactive": 3}) == 3  # per model
