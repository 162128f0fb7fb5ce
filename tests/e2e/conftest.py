"""What the end-to-end tests share: the local stack as `make run` starts it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from batchinfer.api.app import create_app
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
