"""What the end-to-end tests share: the local stack as `make run` starts it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
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


def _script_env(stack: dict, home: Path) -> dict[str, str]:
    """A user's environment for an SDK script: a new account's key, and nothing of this process's Python or SDK
    settings."""
    account = accounts.create_account(stack["svc"], tier="pro", batch_access=True)
    key = accounts.create_key(stack["svc"], account["id"])
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env.update(HOME=str(home), FREEINFERENCE_BASE_URL=stack["base"], FREEINFERENCE_API_KEY=key)
    return env


class SdkRuns:
    """One SDK script started at once under every SDK major's interpreter, each as its own user (a new account,
    its own HOME), so the interpreters run side by side instead of one after another; `result(major)` waits
    for that major's run and gives the JSON object it printed. An interpreter that is missing or stale fails
    only its own major's test, as `sdk_python` does."""

    def __init__(self, stack: dict, sdk_python: Callable[[str], str], script: Path, majors: tuple[str, ...],
                 folder: Path, timeout: float = 240) -> None:
        self._timeout = timeout
        self._started = time.monotonic()
        self._runs: dict[str, tuple[subprocess.Popen, Path, Path] | BaseException] = {}
        for major in majors:
            try:
                python = sdk_python(major)
            except BaseException as refused:  # pytest.fail's outcome: raised again by that major's test
                self._runs[major] = refused
                continue
            home = folder / major
            home.mkdir()
            stdout, stderr = home / "stdout.json", home / "stderr.txt"
            with stdout.open("w") as out, stderr.open("w") as err:
                proc = subprocess.Popen([python, str(script)], stdout=out, stderr=err, text=True,
                                        env=_script_env(stack, home))
            self._runs[major] = (proc, stdout, stderr)

    def result(self, major: str) -> dict:
        run = self._runs[major]
        if isinstance(run, BaseException):
            raise run
        proc, stdout, stderr = run
        try:
            proc.wait(timeout=max(0.0, self._started + self._timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"the {major} SDK script ran past {self._timeout} s: {stderr.read_text()}") from None
        assert proc.returncode == 0, stderr.read_text()
        return json.loads(stdout.read_text())

    def close(self) -> None:
        """Stop any run its test never waited for (a deselected major), before the stack stops."""
        for run in self._runs.values():
            if not isinstance(run, BaseException) and run[0].poll() is None:
                run[0].kill()
                run[0].wait()
