"""What batchctl's admin and user commands share: where the local stack is described, the exit codes, and
how a problem or a note becomes one line."""

from __future__ import annotations

import sys
from pathlib import Path

LOCAL_STACK_FILE = Path(".local/stack.json")  # written by `make run` (local/run.py), relative to where it ran
# What a stack file holds beyond the settings batchctl admin reads from it: the API's URL, for the user commands.
STACK_FILE_EXTRA_KEYS = frozenset({"api_url"})

# The exit codes a script can rely on (README, "batchctl").
EXIT_OK = 0
EXIT_API = 1  # the API answered an error or could not be reached (admin: any failure)
EXIT_USAGE = 2  # bad arguments (argparse's own code), an unreadable input file, no API URL or key
EXIT_NOT_COMPLETED = 3  # a batch waited for ended without completing: failed, expired or cancelled
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it)


class CliError(Exception):
    """A problem to report as it is, in one line."""


class UsageError(CliError):
    """A problem with what batchctl was given (arguments, input file, configuration): exit 2."""


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def note(text: str) -> None:
    """Something a user command tells on stderr beside its answer (stdout carries only the answer)."""
    print(f"batchctl: note: {text}", file=sys.stderr, flush=True)
