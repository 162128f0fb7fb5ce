"""Loading the model catalog refuses any key its format does not know, in every section (the catalog, a model,
its backend, its price), naming the key and the model: a misspelt key is never silently ignored."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from batchinfer.catalog import DEFAULT_MODELS_FILE, CatalogError, load_catalog, parse_catalog

BACKEND = {"kind": "openai", "base_url": "https://backend.example/v1"}


def model(**extra) -> dict:
    return {"id": "glm", "batch_budget": 2, "backend": dict(BACKEND), **extra}


@pytest.mark.parametrize(("document", "message"), [
    ({"models": [model(batch_budjet=3)]}, "model 'glm': unknown key 'batch_budjet'"),
    ({"models": [model(), {**model(), "id": "qwen", "backend": {**BACKEND, "api_key_evn": "K"}}]},
     "model 'qwen': unknown key 'backend.api_key_evn'"),
    ({"models": [model(price={"input_per_mtok": 1, "output_per_mtoken": 2})]},
     "model 'glm': unknown key 'price.output_per_mtoken'"),
    ({"models": [model()], "model_defaults": {"batch_budget": 4}}, "the catalog: unknown key 'model_defaults'"),
    ({"models": [{"batch_budjet": 3, "backend": dict(BACKEND)}]}, "models[0]: unknown key 'batch_budjet'"),
])
def test_an_unknown_key_is_refused_naming_the_model_and_the_key(document, message):
    with pytest.raises(CatalogError) as raised:
        parse_catalog(document, {})
    assert message in str(raised.value)


def test_the_file_the_service_loads_is_refused_the_same_way(tmp_path: Path):
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": [model(batch_budjet=3)]}))
    with pytest.raises(CatalogError) as raised:
        load_catalog(path, {})
    assert str(raised.value) == (f"model catalog {path}: model 'glm': unknown key 'batch_budjet' (a misspelling? "
                                 "it would be ignored)")


def test_every_fault_is_named_at_once_with_other_faults_as_before():
    document = {"models": [model(batch_budjet=3, batch_budget="many")]}
    message = str(pytest.raises(CatalogError, parse_catalog, document, {}).value)
    assert "unknown key 'batch_budjet'" in message and "model 'glm': batch_budget: " in message


def test_the_shipped_catalog_and_known_keys_load():
    catalog = load_catalog(DEFAULT_MODELS_FILE, {})
    assert catalog.runnable
    loaded = parse_catalog({"models": [model(aliases=["g"], price={"input_per_mtok": 1}, tokenizer="cl100k_base")]},
                           {})
    assert loaded.get("glm").batch_budget == 2
