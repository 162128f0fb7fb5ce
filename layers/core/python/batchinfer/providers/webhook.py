"""The HTTP of a webhook delivery: one POST to the address that was checked (`addresses.WebhookTarget`),
never to whatever the hostname resolves to by the time it connects. The hostname still goes in `Host`, in
TLS's SNI and in the certificate check (httpx's `sni_hostname` extension); no redirect is followed, and at
most MAX_RESPONSE_BYTES of the answer are read."""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass

import httpx

from ..addresses import WebhookTarget

MAX_RESPONSE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Delivered:
    status_code: int | None  # None: no answer
    error: str | None  # why there was no 2xx, in a few words (never the response body)


def post_event(target: WebhookTarget, body: bytes, headers: dict[str, str], timeout: float) -> Delivered:
    ip = ipaddress.ip_address(target.address.split("%", 1)[0])
    literal = f"[{ip}]" if ip.version == 6 else str(ip)
    default_port = 443 if target.scheme == "https" else 80
    host_header = target.host if target.port == default_port else f"{target.host}:{target.port}"
    url = f"{target.scheme}://{literal}:{target.port}{target.target}"
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
            request = client.build_request("POST", url, content=body, extensions=extensions,
                                           headers={**headers, "host": host_header,
                                                    "content-type": "application/json",
                                                    "user-agent": "batchinfer-webhooks/1"})
            give_up = time.monotonic() + timeout
            response = client.send(request, stream=True)
            try:
                read = 0
                # Drained up to the cap and the timeout only: a receiver cannot make us read more, or longer.
                for chunk in response.iter_raw():
                    read += len(chunk)
                    if read >= MAX_RESPONSE_BYTES or time.monotonic() > give_up:
                        break
                code = response.status_code
            finally:
                response.close()
    except httpx.TimeoutException:
        return Delivered(None, f"no answer within {timeout:g} s")
    except httpx.HTTPError as error:
        return Delivered(None, f"connection failed: {type(error).__name__}")
    if 200 <= code < 300:
        return Delivered(code, None)
    if 300 <= code < 400:
        return Delivered(code, f"answered {code} (redirects are not followed)")
    return Delivered(code, f"answered {code}")
