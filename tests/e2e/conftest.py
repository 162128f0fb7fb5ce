"""What the end-to-end tests share: the local stack as `make run` starts it."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from batchinfer.api.app import create_app
from batchinfer.service import accounts
from batchinfer.settings import Settings
from local.run import start
from local.servers import UvicornThread, free_port


@contextmanager
def local_stack(tmp_path_factory, **settings) -> Iterator[dict]:
    """The local stack (moto server, simulated backend, the pipeline's loops, the API under uvicorn) with
    these settings, its state in a fresh `.local`: {base, key, svc, dir}."""
    state = tmp_path_factory.mktemp("stack") / ".local"
    config = Settings(table_name="e2e", bucket_name="e2e", stage="e2e", **settings)
    svc, key, stop = start(config, free_port(), free_port(), pollers=2, state_dir=state)
    api = UvicornThread(create_app(), free_port()).start()
    try:
        yield {"base": f"{api.url}/v1", "key": key, "svc": svc, "dir": state.parent}
    finally:
        api.stop()
        stop()


def run_sdk_script(stack: dict, python: str, script: Path, home: Path, timeout: float = 240) -> dict:
    """Run an SDK script as a user would, with a new account's key and nothing of this process's Python or SDK
    settings: the JSON object it prints."""
    account = accounts.create_account(stack["svc"], tier="pro", batch_access=True)
    key = accounts.create_key(stack["svc"], account["id"])
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env.update(HOME=str(home), FREEINFERENCE_BASE_URL=stack["base"], FREEINFERENCE_API_KEY=key)
    run = subprocess.run([python, str(script)], capture_output=True, text=True, timeout=timeout, env=env)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)
