"""The domain: identifiers, the one state machine of batches and requests, error codes, retry policy."""

from __future__ import annotations

import datetime as dt
import random
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

from .jsontext import text_of


class BatchStatus(StrEnum):
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


FINAL_BATCH = frozenset({BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED})
UNFINISHED_BATCH = frozenset(
    {BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING}
)

# Every batch transition the service makes; anything else is a bug.
BATCH_TRANSITIONS: dict[BatchStatus, frozenset[BatchStatus]] = {
    BatchStatus.VALIDATING: frozenset(
        {BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING, BatchStatus.CANCELLED, BatchStatus.FAILED,
         BatchStatus.EXPIRED}
    ),
    BatchStatus.IN_PROGRESS: frozenset(
        {BatchStatus.FINALIZING, BatchStatus.COMPLETED, BatchStatus.CANCELLING, BatchStatus.CANCELLED,
         BatchStatus.FAILED, BatchStatus.EXPIRED}
    ),
    BatchStatus.FINALIZING: frozenset(FINAL_BATCH),
    BatchStatus.CANCELLING: frozenset({BatchStatus.CANCELLED}),
    # Retry in place (service.steering.retry): an ended batch runs again the requests of it that did not succeed, and
    # ends again. Only a retry takes an ended batch back; nothing else leaves an ended status.
    **{final: frozenset({BatchStatus.IN_PROGRESS}) for final in FINAL_BATCH},
}


class Stop(StrEnum):
    """Why a batch stopped starting requests before all of them ran."""

    CANCEL = "cancel"
    EXPIRE = "expire"
    FAIL = "fail"


# Batches that may still be stopped (cancelled, expired, failed): the rest are ending or ended.
STOPPABLE_BATCH = frozenset({BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS})
# Batches that may be paused or resumed. Pausing is not a status (a paused batch stays validating or in
# progress): it is a flag (`paused_at`) that stops requests from starting, so only a batch that may still
# start requests takes it; no transition is involved.
PAUSABLE_BATCH = STOPPABLE_BATCH


class IllegalTransition(ValueError):
    """A status change the state machine does not allow: a bug, never a user's mistake."""


def can_transition(old: BatchStatus, new: BatchStatus) -> bool:
    return new in BATCH_TRANSITIONS.get(old, frozenset())


def batch_transition(old: str, new: BatchStatus) -> BatchStatus:
    """`new` if a batch in `old` may move to it (staying put counts), else IllegalTransition."""
    if BatchStatus(old) is not new and not can_transition(BatchStatus(old), new):
        raise IllegalTransition(f"batch {old} -> {new}")
    return new


def batches_that_may_become(new: BatchStatus) -> frozenset[BatchStatus]:
    """The statuses a batch may move to `new` from, for the condition that fences the write."""
    return frozenset(old for old, targets in BATCH_TRANSITIONS.items() if new in targets)


def final_status(stop: Stop | None) -> BatchStatus:
    """The final status of a batch with no request left open."""
    return {
        None: BatchStatus.COMPLETED,
        Stop.CANCEL: BatchStatus.CANCELLED,
        Stop.EXPIRE: BatchStatus.EXPIRED,
        Stop.FAIL: BatchStatus.FAILED,
    }[stop]


class RequestState(StrEnum):
    """State of one request. Requests not yet dispatched have no stored state at all; first attempts hold
    DISPATCHED and RUNNING as members of a group (one item for the group), and get an item of their own
    when their outcome is written; retries hold every state in their own item."""

    DISPATCHED = "dispatched"  # holds a slot, on its model's queue
    RUNNING = "running"  # holds a slot, a worker is calling the backend
    WAITING = "waiting"  # holds no slot: waiting for a retry, the quota's renewal or batch access
    COMPLETED = "completed"
    FAILED = "failed"
    UNSTARTED = "unstarted"  # dispatched but never run: its batch stopped first


FINAL_REQUEST = frozenset({RequestState.COMPLETED, RequestState.FAILED, RequestState.UNSTARTED})

REQUEST_TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    RequestState.DISPATCHED: frozenset(
        {RequestState.RUNNING, RequestState.WAITING, RequestState.FAILED, RequestState.UNSTARTED}
    ),
    # RUNNING -> UNSTARTED: a group claimed running by the worker that runs it, stopped by the checks made
    # just before its first call (its batch stopped, its owner lost access): it never reached the backend.
    RequestState.RUNNING: frozenset(
        {RequestState.COMPLETED, RequestState.FAILED, RequestState.WAITING, RequestState.UNSTARTED}
    ),
    # WAITING -> RUNNING: retries claimed running by the slot pump that runs them at once (their start in
    # their claim, as a group's); stopped by the checks made just before their call, they go on as a
    # dispatched request would. WAITING -> COMPLETED: a request held by a provider job (service.offloading)
    # waits, holding no slot, until its provider's answer lands (a final error lands as FAILED).
    RequestState.WAITING: frozenset({RequestState.DISPATCHED, RequestState.RUNNING, RequestState.COMPLETED,
                                     RequestState.FAILED, RequestState.UNSTARTED}),
    # Retry in place: a request of an ended batch that failed or never started waits to run again (its batch
    # was retried, service.steering.retry); a success is never run again.
    RequestState.FAILED: frozenset({RequestState.WAITING}),
    RequestState.UNSTARTED: frozenset({RequestState.WAITING}),
}


