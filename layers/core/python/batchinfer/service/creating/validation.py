"""Whole-batch validation: every request is checked before anything is stored."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from ...domain import BatchStatus
from ...errors import QUOTED_CHARS, ApiError, InvalidRequest, clipped, quoted
from ...jsontext import DuplicateKey, where
from ...jsontext import loads as read_json
from ...providers import backend_refusal
from ...request_bodies import CHAT, EMBEDDINGS, RESPONSES, body_problem, got
from ...runtime import Services
from ..accounts import may_use_model


@dataclass(frozen=True)
class ValidRequest:
    custom_id: str
    model_id: str  # the catalog id the model name pointed to at creation
    body: dict


@dataclass(frozen=True)
class RejectedRequest:
    """A request refused at intake while the rest of its batch runs (Message Batches check each on its own)."""

    custom_id: str
    error: dict  # {code, message, type}: its result


@dataclass(frozen=True)
class ValidatedBatch:
    endpoint: str
    requests: list[ValidRequest | RejectedRequest]
    metadata: dict | None
    status: BatchStatus = BatchStatus.VALIDATING  # what it is created as
    window_seconds: int | None = None  # its completion window, when its API fixes one (else the setting's)


def _fault(i: int, custom_id: object, message: str) -> ApiError:
    who = f"requests[{i}] (custom_id {quoted(custom_id)})" if isinstance(custom_id, str) else f"requests[{i}]"
    return InvalidRequest(clipped(f"{who}: {message}", 2 * MAX_PROBLEM_CHARS), param=f"requests[{i}]")


# JSON lets a string spell half of a UTF-16 surrogate pair on its own ("\ud800"), and Python's json reads
# it (and UTF-8 bytes of one: it decodes with surrogatepass) into a str no UTF-8 encoder accepts: an error
# message quoting it, a batch object or result holding it, or the body sent to a backend would all fail.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_UTF8 = re.compile(rb"\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")
UNPAIRED_SURROGATE = ("The body holds an unpaired surrogate (a \\ud800-\\udfff escape without its other half), "
                      "which is not valid Unicode.")


def _may_hold_surrogate(raw: bytes) -> bool:
    """A quick look at the bytes (a few ms for 32 MB): False when no string of the body can hold one."""
    if json.detect_encoding(raw) not in ("utf-8", "utf-8-sig"):
        return True  # UTF-16 or UTF-32 (rare): look at every string
    return bool(_SURROGATE_ESCAPE.search(raw)) or (b"\xed" in raw and bool(_SURROGATE_UTF8.search(raw)))


def _holds_surrogate(value: object) -> bool:
    """Whether a string of a parsed body (a key or a value, at any depth) holds an unpaired surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def holds_unpaired_surrogate(raw: bytes, payload: object) -> bool:
    """Whether a parsed JSON body (from `raw`) holds a string no UTF-8 encoder accepts: refuse it at once."""
    return _may_hold_surrogate(raw) and _holds_surrogate(payload)


def duplicate_key_fault(error: DuplicateKey) -> tuple[str, str]:
    """What a body that names a key twice is told, and the parameter: the key and where it is, with the
    custom_id of the batch request that holds it (read as Python would, the last one winning)."""
    param = clipped(where((*error.path, error.key)), 2 * QUOTED_CHARS)  # keys on the way may be long too
    head, rest = param, ""
    path = error.path
    if len(path) >= 2 and path[0] == "requests" and isinstance(path[1], int):
        entry = error.value.get("requests")[path[1]] if isinstance(error.value, dict) else None
        custom_id = entry.get("custom_id") if isinstance(entry, dict) else None
        named = isinstance(custom_id, str) and not (len(path) == 2 and error.key == "custom_id")
        head = where(path[:2]) + (f" (custom_id {quoted(custom_id)})" if named else "")
        rest = clipped(where((*path[2:], error.key)), 2 * QUOTED_CHARS)
    message = (f"{head}: {rest + ': ' if rest else ''}the key {quoted(error.key)} is given more than once in one "
               "object. A JSON body must name each key once (I-JSON, RFC 7493): readers disagree on which one "
               "counts.")
    return message, param


def validate_metadata(metadata: object) -> dict | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise InvalidRequest("metadata must be an object of string keys and values.", param="metadata")
    if len(metadata) > 16:
        raise InvalidRequest("metadata may hold at most 16 key-value pairs.", param="metadata")
    for key, value in metadata.items():
        if len(key) > 64:
            raise InvalidRequest(f"metadata key {quoted(key)} is longer than 64 characters.", param="metadata")
        if not isinstance(value, str):
            raise InvalidRequest(f"metadata['{key}'] must be a string.", param="metadata")
        if len(value) > 512:
            raise InvalidRequest(f"metadata['{key}'] is longer than 512 characters.", param="metadata")
    return metadata


