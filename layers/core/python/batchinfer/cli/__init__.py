"""batchctl: the command line of batch inference.

  batchctl submit|estimate|status|list|wait|results|cancel|delete ...   your batches, through the HTTP API
  batchctl admin ...                                           accounts and API keys (the operator's)

Both need no flags next to a running local stack (`make run` writes .local/stack.json and .local/api-key).
Exit codes: 0 ok, 1 API error, 2 usage, 3 a batch waited for ended without completing, 130 interrupted.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import admin, user
from .common import LOCAL_STACK_FILE


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="batchctl", description=__doc__.splitlines()[0],
                                  epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    top.add_argument("--stack-file", type=Path, default=None,
                     help=f"local stack description (default: {LOCAL_STACK_FILE}; admin: unless TABLE_NAME is set)")
    top.add_argument("--debug", action="store_true", help="print the traceback of an error")
    groups = top.add_subparsers(dest="group", required=True, metavar="COMMAND")
    user.add_commands(groups)
    admin.add_commands(groups)
    return top


def main(argv: list[str] | None = None) -> int:
    """batchctl's entry point (the console script, `python -m batchinfer.cli`, ./batchctl)."""
    args = parser().parse_args(argv)  # bad arguments: argparse prints usage and one error line, exits 2
    if args.group == "admin":
        return admin.run_command(args)
    return user.run_command(args)
