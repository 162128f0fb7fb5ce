"""Start the pieces of the local stack in threads: the moto server, the simulated backend, the API."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_answering(url: str, process: subprocess.Popen, what: str, timeout: float = 30.0,
                         request_timeout: float = 1.0) -> None:
    """Wait until a GET of `url` answers with a success: the server `process` started is up. Raises
    RuntimeError naming `what` when the process ends first or nothing answers within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=request_timeout):  # an error status raises HTTPError
                return
        except (OSError, http.client.HTTPException):  # not listening yet, or cut off while it starts
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start: no answer from {url}")
        time.sleep(0.1)


class LoggedServer:
    """A server in a process of its own, its output appended to `log`: started (and waited for until `health`
    answers), killed (as in a crash: connections in flight are cut) and stopped; started again on the same port."""

    def __init__(self, log: Path, port: int | None = None) -> None:
        self.log = log
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self, command: list[str], health: str, what: str, timeout: float, cwd: Path,
               env: dict[str, str] | None = None) -> None:
        with self.log.open("a") as log:
            log.write(f"\n--- {' '.join(command)}\n")
            log.flush()
            self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_until_answering(self.url + health, self.process, f"{what} (its log: {self.log})", timeout=timeout,
                             request_timeout=2)

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


class UvicornThread:
    """An ASGI app served by uvicorn on 127.0.0.1 in a background thread."""

    def __init__(self, app, port: int, log_level: str = "warning") -> None:
        self.port = port
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level=log_level,
                                                    lifespan="off", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> UvicornThread:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class MotoServer:
    """The moto server in its own process: DynamoDB, S3 and SQS on 127.0.0.1, on a core of its own."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoServer:
        root = Path(__file__).resolve().parent.parent
        self.process = subprocess.Popen(
            [sys.executable, "-m", "local.moto_server", "-H", "127.0.0.1", "-p", str(self.port)],
            cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        wait_until_answering(self.url + "/moto-api/", self.process, f"moto server on port {self.port}")
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
