"""batchctl's user commands without a stack: error envelopes, reading a submission, the route a submission
takes (inline, file, or inline again when file batches are off), and what counts as a completed batch. The
commands against a running stack are in tests/e2e/test_batchctl.py."""

from __future__ import annotations

import argparse
import json

import pytest

from batchinfer.cli import parser
from batchinfer.cli.api_client import ApiFailure, Reply, api_root, error_of
from batchinfer.cli.common import UsageError
from batchinfer.cli.progress import Speed, progress_line
from batchinfer.cli.submission import read_requests, submit_batch
from batchinfer.cli.views import BatchView


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"error": {"message": "No batch found.", "type": "invalid_request_error", "code": "batch_not_found"}}',
     ("404 No batch found.", "batch_not_found")),
    (b'{"type": "error", "error": {"type": "not_found_error", "message": "No Message Batch found."}}',
     ("404 No Message Batch found.", "not_found_error")),
    (b'{"message": "Request Entity Too Large"}', ("404 Request Entity Too Large", None)),  # API Gateway's own
    (b"<html>\n  oops\n</html>", ("404 <html> oops </html>", None)),
    (b"", ("404 Not Found", None)),
])
def test_errors_of_either_envelope_are_one_line(body, expected):
    failure = error_of(404, body, "Not Found")
    assert (str(failure), failure.code) == expected


@pytest.mark.parametrize("url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"])
def test_the_base_url_is_taken_with_or_without_v1(url):
    assert api_root(url) == "http://h:8000"


def test_prompts_and_batch_lines(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_bytes(b'\xef\xbb\xbfplain\r\n\n"json \\"quoted\\""\n42\n')
    got = read_requests(str(prompts), "m", None)
    assert [(r["custom_id"], r["body"]["messages"][0]["content"]) for r in got] == [
        ("request-1", "plain"), ("request-2", 'json "quoted"'), ("request-3", "42")]
    embeddings = read_requests(str(prompts), "m", "/v1/embeddings")
    assert embeddings[0] == {"custom_id": "request-1", "method": "POST", "url": "/v1/embeddings",
                             "body": {"model": "m", "input": "plain"}}
    with pytest.raises(UsageError, match="give --model"):
        read_requests(str(prompts), None, None)

    lines = tmp_path / "b.jsonl"
    lines.write_text(json.dumps({"custom_id": "x", "body": {"messages": []}}) + "\n"
                     + json.dumps({"custom_id": "y", "method": "POST", "url": "/v1/chat/completions",
                                   "body": {"model": "own", "messages": []}}) + "\n")
    got = read_requests(str(lines), "m", None)
    assert got[0] == {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"messages": [], "model": "m"}}  # --model fills in a missing model only
    assert got[1]["body"]["model"] == "own"


class FakeApi:
    """Records calls; file uploads can be switched off as FILE_BATCHES_ENABLED=false answers them."""

    def __init__(self, files_enabled: bool = True) -> None:
        self.files_enabled = files_enabled
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str, path: str, **kw) -> Reply:
        self.calls.append((method, path))
        if path in ("/v1/files", "/v1/uploads") and method == "POST" and not self.files_enabled:
            raise ApiFailure(400, "File batches are not enabled.", "file_batches_disabled")
        if path == "/v1/files":
            return Reply({"id": "file-1"}, {})
        if path == "/v1/uploads":
            return Reply({"id": "upload_1"}, {})
        if path.endswith("/parts"):
            return Reply({"id": f"part_{len(self.calls)}"}, {})
        if path.endswith("/complete"):
            return Reply({"file": {"id": "file-2"}}, {})
        return Reply({"id": "batch_1", "kw": kw}, {})

    def post(self, path: str, body=None, headers=None):
        return self.request("POST", path, json=body, headers=headers).data

    def delete(self, path: str):
        return self.request("DELETE", path).data


def submit_args(tmp_path, lines: list[str], **extra) -> argparse.Namespace:
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n")
    return parser().parse_args(["submit", str(source), "--model", "m",
                                *[f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]])


def test_a_small_submission_goes_inline(tmp_path):
    api = FakeApi()
    submit_batch(api, submit_args(tmp_path, ["a", "b"], metadata="k=v"))
    assert api.calls == [("POST", "/v1/batches")]


def test_max_cost_is_sent_as_the_batchs_spending_cap_inline_and_from_a_file(tmp_path):
    api = FakeApi()
    batch = submit_batch(api, submit_args(tmp_path, ["a", "b"], max_cost="2.50"))
    assert json.loads(batch["kw"]["content"])["max_cost_usd"] == 2.5
    api = FakeApi()
    batch = submit_batch(api, submit_args(tmp_path, [f"prompt {i}" for i in range(20)], inline_max_bytes=100,
                                          max_cost="0.01"))
    assert batch["kw"]["json"]["max_cost_usd"] == 0.01
    assert "max_cost_usd" not in json.loads(submit_batch(FakeApi(), submit_args(tmp_path, ["a"]))["kw"]["content"])
    for wrong in ("0", "-1", "lots"):
        with pytest.raises(SystemExit):
            submit_args(tmp_path, ["a"], max_cost=wrong)


