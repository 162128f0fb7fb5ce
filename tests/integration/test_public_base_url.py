"""A Message Batch's results_url: on the configured public base URL (PUBLIC_BASE_URL) when one is set, not on
whatever Host header the request came with; on the request's host otherwise. Through the real API handler."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from batchinfer.settings import Settings
from tests.helpers import finish, new_key, ok, settings
from tests.integration.test_message_batches import V1, Messages, entry

EVENT_HOST = "https://a1b2c3d4e5.execute-api.us-east-1.amazonaws.com"  # the test events' Host


def test_results_url_is_on_the_public_base_url_when_set(api, svc):
    settings(svc, message_batches_enabled=True)
    _, key = new_key(svc)
    messages = Messages(api, key, version=V1)
    batch = ok(messages.create([entry("q-0")]))
    finish(svc, batch["id"])
    path = f"/v1/messages/batches/{batch['id']}/results"
    assert ok(messages("GET", f"/{batch['id']}"))["results_url"] == f"{EVENT_HOST}/anthropic{path}"
    settings(svc, public_base_url="https://batches.example.com")
    forged = {"host": "attacker.example"}  # a Host header the client (or a proxy) chose
    for prefix in ("", "/anthropic"):
        shown = ok(Messages(api, key, version=V1, prefix=prefix)("GET", f"/{batch['id']}", headers=forged))
        assert shown["results_url"] == f"https://batches.example.com{prefix}{path}", shown
    listed = ok(messages("GET", "", headers=forged))["data"]
    assert [b["results_url"] for b in listed] == [f"https://batches.example.com/anthropic{path}"]


def test_the_setting_takes_an_http_url_and_drops_a_trailing_slash():
    assert Settings(public_base_url="https://api.example.com/").public_base_url == "https://api.example.com"
    assert Settings(public_base_url="https://api.example.com/prod").public_base_url == "https://api.example.com/prod"
    assert Settings(public_base_url="").public_base_url is None
    for wrong in ("api.example.com", "ftp://api.example.com", "https://", "https://api.example.com/?a=1"):
        with pytest.raises(ValidationError, match="PUBLIC_BASE_URL"):
            Settings(public_base_url=wrong)
