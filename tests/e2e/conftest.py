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
def local_stack(tmp_path_factory, pollers: int = 2, **settings) -> Iterator[dict]:
    """The local stack (moto server, simulated backend, the pipeline's loops, the API under uvicorn) with
    these settings, its state in a fresh `.local`: {base, key, svc, dir}; `pollers`: concurrent worker
    invocations per model queue."""
    state = tmp_path_factory.mktemp("stack") / ".local"
    config = Settings(table_name="e2e", bucket_name="e2e", stage="e2e", **settings)
    svc, key, stop = start(config, free_port(), free_port(), pollers=pollers, state_dir=state)
    api = UvicornThread(create_app(), free_port()).start()
    try:
        yield {"base": f"{api.url}/v1", "key": key, "svc": svc, "dir": state.parent}
    finally:
        api.stop()
        stop()


def script_env(stack: dict, home: Path, extra: dict[str, str] | None = None, **account) -> dict[str, str]:
    """A user's environment for an SDK script: the key of a new account (`account`: create_account's fields, by
    default a pro account with batch access), its own HOME, `extra`, and nothing of this process's Python or
    SDK settings."""
    created = accounts.create_account(stack["svc"], **{"tier": "pro", "batch_access": True, **account})
    key = accounts.create_key(stack["svc"], created["id"])
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env.update(HOME=str(home), FREEINFERENCE_BASE_URL=stack["base"], FREEINFERENCE_API_KEY=key, **(extra or {}))
    return env


class SdkRun:
    """One program started now in an SDK's interpreter (`argv` after the interpreter: a script's path, or `-c`
    and its source), its output kept in `home`; `output()` waits for it to end and gives what it printed,
    `result()` the JSON object it printed. Programs started together run side by side."""

    def __init__(self, python: str, argv: list[str], env: dict[str, str], home: Path, timeout: float = 240) -> None:
        self._timeout, self._started = timeout, time.monotonic()
        home.mkdir(parents=True, exist_ok=True)
        self._stdout, self._stderr = home / "stdout.txt", home / "stderr.txt"
        with self._stdout.open("w") as out, self._stderr.open("w") as err:
            self._proc = subprocess.Popen([python, *argv], stdout=out, stderr=err, text=True, env=env, cwd=home)

    def output(self) -> str:
        try:
            self._proc.wait(timeout=max(0.0, self._started + self._timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(f"{self._proc.args[1:]} ran past {self._timeout} s: {self._stderr.read_text()}") \
                from None
        assert self._proc.returncode == 0, self._stderr.read_text()
        return self._stdout.read_text()

    def result(self) -> dict:
        return json.loads(self.output())

    def close(self) -> None:
        """Stop it if it still runs (its test never waited for it), before the stack stops."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


class SdkRuns:
    """One SDK program (a script's path, or a program's source) started at once under every SDK major's
    interpreter, each as its own user (a new account, `account` its fields, its own HOME and `extra`
    environment, or `extra(major)`'s), so the interpreters run side by side instead of one after another;
    `result(major)` waits for that major's run and gives the JSON object it printed, `output(major)` all it
    printed. An interpreter that is missing or stale fails only its own major's test, as `sdk_python` does."""

    def __init__(self, stack: dict, sdk_python: Callable[[str], str], program: Path | str, majors: tuple[str, ...],
                 folder: Path, timeout: float = 240, *,
                 extra: dict[str, str] | Callable[[str], dict[str, str]] | None = None, **account) -> None:
        argv = [str(program)] if isinstance(program, Path) else ["-c", program]
        self._runs: dict[str, SdkRun | BaseException] = {}
        for major in majors:
            try:
                python = sdk_python(major)
            except BaseException as refused:  # pytest.fail's outcome: raised again by that major's test
                self._runs[major] = refused
                continue
            home = folder / major
            env = script_env(stack, home, extra(major) if callable(extra) else extra, **account)
            self._runs[major] = SdkRun(python, argv, env, home, timeout)

    def _run(self, major: str) -> SdkRun:
        run = self._runs[major]
        if isinstance(run, BaseException):
            raise run
        return run

    def output(self, major: str) -> str:
        return self._run(major).output()

    def result(self, major: str) -> dict:
        return self._run(major).result()

    def close(self) -> None:
        """Stop any run its test never waited for (a deselected major), before the stack stops."""
        for run in self._runs.values():
            if isinstance(run, SdkRun):
                run.close()