def allowed_endpoints(svc: Services) -> tuple[str, ...]:
    if svc.settings.embeddings_responses_batches_enabled:
        return (CHAT, EMBEDDINGS, RESPONSES)
    return (CHAT,)


def non_finite(value: object) -> bool:
    """Whether a parsed body holds NaN or Infinity: Python's json reads them (and a number past a double's
    range as Infinity), JSON and the backends do not. Checked on every body a backend would get: a plain
    walk, no paths kept (a batch's 50,000 bodies go through it)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def non_finite_at(value: object) -> str | None:
    """Where a parsed body first holds NaN or Infinity (e.g. 'temperature', 'logit_bias.50256', 'input[2]';
    '' for the body itself), or None. The path is looked for only in a body that holds one."""
    if not non_finite(value):
        return None
    stack: list[tuple[object, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return where(path)
        elif isinstance(item, dict):
            stack.extend((v, (*path, k)) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((v, (*path, i)) for i, v in reversed(list(enumerate(item))))
    return None


def non_finite_fault(at: str) -> str:
    """What a body holding NaN or Infinity at `at` (non_finite_at) is told."""
    return (f"{clipped(at) + ': ' if at else ''}NaN or Infinity (or a number too large for a double) is not "
            "valid JSON; send a finite number.")


def _check_body(endpoint: str, body: dict) -> str | None:
    """What is wrong with a body for its endpoint, or None."""
    at = non_finite_at(body)
    if at is not None:
        return "body" + ("." if at and not at.startswith("[") else "") + non_finite_fault(at).rstrip(".")
    if body.get("stream") is True:
        return "stream must not be true in a batch"
    problem = body_problem(endpoint, body)  # the types and ranges the endpoint itself checks
    if problem:
        return problem
    if endpoint == RESPONSES:  # what a batch cannot carry: a Responses request that depends on another
        if body.get("store") is True:
            return "store must be false or left out: batched Responses requests are not stored"
        for field in ("previous_response_id", "conversation", "background"):
            if body.get(field) is not None:
                return f"{field} is not allowed in a batched Responses request"
        for i, tool in enumerate(body.get("tools") or []):
            if isinstance(tool, dict) and tool.get("type") not in ("function", "custom"):
                return (f"tools[{i}]: the hosted tool {quoted(tool.get('type'))} is not allowed in a batched Responses "
                        "request (only function tools: a batch runs each request on its own)")
        for where, part in _input_parts(body.get("input")):
            if part.get("type") == "input_file" or part.get("file_id"):
                return f"{where}: file inputs are not allowed in a batched Responses request"
    return None


def _input_parts(value: object) -> list[tuple[str, dict]]:
    """The content parts of a Responses `input` with where each is, e.g. ('input[0].content[1]', {...})."""
    found: list[tuple[str, dict]] = []
    for i, item in enumerate(value if isinstance(value, list) else []):
        if not isinstance(item, dict):
            continue
        found.append((f"input[{i}]", item))
        for j, part in enumerate(item.get("content") if isinstance(item.get("content"), list) else []):
            if isinstance(part, dict):
                found.append((f"input[{i}].content[{j}]", part))
    return found


class Problem(Exception):
    """What is wrong with one request, with OpenAI's batch error code where it has one."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def endpoint_problem(endpoints: tuple[str, ...], url: object, name: str = "url") -> str | None:
    """What is wrong with an endpoint (a request's `url`, a file batch's `endpoint`), or None."""
    if url in endpoints:
        return None
    return f"{name} {quoted(url)} is not supported: " + (
        "/v1/chat/completions is the only endpoint batches serve" if len(endpoints) == 1
        else "batches serve " + ", ".join(endpoints))