def request_transition(old: RequestState | str | None, new: RequestState) -> RequestState:
    """`new` if a request in `old` may move to it, else IllegalTransition. `None`: a request not yet
    dispatched (it has no state), which only a claim moves (to DISPATCHED, or RUNNING for a worker that
    runs what it claims)."""
    if old is None:
        allowed = new in (RequestState.DISPATCHED, RequestState.RUNNING)
    else:
        allowed = new in REQUEST_TRANSITIONS.get(RequestState(old), frozenset())
    if not allowed:
        raise IllegalTransition(f"request {old} -> {new}")
    return new


def counts_as_failed_unstarted(stop: Stop | None) -> bool:
    """Requests a failed or expired batch never ran count as failed; cancelled ones count nowhere."""
    return stop in (Stop.FAIL, Stop.EXPIRE)


def public_request_status(state: RequestState | None, stop: Stop | None) -> str:
    """The result `status` a user sees for a request, stored or not."""
    if state is None or state is RequestState.UNSTARTED:  # never ran
        return {None: "queued", Stop.CANCEL: "cancelled", Stop.EXPIRE: "expired", Stop.FAIL: "failed"}[stop]
    if state in (RequestState.DISPATCHED, RequestState.WAITING):
        return "queued"
    return state.value


def unstarted_error(stop: Stop | None) -> dict | None:
    """The error a never-started request carries once its batch stopped."""
    if stop is Stop.FAIL:
        return {"code": "batch_failed", "message": "Not run: the batch failed."}
    if stop is Stop.EXPIRE:
        return {"code": "batch_expired", "message": "Not run: the completion window closed first."}
    return None


def unstarted_stop(error: dict | None) -> Stop:
    """The stop a never-started request ended under, from the error it carries (see `unstarted_error`)."""
    code = (error or {}).get("code")
    return Stop.FAIL if code == "batch_failed" else Stop.EXPIRE if code == "batch_expired" else Stop.CANCEL


def backend_key_not_set_error(model_id: str) -> dict:
    """The final error of a request whose model's backend key is still the deploy's placeholder: it was not
    sent (retrying cannot help until the operator acts, and then new requests run)."""
    return {"code": "service_unavailable", "status": 503,
            "message": f"Model '{model_id}' is not available: the operator has not set its backend API key yet "
                       "(its secret still holds the deploy's placeholder). The request was not run."}


# --- Outcomes of one attempt -------------------------------------------------------------------------

ERROR_CODES_BY_STATUS = {400: "invalid_request", 422: "invalid_request", 404: "model_not_found", 403: "forbidden",
                         429: "rate_limited", 504: "timeout", 503: "service_unavailable"}


def error_code_for_status(status: int) -> str:
    if status in ERROR_CODES_BY_STATUS:
        return ERROR_CODES_BY_STATUS[status]
    return "upstream_error" if status >= 500 else "invalid_request"


def is_retryable(status: int | None) -> bool:
    """Timeouts (no status), 429 and 5xx may pass; any other 4xx fails at once."""
    return status is None or status == 429 or status >= 500


MAX_ERROR_MESSAGE_CHARS = 4096  # of a backend's error message kept with a failed request


@dataclass(frozen=True)
class Attempt:
    """What one call to a backend gave."""

    status_code: int | None  # None: no answer (timeout, connection lost, no connection)
    body: dict | None = None
    request_id: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # of input_tokens, served from the backend's prompt cache (where it says)
    reasoning_tokens: int = 0  # of output_tokens, spent reasoning (where the backend says)
    cost_known: bool = True  # False when the backend may have run it but we cannot know the cost
    sent: bool = True  # False: it never reached the backend (no connection was made), so it cost nothing
    # True: the backend reported no usage (a stream without its usage chunk); the tokens are estimated from
    # the text (`providers.estimate`), and so is the cost
    usage_estimated: bool = False
    message: str = ""
    retry_after: float | None = None
    latency_ms: float | None = None  # how long the backend took, where a batch request's run measured it

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300

    def error(self, keep_body_bytes: int = 16 * 1024) -> dict:
        """The error a request records: the service's code (the specification's table) and a message; for an
        error answer, beside them the backend's status, request id and body (`body_text`: its JSON text as
        sent). A body over `keep_body_bytes` is not kept (`body_omitted_bytes` says how large it was), and a
        message over MAX_ERROR_MESSAGE_CHARS is cut: a request's DynamoDB item holds at most 400 KB."""
        if self.status_code is None and not self.sent:
            return {"code": "service_unavailable", "message": self.message or "Could not connect to the backend."}
        if self.status_code is None:
            return {"code": "timeout", "message": self.message or "The backend did not answer in time."}
        message = self.message or "Backend error"
        if len(message) > MAX_ERROR_MESSAGE_CHARS:
            message = message[:MAX_ERROR_MESSAGE_CHARS] + " [cut]"
        error = {"code": error_code_for_status(self.status_code), "message": message, "status": self.status_code,
                 "request_id": self.request_id}
        body = text_of(self.body) if self.body is not None else None
        if body is not None and len(body.encode()) > keep_body_bytes:
            error["body_omitted_bytes"], body = len(body.encode()), None
        return {**error, "body_text": body}


