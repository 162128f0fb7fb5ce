"""A key the deployment does not know fails the synth, naming the key (and, in the catalog, the model): a
misspelt `batch_budjet: 3` must not deploy a model at the default budget of 8, nor a misspelt setting keep
its default without a word."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.stack import build_app

GOOD = {"id": "m", "batch_budget": 2, "backend": {"kind": "openai", "base_url": "https://backend.example/v1"}}


def synth(tmp_path: Path, **context: Any) -> None:
    build_app({"skip_deps_build": True, **context}, outdir=str(tmp_path / "out"), nag=False)


@pytest.mark.parametrize(("entry", "named"), [
    ({**GOOD, "batch_budjet": 3}, "model 'm': unknown key 'batch_budjet'"),
    ({**GOOD, "backend": {**GOOD["backend"], "base_ulr": "https://x.example"}},
     "model 'm': unknown key 'backend.base_ulr'"),
    ({**GOOD, "price": {"input_per_mtok": 1.0, "ouput_per_mtok": 2.0}},
     "model 'm': unknown key 'price.ouput_per_mtok'"),
])
def test_the_synth_refuses_a_catalog_key_it_does_not_know(tmp_path: Path, entry: dict, named: str) -> None:
    catalog = tmp_path / "models.yaml"
    catalog.write_text(json.dumps({"models": [entry]}))
    with pytest.raises(ValueError, match="unknown key") as raised:
        synth(tmp_path, models_file=str(catalog))
    assert named in str(raised.value) and str(catalog) in str(raised.value)


def test_the_synth_refuses_a_top_level_catalog_key_it_does_not_know(tmp_path: Path) -> None:
    catalog = tmp_path / "models.yaml"
    catalog.write_text(json.dumps({"models": [GOOD], "defaults": {"batch_budget": 4}}))
    with pytest.raises(ValueError, match="the catalog: unknown key 'defaults'"):
        synth(tmp_path, models_file=str(catalog))


def test_the_synth_refuses_a_deployment_setting_it_does_not_know(tmp_path: Path) -> None:
    settings = tmp_path / "stage.yaml"
    settings.write_text("stage: dev\nretain_dat: false\n")
    with pytest.raises(ValueError, match="retain_dat") as raised:
        synth(tmp_path, config_file=str(settings))
    assert "Extra inputs are not permitted" in str(raised.value)
