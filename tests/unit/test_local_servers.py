"""Waiting for a server the local stack, the benchmarks or the real-backend tests started in a process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from local.servers import free_port, wait_until_answering


def test_it_returns_once_the_server_answers():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", f"import time, http.server; time.sleep(0.5); "
                               f"http.server.HTTPServer(('127.0.0.1', {port}), "
                               f"http.server.SimpleHTTPRequestHandler).serve_forever()"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_answering(f"http://127.0.0.1:{port}/", server, "the file server", timeout=20)
    finally:
        server.kill()
        server.wait()


def test_it_gives_up_at_once_when_the_process_ends():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="the backend did not start"):
        wait_until_answering(f"http://127.0.0.1:{free_port()}/", gone, "the backend", timeout=20)
    assert time.monotonic() - started < 5


def test_it_gives_up_after_its_timeout_when_nothing_answers():
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(RuntimeError, match="no answer from"):
            wait_until_answering(f"http://127.0.0.1:{free_port()}/", silent, "a silent server", timeout=0.5)
    finally:
        silent.kill()
        silent.wait()