@dataclass
class Relay:
    """A streamed answer being passed on (interactive `stream: true`): `chunks` are what the caller is sent,
    server-sent events in its own API's shapes; `outcome()` is the attempt they added up to once `chunks`
    ended or stopped (usage known only if the stream ran to its end); `close()` lets go of the backend."""

    chunks: AsyncIterator[bytes]
    outcome: Callable[[], Attempt]
    close: Callable[[], Awaitable[None]]


def retry_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter, after `attempt` attempts have run."""
    r = rng or random
    return r.uniform(0, min(cap, base * 2 ** (attempt - 1))) + base / 2


# --- Days (the daily quota renews at 00:00 UTC) ---------------------------------------------------------

def utc_day(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%d")


def next_utc_midnight(now: float) -> int:
    day = dt.datetime.fromtimestamp(now, dt.UTC).date() + dt.timedelta(days=1)
    return int(dt.datetime.combine(day, dt.time(), dt.UTC).timestamp())


# --- Identifiers -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class IdKind:
    """A kind of id the service makes: a prefix, then lower-case hex digits. An id or cursor a client sends
    that is not of the kind its route takes cannot name anything of ours, so it is answered as unknown
    without a read: made up, it may not even be a valid key (DynamoDB refuses a read whose partition key
    is over 2,048 bytes, or sort key over 1,024, and that refusal would be a 500)."""

    prefix: str
    hex_digits: int

    def new(self) -> str:
        return self.prefix + secrets.token_hex(self.hex_digits // 2)

    def names(self, value: object) -> bool:
        """Whether `value` is an id of this kind (of its exact length: a long one is never looked up)."""
        return (isinstance(value, str) and len(value) == len(self.prefix) + self.hex_digits
                and value.startswith(self.prefix) and _HEX.fullmatch(value, len(self.prefix)) is not None)


_HEX = re.compile("[0-9a-f]+")
FILE_IDS = IdKind("file-", 24)
UPLOAD_IDS = IdKind("upload_", 24)
EVENT_IDS = IdKind("evt_", 28)  # 12 hex digits of milliseconds, then 16 random ones (new_event_id)


def new_event_id(now: float) -> str:
    """A webhook event id; ids sort by creation time (milliseconds), so an account's events list newest first."""
    return f"{EVENT_IDS.prefix}{int(now * 1000):012x}{secrets.token_hex(8)}"


def new_file_id() -> str:
    return FILE_IDS.new()


def new_upload_id() -> str:
    return UPLOAD_IDS.new()


def new_account_id() -> str:
    return "acct_" + secrets.token_hex(8)


def new_api_key() -> str:
    return "hyi-" + secrets.token_urlsafe(32)


def new_token() -> str:
    return secrets.token_hex(8)


def result_id(index: int) -> str:
    return f"batch_req_{index + 1}"


def parse_result_id(value: str) -> int | None:
    """The request index a result ID names, or None when it is not a result ID."""
    prefix = "batch_req_"
    digits = value[len(prefix):]
    # ASCII digits only, and no more than an index can have ('²' or '٣' are digits to str.isdigit).
    if not value.startswith(prefix) or not digits.isascii() or not digits.isdigit() or len(digits) > 12:
        return None
    number = int(digits)
    return number - 1 if number >= 1 else None


class Tier(StrEnum):
    FREE = "free"
    PRO = "pro"
    INTERNAL = "internal"


class AccountStatus(StrEnum):
    ACTIVE = "active"
    SUSPENDED = "suspended"
    DELETED = "deleted"


# The numbers DynamoDB holds: 0, or a magnitude from 1E-130 to under 1E+126, with at most 38 significant digits.
# A number from a request that is stored must be one of them (a float has at most 17 significant digits).
STORED_NUMBER_MIN = Decimal("1E-130")
STORED_NUMBER_LIMIT = Decimal("1E+126")
STORED_NUMBER_RANGE = "0 or a magnitude from 1e-130 to under 1e+126"


def storable_number(value: int | float) -> bool:
    """Whether a number from a request can be stored as it is (in range, and 38 significant digits at most)."""
    try:
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    except (ValueError, ArithmeticError):
        return False
    if not number.is_finite():
        return False
    if number == 0:
        return True
    digits = "".join(map(str, number.as_tuple().digits)).strip("0")
    return len(digits) <= 38 and STORED_NUMBER_MIN <= number.copy_abs() < STORED_NUMBER_LIMIT
