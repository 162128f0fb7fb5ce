"""batchctl: the operator's command line. `batchctl admin ...` manages accounts and API keys.

It talks to the running local stack with no flags (it reads .local/stack.json, written by `make run`),
or to a deployed stack when TABLE_NAME (and AWS credentials) are set in the environment.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .runtime import build_services
from .service import accounts
from .settings import Settings

LOCAL_STACK_FILE = Path(".local/stack.json")


def _services(stack_file: Path):
    settings = Settings()
    if "table_name" not in settings.model_fields_set and stack_file.exists():
        settings = Settings(**json.loads(stack_file.read_text()))
    return build_services(settings)


def _bool(value: str) -> bool:
    if value.lower() in ("true", "yes", "1", "on"):
        return True
    if value.lower() in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {value!r}")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="batchctl", description=__doc__.splitlines()[0])
    top.add_argument("--stack-file", type=Path, default=LOCAL_STACK_FILE, help="local stack description")
    groups = top.add_subparsers(dest="group", required=True)
    admin = groups.add_parser("admin", help="accounts and API keys").add_subparsers(dest="command", required=True)

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

    p = admin.add_parser("set", help="set an account's tier, batch access or daily quota")
    p.add_argument("--account", required=True)
    p.add_argument("--tier", choices=["free", "pro", "internal"])
    p.add_argument("--batch-access", type=_bool)
    p.add_argument("--daily-quota-usd", type=float)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    svc = _services(args.stack_file)
    try:
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
                raise ValueError("nothing to set: give --tier, --batch-access or --daily-quota-usd")
            accounts.update_account(svc, args.account, **fields)
        elif args.command == "show":
            account = accounts.get_account(svc, args.account)
            if account is None:
                raise KeyError(f"account {args.account} not found")
            print(json.dumps({k: v for k, v in account.items() if k not in ("pk", "sk")}, indent=2, sort_keys=True))
    except (KeyError, ValueError) as error:
        print(f"batchctl: {error.args[0] if error.args else error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
