"""batchinfer.catalog owns the names core and infra must agree on: `${VAR:-default}`, queues, secrets, metrics."""

import subprocess
import sys
from pathlib import Path

import pytest
from aws_lambda_powertools.metrics import MetricUnit

from batchinfer import catalog
from batchinfer.observability import metrics
from batchinfer.storage import bootstrap

CORE = Path(catalog.__file__).resolve().parents[1]


def test_an_empty_variable_takes_the_default():
    # bash `:-`: unset and empty both take the default; only a non-empty value wins.
    assert catalog.expand("${U:-http://d}/v1", {"U": ""}) == "http://d/v1"
    assert catalog.expand("${U:-http://d}/v1", {}) == "http://d/v1"
    assert catalog.expand("${U:-http://d}/v1", {"U": "https://x"}) == "https://x/v1"
    assert catalog.expand("${U}|${U:-}", {}) == "|"


def test_the_catalog_file_expands_an_empty_variable_to_its_default(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - id: m\n    batch_budget: '${B:-5}'\n    backend: {base_url: '${URL:-http://d}/v1'}\n")
    model = catalog.load_catalog(path, {"URL": "", "B": ""}).get("m")
    assert (model.backend.base_url, model.batch_budget) == ("http://d/v1", 5)


@pytest.mark.parametrize(("model_id", "expected"), [
    ("glm-5.3-flash", "dev-batchinfer-glm-5-3-flash"),
    ("Org/Model.V2+x", "dev-batchinfer-org-model-v2-x"),
    ("--A__b--", "dev-batchinfer-a__b"),
])
def test_queue_names(model_id, expected):
    assert catalog.queue_name("dev", model_id) == expected
    assert catalog.dlq_name("dev", model_id) == expected + "-dlq"


def test_long_ids_are_fitted_to_sqs_limits_and_kept_apart():
    base = ("Acme/" + "Giant.Model-" * 8)[:89]
    long_a, long_b = base + "A", base + "B"
    names = [catalog.dlq_name("production-eu-1", m) for m in (long_a, long_b)]
    assert len(long_a) == 90 and len(set(names)) == 2 and all(len(n) <= 80 for n in names)
    assert catalog.queue_slugs("production-eu-1", [long_a, long_b]) == {
        long_a: catalog.queue_slug("production-eu-1", long_a), long_b: catalog.queue_slug("production-eu-1", long_b)}


def test_two_models_on_one_queue_name_and_unusable_ids_are_refused():
    with pytest.raises(ValueError, match="'a.b' and 'A-B' map to one queue name"):
        catalog.queue_slugs("dev", ["a.b", "A-B"])
    with pytest.raises(ValueError, match="no character usable"):
        catalog.queue_name("dev", "///")


def test_local_bootstrap_refuses_two_models_on_one_queue():
    class NoSqs:
        def create_queue(self, **_kwargs):
            raise AssertionError("nothing is created before the names are checked")

    with pytest.raises(ValueError, match="one queue name"):
        bootstrap.create_queues(NoSqs(), "local", ["a.b", "a-b"])


def test_secret_name():
    assert catalog.secret_name("prod", "Org/Model.V2+x") == "prod/batchinfer/models/Org/Model.V2+x"


def test_functions_emit_in_the_shared_namespace():
    metrics.add_metric(name="Probe", unit=MetricUnit.Count, value=1)
    try:
        emitted = metrics.serialize_metric_set()["_aws"]["CloudWatchMetrics"][0]["Namespace"]
    finally:
        metrics.clear_metrics()
    assert emitted == catalog.METRICS_NAMESPACE == "BatchInference"


def test_catalog_module_is_pure():
    # infra imports it next to aws-cdk, and docs/tools may import it with no AWS libraries installed.
    blocked = ["boto3", "botocore", "aws_cdk", "constructs", "aws_lambda_powertools"]
    code = (f"import sys\nfor name in {blocked!r}: sys.modules[name] = None\n"
            "import batchinfer.catalog\nprint('ok')")
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(CORE)},
                          capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "ok", done.stderr
