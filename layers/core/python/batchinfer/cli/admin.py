"""`batchctl admin ...`: accounts and API keys, straight in DynamoDB (through `runtime.build_services`).

It talks to the running local stack with no flags (it reads .local/stack.json, written by `make run`),
or to a deployed stack when TABLE_NAME (and AWS credentials) are set in the environment.
Every error is one line on stderr starting "batchctl: " and a non-zero exit (--debug adds the traceback).

The service's modules (and boto3, pydantic) are imported when an admin command runs, not when batchctl
starts: the user commands need none of them, and they cost most of a second per call.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from .common import EXIT_API, EXIT_INTERRUPTED, EXIT_OK, LOCAL_STACK_FILE, STACK_FILE_EXTRA_KEYS, CliError, one_line

if TYPE_CHECKING:
    from ..settings import Settings


def _settings(stack_file: Path | None) -> Settings:
    """The local stack's settings (from the stack file), or a deployed stack's (TABLE_NAME and the rest from
    the environment) when TABLE_NAME is set and no --stack-file is given."""
    from ..settings import Settings

    settings = Settings()
    if stack_file is None and "table_name" in settings.model_fields_set:
        return settings
    path = stack_file or LOCAL_STACK_FILE
    if not path.exists():
        if stack_file is not None:
            raise CliError(f"stack file {path} not found")
        raise CliError(f"no local stack here ({path} not found) and TABLE_NAME is not set: start the local "
                       "stack with `make run` in this folder (or pass --stack-file), or set TABLE_NAME for a "
                       "deployed stack")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CliError(f"cannot read stack file {path}: {error}") from error
    if not isinstance(data, dict):
        raise CliError(f"stack file {path} is not a JSON object")
    unknown = sorted(set(data) - set(Settings.model_fields) - STACK_FILE_EXTRA_KEYS)
    if unknown:  # a misspelt setting would otherwise be ignored, and its default used without a word
        raise CliError(f"stack file {path}: unknown key{'s' if len(unknown) > 1 else ''} "
                       f"{', '.join(repr(k) for k in unknown)}")
    return Settings(**data)


def _problem(error: BaseException, settings: Settings | None) -> str:
    from pydantic import ValidationError

    from ..storage.aws import AWS_ERRORS, describe_aws_error

    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, KeyError):  # from accounts: an account or key that is not there
        return error.args[0] if error.args else str(error)
    if isinstance(error, ValidationError):  # a setting in the environment or the stack file
        return "invalid settings: " + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
    if isinstance(error, CliError | ValueError):  # ValueError: a value accounts refuse
        return str(error)
    if isinstance(error, AWS_ERRORS):
        return describe_aws_error(error, settings)
    return f"unexpected error: {type(error).__name__}: {error}"  # a bug: still one line; --debug shows where


def _bool(value: str) -> bool:
    if value.lower() in ("true", "yes", "1", "on"):
        return True
    if value.lower() in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {value!r}")


def add_commands(groups: argparse._SubParsersAction) -> None:
    """`batchctl admin <command>` and its options."""
    admin = groups.add_parser("admin", help="accounts and API keys (straight in DynamoDB)",
                              description=__doc__.splitlines()[0]).add_subparsers(dest="command", required=True)

    p = admin.add_parser("create-account", help="create an account; prints its id")
    p.add_argument("--tier", choices=["free", "pro", "internal"], default="free")
    p.add_argument("--batch-access", type=_bool, default=None,
                   help="true/false (default: true for tiers in BATCH_ACCESS_TIERS)")
    p.add_argument("--daily-quota-usd", type=float, default=10.0)

    p = admin.add_parser("create-key", help="create an API key for an account; prints the key")
    p.add_argument("--account", required=True)
    p.add_argument("--expires-in-days", type=float, default=None)

    p = admin.add_parser("revoke-key", help="revoke an API key (the key itself or its SHA-256 hash)")
    p.add_argument("key")

    for name, text in (("suspend", "suspend an account"), ("activate", "make an account active again"),
                       ("delete-account", "mark an account deleted"), ("show", "print an account as JSON")):
        admin.add_parser(name, help=text).add_argument("--account", required=True)

    p = admin.add_parser("usage", help="an account's spending on each day kept (today first), as JSON")
    p.add_argument("--account", required=True)

    p = admin.add_parser("set", help="set an account's tier, batch access or daily quota")
    p.add_argument("--account", required=True)
    p.add_argument("--tier", choices=["free", "pro", "internal"])
    p.add_argument("--batch-access", type=_bool)
    p.add_argument("--daily-quota-usd", type=float)


def run(args: argparse.Namespace, svc) -> None:
    from ..service import accounts

    if args.command == "create-account":
        print(accounts.create_account(svc, tier=args.tier, batch_access=args.batch_access,
                                      daily_quota_usd=args.daily_quota_usd)["id"])
    elif args.command == "create-key":
        expires = svc.now() + int(args.expires_in_days * 86400) if args.expires_in_days else None
        print(accounts.create_key(svc, args.account, expires_at=expires))
    elif args.command == "revoke-key":
        accounts.revoke_key(svc, args.key)
    elif args.command in ("suspend", "activate", "delete-account"):
        status = {"suspend": "suspended", "activate": "active", "delete-account": "deleted"}[args.command]
        accounts.update_account(svc, args.account, status=status)
    elif args.command == "set":
        fields = {k: v for k, v in (("tier", args.tier), ("batch_access", args.batch_access),
                                    ("daily_quota_usd", args.daily_quota_usd)) if v is not None}
        if not fields:
            raise CliError("nothing to set: give --tier, --batch-access or --daily-quota-usd")
        accounts.update_account(svc, args.account, **fields)
    elif args.command == "usage":
        account = accounts.get_account(svc, args.account)
        if account is None:
            raise CliError(f"account {args.account} not found")
        print(json.dumps({"account": account["id"], "daily_quota_usd": float(account.get("daily_quota_usd", 0)),
                          "days": accounts.daily_usage(svc, account["id"])}, indent=2))
    elif args.command == "show":
        account = accounts.get_account(svc, args.account)
        if account is None:
            raise CliError(f"account {args.account} not found")
        print(json.dumps({k: v for k, v in account.items() if k not in ("pk", "sk")}, indent=2, sort_keys=True))


def run_command(args: argparse.Namespace) -> int:
    """Run one admin command; every failure is one line on stderr and exit 1 (130 for Ctrl-C)."""
    settings = None
    try:
        from ..runtime import build_services

        settings = _settings(args.stack_file)
        run(args, build_services(settings))
        return EXIT_OK
    except (Exception, KeyboardInterrupt) as error:
        if args.debug:
            traceback.print_exception(error)
        print(f"batchctl: {one_line(_problem(error, settings))}", file=sys.stderr)
        return EXIT_INTERRUPTED if isinstance(error, KeyboardInterrupt) else EXIT_API
