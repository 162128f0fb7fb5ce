"""The Bedrock provider's boto3 client: botocore's retries off (the service counts and retries every attempt
itself), timeouts from the call's, one client per region and endpoint, and the moto server's AWS_ENDPOINT_URL
never sending Bedrock calls to moto. No call is made."""

from __future__ import annotations

import pytest

from batchinfer.providers import bedrock


@pytest.fixture(autouse=True)
def fresh_clients():
    bedrock._clients.clear()
    yield
    bedrock._clients.clear()


def test_retries_off_timeouts_from_the_call_and_one_client_per_region_and_endpoint():
    runtime = bedrock.client("us-east-1", "http://127.0.0.1:9", 30.0, 12)
    config = runtime.meta.config
    assert config.retries["total_max_attempts"] == 1
    assert (config.read_timeout, config.connect_timeout, config.max_pool_connections) == (30.0, 10.0, 12)
    assert runtime.meta.endpoint_url == "http://127.0.0.1:9" and runtime.meta.region_name == "us-east-1"
    assert bedrock.client("us-east-1", "http://127.0.0.1:9", 30.0, 12) is runtime
    assert bedrock.client("eu-west-1", "http://127.0.0.1:9", 30.0, 12) is not runtime


def test_the_moto_endpoint_variables_do_not_redirect_bedrock(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5000")
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", "http://127.0.0.1:5000")
    assert bedrock.client("us-west-2", None, 30.0, 4).meta.endpoint_url == "https://bedrock-runtime.us-west-2.amazonaws.com"


def test_the_error_table_names_every_error_class_converse_and_invoke_model_raise():
    import botocore.loaders

    operations = botocore.loaders.Loader().load_service_model("bedrock-runtime", "service-2")["operations"]
    raised = {e["shape"] for name in ("Converse", "InvokeModel") for e in operations[name]["errors"]}
    assert raised == set(bedrock.ERROR_STATUS)
