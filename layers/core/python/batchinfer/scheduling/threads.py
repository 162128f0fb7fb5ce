"""The pump's own threads: claims, polls, starts and writes each on a pool of their own, so none waits
behind another (nor behind the rest of the process) for a thread of the shared pool."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from concurrent.futures import ThreadPoolExecutor


async def on_pool(pool: ThreadPoolExecutor, fn, *args):  # noqa: ANN001, ANN201 - a thin wrapper of run_in_executor
    """`fn(*args)` on `pool`, in the caller's context, as asyncio.to_thread runs it (loggers' and tracers'
    context go along)."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(context.run, fn, *args))
