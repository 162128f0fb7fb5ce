"""batchctl admin reads the local stack's settings from a stack file (`.local/stack.json`, or `--stack-file`):
a key that is neither a setting nor the API's URL is refused by name, never ignored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchinfer.cli.admin import _settings
from batchinfer.cli.common import CliError


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "stack.json"
    path.write_text(json.dumps(data))
    return path


def test_a_stack_file_as_make_run_writes_it_is_read(tmp_path):
    data = {"aws_endpoint_url": "http://127.0.0.1:5000", "table_name": "t", "bucket_name": "b",
            "model_queues": {"m": "http://127.0.0.1:5000/q"}, "stage": "local", "api_url": "http://127.0.0.1:8000/v1"}
    settings = _settings(write(tmp_path, data))
    assert (settings.table_name, settings.bucket_name, settings.stage) == ("t", "b", "local")


def test_an_unknown_key_is_refused_by_name(tmp_path):
    with pytest.raises(CliError, match="unknown key 'tabel_name'"):
        _settings(write(tmp_path, {"tabel_name": "t", "bucket_name": "b"}))
    with pytest.raises(CliError, match="unknown keys 'bukket', 'tabel_name'"):
        _settings(write(tmp_path, {"tabel_name": "t", "bukket": "b"}))
