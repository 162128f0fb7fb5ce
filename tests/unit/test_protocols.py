"""The protocol registry: what each batch API protocol declares, how a batch finds its protocol, and that
the shared code asks the registry instead of naming a protocol itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from batchinfer import protocols
from batchinfer.domain import FINAL_BATCH, BatchStatus
from batchinfer.errors import ApiError
from batchinfer.layout import owner_sort, owner_sort_created_us
from batchinfer.protocols import anthropic, openai

ROOT = Path(__file__).resolve().parents[2] / "layers" / "core" / "python"
# Modules that are one protocol's own, or speak of backends rather than batch APIs; every other module of
# the package is shared and must not name a protocol. The API's route modules each serve one protocol,
# and its schemas hold each protocol's shapes for the OpenAPI document; batchctl is a client of that API.
# A backend's `kind` is "openai" or "anthropic" too: the catalog, the providers and the translation
# between the two request formats are about backends. The operations are each protocol's own. The check of
# a Messages request's params is about that request format (its rules go by the `anthropic-version` header),
# for Message Batches and interactive Messages calls alike.
OWN_OR_BACKEND = ("batchinfer.protocols", "batchinfer.operations", "batchinfer.providers", "batchinfer.catalog",
                  "batchinfer.messages_to_chat", "batchinfer.service.creating.message_params",
                  "batchinfer.api.routes", "batchinfer.api.schemas", "batchinfer.cli")
_HEX = re.compile("[0-9a-f]*")


def test_the_registry_holds_each_protocol_by_its_name():
    assert protocols.PROTOCOLS == {"openai": openai.PROTOCOL, "anthropic": anthropic.PROTOCOL}
    assert all(protocols.named(name).name == name for name in protocols.PROTOCOLS)
    with pytest.raises(LookupError):
        protocols.named("unknown")


def test_a_stored_batch_finds_its_protocol_by_its_api():
    assert protocols.of_batch({"id": "batch_1"}) is openai.PROTOCOL  # the default protocol's items have none
    assert protocols.of_batch({"id": "msgbatch_1", "api": "anthropic"}) is anthropic.PROTOCOL
    with pytest.raises(LookupError):
        protocols.of_batch({"api": "unknown"})


def test_a_batch_id_finds_its_protocol_by_its_prefix():
    for protocol in protocols.PROTOCOLS.values():
        assert protocols.of_batch_id(protocol.batch_ids.new()) is protocol
    assert protocols.of_batch_id("b1") is protocols.DEFAULT  # an id of no registered kind


def test_ids_and_listings_of_two_protocols_cannot_be_mistaken_for_each_other():
    """No batch id prefix starts another (an id names one protocol), and no listing prefix starts another
    (an account's list of one protocol's batches, a `begins_with` query, holds none of another's)."""
    registered = list(protocols.PROTOCOLS.values())
    for a in registered:
        for b in registered:
            if a is not b:
                assert not b.batch_ids.prefix.startswith(a.batch_ids.prefix)
                assert not b.owner_prefix.startswith(a.owner_prefix)


def test_each_protocol_lists_its_batches_apart():
    for protocol in protocols.PROTOCOLS.values():
        assert owner_sort(7, protocol.batch_ids.new()).startswith(f"{protocol.owner_prefix}{7:018d}#")
        # The scheduler reads a batch's creation to the microsecond back from it.
        assert owner_sort_created_us(owner_sort(1_764_700_000_123_456, protocol.batch_ids.new())) \
            == 1_764_700_000_123_456


def test_each_ending_announces_an_event_of_its_protocol():
    assert set(FINAL_BATCH) == {BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED,
                                BatchStatus.CANCELLED}
    for protocol in protocols.PROTOCOLS.values():
        assert {protocol.ending_event(s) for s in FINAL_BATCH} <= set(protocols.EVENT_TYPES)
    assert openai.PROTOCOL.ending_event(BatchStatus.EXPIRED) == "batch.expired"
    assert {anthropic.PROTOCOL.ending_event(s) for s in FINAL_BATCH} == {"message_batch.ended"}
    assert len(set(protocols.EVENT_TYPES)) == len(protocols.EVENT_TYPES)


def test_backend_options_come_from_the_batch_item():
    assert openai.PROTOCOL.backend_options({"id": "batch_1"}) == {}
    assert anthropic.PROTOCOL.backend_options({"anthropic_version": "2023-06-01"}) == {"version": "2023-06-01"}


@pytest.mark.parametrize("protocol", list(protocols.PROTOCOLS.values()), ids=list(protocols.PROTOCOLS))
def test_a_refusal_is_shown_in_the_shape_the_protocol_documents(protocol):
    error = ApiError(404, "No batch found.", code="batch_not_found", param="batch_id")
    body = protocol.error_body(error)
    assert protocol.error_model.model_validate(body).model_dump() == body


def test_result_lines_are_the_protocols_own():
    failed = {"id": "batch_req_1", "custom_id": "a", "status": "failed", "response": None,
              "error": {"code": "timeout", "message": "The backend did not answer."}}
    assert openai.PROTOCOL.export_line(failed) == {"id": "batch_req_1", "custom_id": "a", "response": None,
                                                   "error": failed["error"]}
    assert anthropic.PROTOCOL.export_line(failed) == {"custom_id": "a", "result": {"type": "errored", "error": {
        "type": "error", "error": {"type": "timeout_error", "message": "The backend did not answer."}}}}
    assert openai.PROTOCOL.result_file_lines["output"](failed) is None
    assert anthropic.PROTOCOL.result_file_lines == {}  # Message Batches have no file batches


def _shared_modules() -> list[tuple[str, Path]]:
    found = []
    for path in (ROOT / "batchinfer").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if not any(name == own or name.startswith(own + ".") for own in OWN_OR_BACKEND):
            found.append((name, path))
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _naming_a_protocol(tree: ast.AST) -> list[ast.Constant]:
    """The strings (docstrings aside) that name a registered protocol or are one of its batch ids."""
    names = list(protocols.PROTOCOLS)
    id_prefixes = [p.batch_ids.prefix for p in protocols.PROTOCOLS.values()]
    docstrings = _docstrings(tree)
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and (any(n in node.value.lower() for n in names)
                 or any(node.value.startswith(p) and _HEX.fullmatch(node.value, len(p)) for p in id_prefixes))]


def test_no_shared_module_names_a_protocol():
    """Shared code asks the registry (by a batch's `api` or its id): a string naming a protocol (`== "anthropic"`,
    an `anthropic_version` field) or one of its batch ids (`startswith("msgbatch_")`) is the protocol's own
    knowledge, and belongs in its package."""
    modules = _shared_modules()
    assert {"batchinfer.service.reading.results", "batchinfer.layout",
            "batchinfer.api.envelopes"} <= dict(modules).keys()
    offenders = [f"{name}:{node.lineno} {node.value[:60]!r}"
                 for name, path in modules for node in _naming_a_protocol(ast.parse(path.read_text()))]
    assert offenders == []


@pytest.mark.parametrize(("source", "found"), [
    ('def f(batch):\n    """Reads anthropic batches."""\n    return batch.get("api") == "anthropic"\n', ["anthropic"]),
    ('prefix = "MSGBATCH#" if batch_id.startswith("msgbatch_") else "BATCH#"\n', ["msgbatch_"]),
    ('version = batch.get("anthropic_version")\n', ["anthropic_version"]),
    ('index = "batch_id"\n', []),
])
def test_the_check_finds_a_protocol_named(source, found):
    assert [node.value for node in _naming_a_protocol(ast.parse(source))] == found
