"""API Gateway HTTP API (payload format 2.0) events, built as API Gateway sends them to a Lambda, and the
decoding of the Lambda's answer.

Shape of a request event (what API Gateway does, not what an ASGI test client does):
- version "2.0", routeKey "$default" (the service uses a single catch-all route), stage "$default";
- rawPath and requestContext.http.path are the request path; rawQueryString is the query as sent,
  queryStringParameters its parsed form (repeated names joined by commas), absent when there is no query;
- header names are lower-cased and repeated headers are joined by commas; API Gateway adds host,
  x-forwarded-for/-port/-proto and x-amzn-trace-id;
- body is absent when the request has none; a JSON/text body arrives as text with isBase64Encoded false,
  anything else base64-encoded with isBase64Encoded true;
- cookies is absent unless the client sent a Cookie header; pathParameters/stageVariables are absent.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

API_ID = "a1b2c3d4e5"
DOMAIN = f"{API_ID}.execute-api.us-east-1.amazonaws.com"
SOURCE_IP = "203.0.113.7"
USER_AGENT = "python-httpx/0.28.1"
TEXT_TYPES = ("application/json", "text/", "application/x-www-form-urlencoded", "application/xml")
_NO_BODY = object()


def _query(query: dict | list | str | None) -> str:
    if query is None:
        return ""
    if isinstance(query, str):
        return query
    return urlencode(query if isinstance(query, list) else list(query.items()))


def http_event(method: str, path: str, *, headers: dict[str, str] | None = None,
               query: dict | list | str | None = None, body: bytes | str | None = None,
               json_body: object = _NO_BODY, source_ip: str = SOURCE_IP) -> dict:
    """An API Gateway HTTP API (2.0) event for one request.

    `json_body` is serialized compactly, as an SDK sends it, with `content-type: application/json`.
    `body=b""` (or None) with a POST is a request without a body: no `body` in the event,
    `content-length: 0` when the client declared it.
    """
    hdrs: dict[str, str] = {}
    if json_body is not _NO_BODY:
        body = json.dumps(json_body, separators=(",", ":"))
        hdrs["content-type"] = "application/json"
    for name, value in (headers or {}).items():
        key = name.lower()
        hdrs[key] = f"{hdrs[key]},{value}" if key in hdrs and key != "content-type" else value
    raw_body = body.encode() if isinstance(body, str) else body
    if raw_body is not None and "content-length" not in hdrs:
        hdrs["content-length"] = str(len(raw_body))
    hdrs.setdefault("user-agent", USER_AGENT)
    hdrs.update({
        "host": hdrs.get("host", DOMAIN),  # a client's own Host reaches the app through a proxy or custom domain
        "x-amzn-trace-id": f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]}",
        "x-forwarded-for": source_ip,
        "x-forwarded-port": "443",
        "x-forwarded-proto": "https",
    })
    raw_query = _query(query)
    now = time.time()
    event: dict = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": raw_query,
        "headers": hdrs,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": API_ID,
            "domainName": DOMAIN,
            "domainPrefix": API_ID,
            "http": {"method": method.upper(), "path": path, "protocol": "HTTP/1.1", "sourceIp": source_ip,
                     "userAgent": hdrs["user-agent"]},
            "requestId": base64.b32encode(uuid.uuid4().bytes).decode()[:16],
            "routeKey": "$default",
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "isBase64Encoded": False,
    }
    if raw_query:
        params: dict[str, str] = {}
        for name, value in parse_qsl(raw_query, keep_blank_values=True):
            params[name] = f"{params[name]},{value}" if name in params else value
        event["queryStringParameters"] = params
    if raw_body:
        content_type = hdrs.get("content-type", "")
        if any(content_type.startswith(t) for t in TEXT_TYPES):
            try:
                event["body"] = raw_body.decode()
            except UnicodeDecodeError:
                event["body"], event["isBase64Encoded"] = base64.b64encode(raw_body).decode(), True
        else:
            event["body"], event["isBase64Encoded"] = base64.b64encode(raw_body).decode(), True
    return event


@dataclass
class Reply:
    """A Lambda proxy integration answer (format 2.0), decoded as API Gateway would before sending it."""

    status: int
    headers: dict[str, str]
    body: bytes
    raw: dict

    @classmethod
    def decode(cls, answer: dict) -> Reply:
        assert isinstance(answer, dict) and isinstance(answer.get("statusCode"), int), answer
        body = answer.get("body") or ""
        data = base64.b64decode(body) if answer.get("isBase64Encoded") else body.encode()
        headers = {k.lower(): v for k, v in (answer.get("headers") or {}).items()}
        return cls(status=answer["statusCode"], headers=headers, body=data, raw=answer)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    def json(self) -> object:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()