def test_execution_and_priority_are_sent_inline_and_from_a_file_and_refused_unless_known(tmp_path):
    batch = submit_batch(FakeApi(), submit_args(tmp_path, ["a"], execution="provider_batch", priority="low"))
    assert {k: v for k, v in json.loads(batch["kw"]["content"]).items() if k != "requests"} == {
        "execution": "provider_batch", "priority": "low"}
    batch = submit_batch(FakeApi(), submit_args(tmp_path, [f"prompt {i}" for i in range(20)], inline_max_bytes=100,
                                                execution="auto"))
    assert batch["kw"]["json"]["execution"] == "auto"
    assert "execution" not in json.loads(submit_batch(FakeApi(), submit_args(tmp_path, ["a"]))["kw"]["content"])
    with pytest.raises(SystemExit):
        submit_args(tmp_path, ["a"], execution="cheap")


def test_a_large_one_goes_as_a_file_in_one_request_or_in_parts(tmp_path):
    api = FakeApi()
    submit_batch(api, submit_args(tmp_path, [f"prompt {i}" for i in range(20)], inline_max_bytes=100))
    assert api.calls == [("POST", "/v1/files"), ("POST", "/v1/batches"), ("DELETE", "/v1/files/file-1")]
    api = FakeApi()
    submit_batch(api, submit_args(tmp_path, [f"prompt {i}" for i in range(20)], inline_max_bytes=100,
                                  upload_part_bytes=1000))
    parts = [c for c in api.calls if c[1].endswith("/parts")]
    assert api.calls[0] == ("POST", "/v1/uploads") and len(parts) >= 2
    assert api.calls[-3:] == [("POST", "/v1/uploads/upload_1/complete"), ("POST", "/v1/batches"),
                              ("DELETE", "/v1/files/file-2")]


def test_with_file_batches_off_a_large_one_goes_inline(tmp_path, capsys):
    api = FakeApi(files_enabled=False)
    submit_batch(api, submit_args(tmp_path, [f"prompt {i}" for i in range(20)], inline_max_bytes=100))
    assert api.calls == [("POST", "/v1/files"), ("POST", "/v1/batches")]
    assert "file batches are not enabled on this service" in capsys.readouterr().err


def test_several_models_cannot_be_a_file_batch_so_they_go_inline(tmp_path, capsys):
    api = FakeApi()
    lines = [json.dumps({"custom_id": f"c{i}", "body": {"model": f"m{i % 2}", "messages": []}}) for i in range(20)]
    submit_batch(api, submit_args(tmp_path, lines, inline_max_bytes=100))
    assert api.calls == [("POST", "/v1/batches")]
    assert "one model" in capsys.readouterr().err


def message_batch(**fields) -> dict:
    counts = {"processing": 0, "succeeded": 1, "errored": 1, "canceled": 0, "expired": 0}
    return {"id": "msgbatch_1", "type": "message_batch", "processing_status": "ended", "created_at":
            "2025-01-01T00:00:00Z", "cancel_initiated_at": None, **fields,
            "request_counts": {**counts, **fields.get("request_counts", {})}}


def batch(status: str) -> dict:
    return {"id": "batch_1", "status": status, "request_counts": {"total": 2, "completed": 1, "failed": 1}}


@pytest.mark.parametrize(("raw", "ended", "completed"), [
    (batch("completed"), True, True),  # failed requests in a completed batch: completed
    (batch("cancelled"), True, False),
    (batch("expired"), True, False),
    (batch("finalizing"), False, False),
    (message_batch(), True, True),  # errored requests alone: completed (as failed requests in a batch)
    (message_batch(cancel_initiated_at="2025-01-01T00:00:05Z"), True, False),
    (message_batch(request_counts={"expired": 1}), True, False),
    (message_batch(processing_status="in_progress"), False, False),
])
def test_what_counts_as_completed(raw, ended, completed):
    view = BatchView.of(raw)
    assert (view.ended, view.completed_ok) == (ended, completed)


def test_progress_line_and_speed():
    speed = Speed(window=30)
    assert speed.observe(100.0, 0, 1000) == (None, None)
    rate, eta = speed.observe(110.0, 400, 1000)
    assert rate == 40.0 and eta == 15.0
    view = BatchView.of({"id": "batch_x", "status": "in_progress",
                         "request_counts": {"total": 1000, "completed": 397, "failed": 3}})
    assert progress_line(view, rate, eta) == "batch_x: 397/1000 completed, 3 failed, 40.0 req/s, ETA 15s [in_progress]"
    assert progress_line(view, None, 3725) == "batch_x: 397/1000 completed, 3 failed, -- req/s, ETA 1h02m [in_progress]"