def check_request(svc: Services, account: dict, req: object, endpoint: str | None,
                  seen: set[str]) -> ValidRequest:
    """One request of a batch (an inline entry or a line of a file): ValidRequest, or Problem. `endpoint`:
    the url every request must use (None: the first request's url decides, for inline batches)."""
    if not isinstance(req, dict):
        raise Problem("invalid_request", "each request must be an object")
    custom_id = req.get("custom_id")
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= 512:
        raise Problem("invalid_custom_id", "custom_id must be a string of 1-512 characters")
    if custom_id in seen:
        raise Problem("duplicate_custom_id", f"custom_id {quoted(custom_id)} is used more than once")
    seen.add(custom_id)
    method = req.get("method", "POST")
    if method != "POST":
        raise Problem("invalid_method", f"method must be POST, not {quoted(method)}")
    url = req.get("url", CHAT)
    problem = endpoint_problem(allowed_endpoints(svc), url)
    if problem:
        raise Problem("url_mismatch" if endpoint else "invalid_url", problem)
    if endpoint is not None and url != endpoint:
        raise Problem("url_mismatch", f"every request of a batch must use the same url ('{endpoint}'), not "
                                      f"{quoted(url)}")
    body = req.get("body")
    if not isinstance(body, dict):
        raise Problem("invalid_body", "body must be an object")
    name = body.get("model")
    if name is None:
        raise Problem("missing_model", "body.model is required")
    if not isinstance(name, str):
        raise Problem("invalid_body", f"body.model: input should be a valid string{got(name)}")
    if not name:
        raise Problem("invalid_body", "body.model: string should have at least 1 character")
    model = svc.catalog.lookup(name)
    if model is None or not may_use_model(account, model.id):
        raise Problem("model_not_found", f"Model {quoted(name)} not found")
    if model.auto:
        raise Problem("model_not_found", f"Model {quoted(name)} is an auto model; auto models cannot be used in a "
                                         "batch")
    if model.backend is None or url not in model.endpoints:
        raise Problem("unsupported_endpoint", f"Model {quoted(name)} does not serve {url}")
    problem = _check_body(url, body) or backend_refusal(model, url, body)  # the types, then what its backend carries
    if problem:
        raise Problem("invalid_body", problem)
    return ValidRequest(custom_id=custom_id, model_id=model.id, body=body)


def validate_inline_batch(svc: Services, account: dict, payload: object) -> ValidatedBatch:
    limits = svc.settings
    if not isinstance(payload, dict):
        raise InvalidRequest("The body must be a JSON object with a 'requests' array.")
    requests = payload.get("requests")
    if not isinstance(requests, list) or not requests:
        raise InvalidRequest("requests must be a non-empty array of requests.", param="requests")
    if len(requests) > limits.max_requests_per_batch:
        raise InvalidRequest(f"The batch holds {len(requests)} requests; at most {limits.max_requests_per_batch} "
                             "are allowed. Split it into several batches.", param="requests")
    metadata = validate_metadata(payload.get("metadata"))
    seen: set[str] = set()
    endpoint: str | None = None
    valid: list[ValidRequest] = []
    for i, req in enumerate(requests):
        try:
            request = check_request(svc, account, req, endpoint, seen)
        except Problem as problem:
            raise _fault(i, req.get("custom_id") if isinstance(req, dict) else None, problem.message) from None
        if endpoint is None:
            endpoint = req.get("url", CHAT)
        valid.append(request)
    return ValidatedBatch(endpoint=endpoint or CHAT, requests=valid, metadata=metadata)


# What a refused file's `errors.data` holds, stored in the batch item (DynamoDB: 400 KB an item), whatever the
# file holds: at most this many problems, the last one saying how many more; each message at most
# MAX_PROBLEM_CHARS (a value it quotes is clipped further, errors.QUOTED_CHARS); all of them at most
# MAX_PROBLEMS_BYTES as JSON.
MAX_REPORTED_PROBLEMS = 100
MAX_PROBLEM_CHARS = 512
MAX_PROBLEMS_BYTES = 32 * 1024
MORE_PROBLEMS = "more_errors"  # the code of the last entry when it counts the problems not listed
KEYS_NAMED = 5  # unexpected keys of a line its problem names (each clipped); the rest are counted


def _keys_named(keys: list[str]) -> str:
    """Keys a message lists: the first KEYS_NAMED, each quoted and clipped, and how many more."""
    named = ", ".join(quoted(k) for k in keys[:KEYS_NAMED])
    return named + (f" and {len(keys) - KEYS_NAMED:,} more" if len(keys) > KEYS_NAMED else "")


