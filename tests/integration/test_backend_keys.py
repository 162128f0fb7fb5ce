"""Backend keys in Secrets Manager: until the operator puts a model's real key, its secret holds the deploy's
placeholder; the worker never sends it, and fails that model's requests at once with a clear error (no
retries, no backend call). Once the real key is in, the model runs within the placeholder's short cache."""

from __future__ import annotations

import types

import pytest

from batchinfer.catalog import SECRET_PLACEHOLDER
from batchinfer.storage import secrets
from batchinfer.storage.aws import client
from batchinfer.storage.secrets import BackendKeyNotSet, forget_keys, secret_value
from tests.helpers import chat_request, finish, new_key, ok, settings, sim_requests

GLM, QWEN = "glm-5.3-flash", "qwen3.6-35b"


class Clock:
    def __init__(self) -> None:
        self.value = 0.0

    def monotonic(self) -> float:
        return self.value


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(secrets, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    forget_keys()
    yield fake
    forget_keys()


@pytest.fixture
def glm_secret(svc, clock) -> str:
    """GLM's backend key secret, as the deploy leaves it: the placeholder."""
    sm = client("secretsmanager", svc.settings.aws_endpoint_url, svc.settings.aws_region)
    arn = sm.create_secret(Name=f"test/batchinfer/{GLM}", SecretString=SECRET_PLACEHOLDER)["ARN"]
    settings(svc, model_secrets={GLM: arn})
    return arn


@pytest.mark.parametrize("pull", [False, True], ids=["one-message", "pulling-worker"])
def test_a_model_whose_key_is_the_placeholder_fails_its_requests_unsent(api, svc, sim_control, glm_secret, pull):
    settings(svc, worker_pull=pull)
    _, key = new_key(svc)
    batch = api.created(key, [chat_request(f"g-{i}", "hi", model=GLM) for i in range(3)]
                        + [chat_request("q-0", "hi", model=QWEN)])
    final = finish(svc, batch["id"])
    assert final["status"] == "completed" and final["completed"] == 1 and final["failed"] == 3
    assert sim_requests(sim_control) == 1  # only the model with a key was called
    results = {r["custom_id"]: r for r in ok(api.results(key, batch["id"]))["data"]}
    assert results["q-0"]["status"] == "completed"
    for custom_id in ("g-0", "g-1", "g-2"):
        error = results[custom_id]["error"]
        assert results[custom_id]["status"] == "failed" and error["code"] == "service_unavailable", error
        assert GLM in error["message"] and "backend API key" in error["message"]
    assert final["cost_unknown_attempts"] == 0


def test_the_real_key_is_used_once_the_operator_puts_it(api, svc, sim_control, glm_secret, clock):
    sm = client("secretsmanager", svc.settings.aws_endpoint_url, svc.settings.aws_region)
    with pytest.raises(BackendKeyNotSet):
        secret_value(glm_secret, svc.settings.aws_endpoint_url, svc.settings.aws_region)
    sm.put_secret_value(SecretId=glm_secret, SecretString="sk-the-real-key")
    with pytest.raises(BackendKeyNotSet):  # the placeholder is cached a little while
        secret_value(glm_secret, svc.settings.aws_endpoint_url, svc.settings.aws_region)
    clock.value += secrets.PLACEHOLDER_CACHE_SECONDS
    assert secret_value(glm_secret, svc.settings.aws_endpoint_url, svc.settings.aws_region) == "sk-the-real-key"
    _, key = new_key(svc)
    batch = api.created(key, [chat_request(f"g-{i}", "hi", model=GLM) for i in range(2)])
    final = finish(svc, batch["id"])
    assert final["completed"] == 2 and sim_requests(sim_control) == 2
    # A real key is kept longer, but not for good: a rotated key is picked up too.
    sm.put_secret_value(SecretId=glm_secret, SecretString="sk-rotated")
    clock.value += secrets.KEY_CACHE_SECONDS
    assert secret_value(glm_secret, svc.settings.aws_endpoint_url, svc.settings.aws_region) == "sk-rotated"
