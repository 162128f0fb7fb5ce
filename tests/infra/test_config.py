"""Settings, catalog parsing and the layer build recipe: fast, no synthesis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from batchinfer import catalog as core
from infra import layers
from infra.config import (
    AUTO_WORKER_RESERVE_MAX,
    DEFAULT_MODELS_FILE,
    LAMBDA_EVENT_BODY_LIMIT_BYTES,
    REPO_ROOT,
    CatalogModel,
    InfraConfig,
    load_catalog,
    resolve_config,
)
from infra.functions import estimated_env_bytes
from infra.stack import build_app


def getter(context: dict[str, Any]):
    return context.get


def write_catalog(tmp_path: Path, models: list[dict[str, Any]]) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(json.dumps({"models": models}))
    return path


def test_defaults_match_the_deployment_contract() -> None:
    config = resolve_config(getter({}))
    assert config.stage == "dev"
    assert config.max_body_bytes == 4 * 1024 * 1024 == LAMBDA_EVENT_BODY_LIMIT_BYTES
    assert not config.custom_catalog
    assert config.settings_env() == {
        "STAGE": "dev",
        "LOG_LEVEL": "INFO",
        "FILE_BATCHES_ENABLED": "false",
        "MESSAGE_BATCHES_ENABLED": "false",
        "EMBEDDINGS_RESPONSES_BATCHES_ENABLED": "false",
        "BATCH_WEBHOOKS_ENABLED": "false",
        "BATCH_COMPLETION_WINDOW_SECONDS": "86400",
        "BATCH_RETENTION_SECONDS": "604800",
        "TIER_LIMITS": "free=8,pro=16,internal=64",
        "TIER_REQUESTS_PER_MINUTE": "free=1800,pro=6000,internal=30000",
        "MAX_LONG_POLLS_PER_ACCOUNT": "20",
    }
    assert (config.batches_expire_after_days, config.files_expire_after_days) == (9, 37)


def test_cdk_json_defaults_are_valid_and_equal_the_model_defaults() -> None:
    context = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    assert resolve_config(getter(context)) == InfraConfig()


def test_precedence_defaults_file_then_top_level_context(tmp_path: Path) -> None:
    stage_file = tmp_path / "prod.yaml"
    stage_file.write_text("stage: prod\nlog_level: warning\nretention_seconds: 3600\n")
    context = {
        "batchinfer": {"stage": "dev", "log_level": "DEBUG", "tier_limits": "free=1"},
        "config_file": str(stage_file),
        "retention_seconds": "7200",  # -c values arrive as strings
        "batch_webhooks_enabled": "true",
        "alarm_email": "none",
        "scheduled_reserved_concurrency": "null",
        "catalog_env": '{"SIMULATED_BACKEND_URL": "https://sim.example"}',
    }
    config = resolve_config(getter(context))
    assert config.stage == "prod" and config.log_level == "WARNING"  # file over cdk.json
    assert config.tier_limits == "free=1"  # cdk.json over defaults
    assert config.retention_seconds == 7200  # -c over file
    assert config.batch_webhooks_enabled is True
    assert config.alarm_email is None and config.scheduled_reserved_concurrency is None
    assert config.catalog_env == {"SIMULATED_BACKEND_URL": "https://sim.example"}


@pytest.mark.parametrize(
    "context",
    [
        {"stage": "Prod"},
        {"stage": "a" * 21},
        {"max_body_bytes": 6 * 1024 * 1024 + 1},
        {"tier_limits": "free:8"},
        {"log_retention_days": 31},
        {"catalog_env": {"TABLE_NAME": "x"}},
        {"catalog_env": {"AWS_REGION": "x"}},
        {"catalog_env": {"WEBHOOK_QUEUE_URL": "x"}},
        {"catalog_env": {"WEBHOOK_KEY_ID": "alias/x"}},
        {"catalog_env": {"WEBHOOK_ALLOW_LOOPBACK": "true"}},  # on Lambda, loopback is the Runtime API
        {"unknown_setting": 1, "batchinfer": {"unknown_setting": 1}},
        {"api_throttle_rate_limit": 500, "api_throttle_burst_limit": 100},
    ],
)
def test_bad_settings_are_refused(context: dict[str, Any]) -> None:
    with pytest.raises((ValidationError, ValueError)):
        resolve_config(getter(context))


def test_default_catalog_loads() -> None:
    catalog = load_catalog(REPO_ROOT / DEFAULT_MODELS_FILE, stage="dev")
    assert catalog.models and all(m.batch_budget >= 1 for m in catalog.models)


def test_catalog_names_and_auto_models(tmp_path: Path) -> None:
    path = write_catalog(
        tmp_path,
        [
            {
                "id": "glm-5.3-flash",
                "batch_budget": 16,
                "backend": {"base_url": "${SIM:-http://127.0.0.1:8100}/v1", "api_key_env": "GLM_API_KEY"},
            },
            {"id": "auto", "auto": True},
        ],
    )
    catalog = load_catalog(path, stage="dev")
    assert catalog.auto_model_ids == ("auto",)
    (glm,) = catalog.models
    assert (glm.slug, glm.queue_name("dev"), glm.dlq_name("dev")) == (
        "glm-5-3-flash",
        "dev-batchinfer-glm-5-3-flash",
        "dev-batchinfer-glm-5-3-flash-dlq",
    )
    assert glm.secret_name("dev") == "dev/batchinfer/models/glm-5.3-flash"
    assert glm.needs_secret and glm.max_concurrency == 16
    assert glm.backend_is_loopback  # the local simulator: works locally, never from Lambda
    assert (
        not load_catalog(path, stage="dev", env={"SIM": "https://sim.example"}).models[0].backend_is_loopback
    )


def test_catalog_budget_env_expansion_and_caps(tmp_path: Path) -> None:
    path = write_catalog(
        tmp_path,
        [
            {"id": "big", "batch_budget": 4000, "backend": {"base_url": "https://x"}},
            {"id": "one", "batch_budget": 1, "backend": {"base_url": "${ONE_URL:-http://localhost:1}"}},
            {"id": "env", "batch_budget": "${ENV_BUDGET:-12}", "auto": "${ENV_AUTO:-false}"},
        ],
    )
    catalog = load_catalog(path, stage="dev", env={"ONE_URL": "https://one.example"})
    by_id = {m.model_id: m for m in catalog.models}
    assert by_id["big"].max_concurrency == 1000
    assert by_id["one"].max_concurrency == 2 and not by_id["one"].backend_is_loopback
    assert by_id["env"].batch_budget == 12 and not by_id["env"].needs_secret


@pytest.mark.parametrize(
    "models",
    [
        [{"id": "a.b", "batch_budget": 1}, {"id": "a-b", "batch_budget": 1}],  # one queue name for two models
        [{"id": "a", "batch_budget": 1}, {"id": "a", "batch_budget": 1}],
        [{"id": "a"}],
        [{"id": "a", "batch_budget": 0}],
        [{"id": "only-auto", "auto": True}],
        [{"id": "bad id!", "batch_budget": 1}],
    ],
)
def test_bad_catalogs_are_refused(tmp_path: Path, models: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError):
        load_catalog(write_catalog(tmp_path, models), stage="dev")


def test_long_model_ids_get_unique_queue_names_within_sqs_limits(tmp_path: Path) -> None:
    long_a, long_b = "m" * 90 + "-a", "m" * 90 + "-b"
    path = write_catalog(tmp_path, [{"id": long_a, "batch_budget": 2}, {"id": long_b, "batch_budget": 2}])
    models = load_catalog(path, stage="production-eu-1", env={}).models
    names = [m.dlq_name("production-eu-1") for m in models]
    assert len(set(names)) == 2 and all(len(n) <= 80 for n in names)


def test_helpers() -> None:
    # The rules live in the core package; infra has no copy of them.
    assert core.slugify("Qwen3.6-35B/Instruct") == "qwen3-6-35b-instruct"
    assert core.expand("${A:-x}/${B:-y}/${C}", {"A": "1"}) == "1/y/"


def test_default_models_file_is_the_core_layer_s_catalog() -> None:
    assert (REPO_ROOT / DEFAULT_MODELS_FILE).resolve() == Path(core.DEFAULT_MODELS_FILE).resolve()


def test_an_empty_variable_takes_the_default_as_in_the_functions(tmp_path: Path) -> None:
    # Same `:-` as bash and as the core catalog the functions load: set-but-empty means "use the default".
    path = write_catalog(
        tmp_path,
        [
            {
                "id": "m",
                "batch_budget": "${BUDGET:-3}",
                "backend": {"base_url": "${URL:-https://default.example}/v1"},
            }
        ],
    )
    env = {"URL": "", "BUDGET": ""}
    (model,) = load_catalog(path, stage="dev", env=env).models
    assert (model.base_url, model.batch_budget) == ("https://default.example/v1", 3)
    core_model = core.load_catalog(path, env).get("m")
    assert (core_model.backend.base_url, core_model.batch_budget) == (model.base_url, model.batch_budget)


def test_catalog_errors_name_the_file_and_the_model(tmp_path: Path) -> None:
    path = write_catalog(tmp_path, [{"id": "a.b", "batch_budget": 1}, {"id": "A-B", "batch_budget": 1}])
    with pytest.raises(ValueError, match=r"models\.yaml: models 'a\.b' and 'A-B' map to one queue name"):
        load_catalog(path, stage="dev")
    path = write_catalog(tmp_path, [{"id": "m", "backend": {"base_url": "https://x"}}])
    with pytest.raises(ValueError, match=r"models\.yaml: model 'm' needs a batch_budget"):
        load_catalog(path, stage="dev")
    # What the functions' catalog refuses (here an unknown backend kind) fails the synth, not the Lambda.
    path = write_catalog(tmp_path, [{"id": "m", "batch_budget": 1, "backend": {"kind": "x", "base_url": "y"}}])
    with pytest.raises(ValueError, match=r"models\.yaml: model 'm': backend\.kind: Input should be 'openai'"):
        load_catalog(path, stage="dev")
    path = write_catalog(tmp_path, [{"id": "m", "batch_budget": 1}, {"id": "n", "aliases": ["m"], "auto": True}])
    with pytest.raises(ValueError, match=r"models\.yaml: .*the name 'm' is used twice"):
        load_catalog(path, stage="dev")


def test_deps_layer_recipe_installs_the_hashed_lock_for_lambda_python_312_arm64(tmp_path: Path) -> None:
    args = layers.pip_arguments(tmp_path / "python")
    joined = " ".join(args)
    for expected in (
        "--platform manylinux2014_aarch64",
        "--implementation cp",
        "--python-version 3.12",
        "--only-binary=:all:",
        "--require-hashes",
        "--no-deps",
        f"--target {tmp_path / 'python'}",
        f"-r {layers.LOCK_FILE}",
    ):
        assert expected in joined
    # The lock is resolved for the same target (uv's name for it), with hashes.
    lock = " ".join(layers.lock_arguments())
    assert "--python-version 3.12" in lock and "--python-platform aarch64-manylinux2014" in lock
    assert "--generate-hashes" in lock and "--only-binary :all:" in lock
    # The layer's identity (stamp and asset hash) is the lock's content, not requirements.txt's.
    locked = tmp_path / "requirements-layer.lock"
    locked.write_text("pyyaml==6.0.4 \\\n    --hash=sha256:" + "a" * 64 + "\n")
    first = layers.requirements_hash(locked)
    assert first == layers.requirements_hash(locked)
    locked.write_text("pyyaml==6.0.4 \\\n    --hash=sha256:" + "b" * 64 + "\n")  # same pin, other build
    assert layers.requirements_hash(locked) != first


def test_functions_and_layer_build_target_one_architecture() -> None:
    from infra.functions import ARCHITECTURE, RUNTIME

    assert ARCHITECTURE.name == "arm64" and layers.LAMBDA_PLATFORM.endswith("_aarch64")
    assert layers.LOCK_PLATFORM.startswith("aarch64-")
    assert RUNTIME.name == f"python{layers.LAMBDA_PYTHON_VERSION}"


def test_lock_pins_every_requirement_at_its_version_with_hashes() -> None:
    locked = layers.pins(layers.LOCK_FILE)
    required = layers.pins(layers.REQUIREMENTS_FILE)
    assert required and set(required) <= set(locked)
    for name, version in required.items():
        assert locked[name] == version, name
    entries = layers.lock_entries()
    assert len(entries) == len(locked) > len(required)  # indirect dependencies are locked too
    for entry, hashes in entries.items():
        assert hashes, f"{entry} has no --hash"
    assert {"pydantic-core", "starlette", "anyio", "urllib3", "botocore"} <= set(locked)
    assert layers.lock_problems() == []


def test_lock_problems_name_a_drifted_pin(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("PyYAML==6.0.5\nhttpx==0.28.1\n")
    lock = tmp_path / "lock"
    hashed = "pyyaml==6.0.4 \\\n    --hash=sha256:" + "a" * 64 + "\n    # via -r requirements.txt\n"
    lock.write_text(hashed + "httpx==0.28.1\n")
    assert layers.lock_problems(requirements, lock) == ["pyyaml==6.0.5 is locked as 6.0.4", "httpx==0.28.1 has no hash"]


def test_tests_run_against_the_layer_s_locked_versions() -> None:
    # The venv (requirements-dev.txt, -r requirements.txt) must resolve the indirect packages to the lock's
    # versions too, or the tests would import other code than Lambda runs.
    from importlib import metadata

    drift = {}
    for name, version in layers.pins(layers.LOCK_FILE).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            drift[name] = (version, installed)
    assert drift == {}


def test_the_venv_installs_under_the_lock_s_versions_as_hash_free_constraints(tmp_path: Path) -> None:
    # What keeps the check above true from a clean clone: `make venv` writes the lock's versions, without the
    # hashes (they would put the whole install in hash-checking mode, and are of Lambda's wheels), and
    # installs requirements-dev.txt under them.
    text = layers.constraints_text()
    assert "--hash" not in text
    pinned = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert pinned == sorted(f"{name}=={version}" for name, version in layers.pins(layers.LOCK_FILE).items())
    written = tmp_path / "constraints.txt"
    assert layers.main(["--constraints", str(written)]) == 0 and written.read_text() == text
    makefile = (layers.REPO_ROOT / "Makefile").read_text()
    assert "$(BIN)/.installed: requirements.txt requirements-dev.txt requirements-layer.lock" in makefile
    assert "-m infra.layers --constraints $(LOCK_CONSTRAINTS)" in makefile
    assert "pip install --quiet -r requirements-dev.txt -c $(LOCK_CONSTRAINTS)" in makefile


def test_skip_flag_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(layers.SKIP_ENV_VAR, raising=False)
    assert not layers.skip_requested() and layers.skip_requested(True) and layers.skip_requested("1")
    monkeypatch.setenv(layers.SKIP_ENV_VAR, "1")
    assert layers.skip_requested()
    placeholder = layers.placeholder_deps_layer()
    assert placeholder.placeholder and (placeholder.path / "python").is_dir()


def test_environment_size_estimate_counts_tokens_at_their_resolved_length() -> None:
    assert estimated_env_bytes({"A": "xy"}) == 3
    assert estimated_env_bytes({"Q": '{"m": "${Token[TOKEN.12]}"}'}) == 1 + len('{"m": ""}') + 140


def test_backend_keys_may_not_travel_in_catalog_env(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model secrets"):
        build_app(
            {"skip_deps_build": True, "catalog_env": {"GLM_API_KEY": "sk-123"}},
            outdir=str(tmp_path),
            nag=False,
        )


def test_every_allowed_log_retention_maps_to_cloudwatch() -> None:
    from infra.config import VALID_LOG_RETENTION_DAYS
    from infra.functions import log_retention

    assert all(log_retention(days) for days in VALID_LOG_RETENTION_DAYS)


def test_reserved_concurrency_settings() -> None:
    models = [CatalogModel("a", "a", 16, False, "https://a.example"), CatalogModel("b", "b", 1, False, "https://b")]
    default = resolve_config(getter({}))
    assert default.worker_reserved_concurrency == "auto"
    assert default.worker_reserve(models) == 16 + 2  # each model's MaximumConcurrency (at least 2)
    assert default.api_reserved_concurrency is None
    huge = [CatalogModel("big", "big", 5000, False, "https://a.example")]
    assert default.worker_reserve(huge) == AUTO_WORKER_RESERVE_MAX  # auto never takes most of an account
    config = resolve_config(getter({"worker_reserved_concurrency": "40", "api_reserved_concurrency": "300"}))
    assert config.worker_reserve(models) == 40 and config.api_reserved_concurrency == 300
    assert config.reserved_total(models) == 2 * 2 + 40 + 300
    assert resolve_config(getter({"worker_reserved_concurrency": "none"})).worker_reserve(models) is None
    for bad in ({"worker_reserved_concurrency": "0"}, {"worker_reserved_concurrency": "lots"},
                {"api_reserved_concurrency": "0"}, {"tier_requests_per_minute": "free:10"}):
        with pytest.raises(ValueError):
            resolve_config(getter(bad))