class ProblemList:
    """The problems of a file, bounded as they are found: a file of 50,000 bad lines, each quoting megabytes,
    keeps at most MAX_REPORTED_PROBLEMS short entries (in memory and in the batch item) and a count of the
    rest, summarized in the last entry ("...and 4,812 more problems.")."""

    def __init__(self) -> None:
        self.entries: list[dict] = []
        self.bytes = 0
        self.more = 0

    def add(self, line: int | None, code: str, message: str, param: str | None = None) -> None:
        entry = {"code": clipped(code), "message": clipped(message, MAX_PROBLEM_CHARS),
                 "param": clipped(param) if param is not None else None, "line": line}
        size = len(json.dumps(entry))
        # Room is kept for the summary, which replaces what does not fit.
        if len(self.entries) < MAX_REPORTED_PROBLEMS - 1 and self.bytes + size <= MAX_PROBLEMS_BYTES - 256:
            self.entries.append(entry)
            self.bytes += size
        else:
            self.more += 1

    def __bool__(self) -> bool:
        return bool(self.entries) or self.more > 0

    def data(self) -> list[dict]:
        """The entries to store: the problems kept, and a last one counting those left out."""
        if not self.more:
            return list(self.entries)
        return [*self.entries, {"code": MORE_PROBLEMS, "message": f"...and {self.more:,} more problems.",
                                "param": None, "line": None}]


def problem_count(problems: list[dict]) -> int:
    """How many problems a bounded list stands for: those it lists and those its summary counts."""
    if problems and problems[-1].get("code") == MORE_PROBLEMS and problems[-1].get("line") is None:
        more = re.search(r"and ([\d,]+) more", str(problems[-1].get("message")))
        return len(problems) - 1 + (int(more.group(1).replace(",", "")) if more else 1)
    return len(problems)


def bounded_problems(problems: list[dict]) -> list[dict]:
    """Problems from anywhere (`{code, message, param, line}`), bounded as a ProblemList bounds them (a list
    already within the bounds, such as a ProblemList's, is kept as it is, its summary and all)."""
    if len(problems) <= MAX_REPORTED_PROBLEMS and len(json.dumps(problems)) <= MAX_PROBLEMS_BYTES and all(
            len(str(p.get("message"))) <= MAX_PROBLEM_CHARS + 3 for p in problems):
        return problems
    found = ProblemList()
    for problem in problems:
        found.add(problem.get("line"), str(problem.get("code")), str(problem.get("message")), problem.get("param"))
    return found.data()


def validate_file_lines(svc: Services, account: dict, endpoint: str, data: bytes
                        ) -> tuple[list[ValidRequest], list[dict]]:
    """Every line of an input file: (the requests, []) when all are valid, else ([], the problems found, each
    {code, message, param, line}, bounded as ProblemList bounds them). One model for the whole file."""
    s = svc.settings
    problems = ProblemList()
    valid: list[ValidRequest] = []
    seen: set[str] = set()
    model_id: str | None = None
    lines = 0

    def report(line: int, code: str, message: str) -> None:
        problems.add(line, code, message)

    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue  # empty lines are ignored
        lines += 1
        if len(raw) > s.max_line_bytes:
            report(number, "line_too_large", f"The line is {len(raw)} bytes, more than the limit of "
                                             f"{s.max_line_bytes} bytes.")
            continue
        try:
            entry = read_json(raw)
        except DuplicateKey as twice:
            report(number, "duplicate_key", f"Line {number}: {duplicate_key_fault(twice)[0]}")
            continue
        except ValueError:
            report(number, "invalid_json_line", "This line is not parseable as valid JSON.")
            continue
        except RecursionError:
            report(number, "invalid_json_line", f"Line {number} is nested too deeply to be read as JSON.")
            continue
        if holds_unpaired_surrogate(raw, entry):
            report(number, "invalid_json_line", "This line holds an unpaired surrogate, which is not valid Unicode.")
            continue
        if isinstance(entry, dict) and set(entry) != {"custom_id", "method", "url", "body"}:
            extra = sorted(set(entry) - {"custom_id", "method", "url", "body"})
            missing = sorted({"custom_id", "method", "url", "body"} - set(entry))
            report(number, "invalid_request", "Each line must hold exactly custom_id, method, url and body"
                   + (f"; missing {', '.join(missing)}" if missing else "")
                   + (f"; unexpected {_keys_named(extra)}" if extra else "") + ".")
            continue
        try:
            request = check_request(svc, account, entry, endpoint, seen)
        except Problem as problem:
            report(number, problem.code, problem.message)
            continue
        if model_id is None:
            model_id = request.model_id
        elif request.model_id != model_id:
            report(number, "model_mismatch", f"Every line of a file must use the same model: this one uses "
                                             f"{quoted(entry['body']['model'])}, earlier lines '{model_id}'.")
            continue
        valid.append(request)
    if lines == 0:
        report(0, "empty_file", "The file holds no requests.")
    elif lines > s.max_requests_per_batch:
        report(0, "too_many_tasks", f"The file holds {lines} requests; at most {s.max_requests_per_batch} are "
                                    "allowed. Split it into several files.")
    if problems:
        return [], problems.data()
    return valid, []
