"""Accounts, API keys, daily quota: who may do what."""

from __future__ import annotations

from dataclasses import dataclass

from ..domain import AccountStatus, Tier, new_account_id, new_api_key, new_token, utc_day
from ..layout import hash_api_key
from ..records import Account, ApiKey, Usage
from ..runtime import Services
from ..storage.dynamo import ConditionFailed
from .account_waiters import wake_account
from .running.batch_usage import shown_usd


@dataclass(frozen=True)
class Principal:
    """The caller: a valid key of an account."""

    account: dict
    key_hash: str

    @property
    def account_id(self) -> str:
        return self.account["id"]


class AuthError(Exception):
    pass


def create_account(svc: Services, tier: str = "free", batch_access: bool | None = None,
                   daily_quota_usd: float = 10.0, allowed_models: list[str] | None = None) -> dict:
    Tier(tier)
    account = {
        "id": new_account_id(), "tier": tier, "status": AccountStatus.ACTIVE.value,
        "batch_access": tier in svc.settings.batch_access_tiers if batch_access is None else batch_access,
        "daily_quota_usd": daily_quota_usd, "allowed_models": allowed_models, "created_at": svc.now(),
        "unfinished_batches": 0, "unfinished_requests": 0, "in_flight": 0,
    }
    Account.create(svc.table, account)
    return account


def get_account(svc: Services, account_id: str) -> dict | None:
    return Account.get(svc.table, account_id)


def update_account(svc: Services, account_id: str, **fields: object) -> dict:
    allowed = {"tier", "status", "batch_access", "daily_quota_usd", "allowed_models"}
    unknown = set(fields) - allowed
    if unknown:
        raise ValueError(f"unknown account fields: {sorted(unknown)}")
    if "tier" in fields:
        Tier(fields["tier"])
    if "status" in fields:
        AccountStatus(fields["status"])
    try:
        account = Account.set_fields(svc.table, account_id, fields)
    except ConditionFailed:
        raise KeyError(f"account {account_id} not found") from None
    if "daily_quota_usd" in fields or fields.get("batch_access") is True:
        wake_account(svc, account_id)  # what waited on the quota or the access goes on now
    return account


def create_key(svc: Services, account_id: str, expires_at: int | None = None) -> str:
    if get_account(svc, account_id) is None:
        raise KeyError(f"account {account_id} not found")
    raw = new_api_key()
    ApiKey.create(svc.table, hash_api_key(raw), account_id, key_id="key_" + new_token(), prefix=raw[:8],
                  now=svc.now(), expires_at=expires_at)
    return raw


def revoke_key(svc: Services, raw_or_hash: str) -> None:
    key_hash = hash_api_key(raw_or_hash) if raw_or_hash.startswith("hyi-") else raw_or_hash
    try:
        ApiKey.revoke(svc.table, key_hash, svc.now())
    except ConditionFailed:
        raise KeyError("API key not found") from None


def key_problem(svc: Services, key_item: dict | None, account: dict | None) -> str | None:
    """Why a key may not be used any more, or None when it is valid."""
    if key_item is None:
        return "The API key is invalid."
    if key_item.get("revoked_at"):
        return "The API key has been revoked."
    if key_item.get("expires_at") and key_item["expires_at"] <= svc.now():
        return "The API key has expired."
    if account is None or account.get("status") != AccountStatus.ACTIVE.value:
        return "The account of this API key is not active."
    return None


def authenticate(svc: Services, raw: str | None) -> Principal:
    if not raw:
        raise AuthError("Missing API key. Send it as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'.")
    key_hash = hash_api_key(raw)
    key_item = ApiKey.get(svc.table, key_hash)  # strongly consistent: a key refused from the moment it is revoked
    account = get_account(svc, key_item["account_id"]) if key_item else None
    problem = key_problem(svc, key_item, account)
    if problem:
        raise AuthError(problem)
    return Principal(account=account, key_hash=key_hash)


def spent_today(svc: Services, account_id: str) -> float:
    item = Usage.get(svc.table, account_id, utc_day(svc.now()))
    return float(item.get("cost_usd", 0)) if item else 0.0


USAGE_DAYS = 3  # the day's usage items are kept this many days (records.Usage)


def daily_usage(svc: Services, account_id: str) -> list[dict]:
    """The account's spending on each UTC day still kept, today first: `cost_usd` (batch and interactive),
    `cost_unknown_attempts` (attempts whose outcome was lost after they were sent: not in cost_usd) and
    `usage_estimated_attempts` (streams that ended without usage, charged an estimate: in cost_usd)."""
    now = svc.now()
    days = []
    for back in range(USAGE_DAYS):
        day = utc_day(now - back * 86400)
        item = Usage.get(svc.table, account_id, day) or {}
        days.append({"day": day, "cost_usd": shown_usd(item.get("cost_usd", 0)),
                     "cost_unknown_attempts": int(item.get("cost_unknown_attempts", 0)),
                     "usage_estimated_attempts": int(item.get("usage_estimated_attempts", 0))})
    return days


def quota_used_up(svc: Services, account: dict) -> bool:
    return spent_today(svc, account["id"]) >= float(account.get("daily_quota_usd", 0))


def may_use_model(account: dict, model_id: str) -> bool:
    allowed = account.get("allowed_models")
    return allowed is None or model_id in allowed
