"""Where a webhook may be sent: HTTPS to public addresses only (no way into private networks).

The URL is checked at registration and again before every delivery, and the delivery connects to the very
address checked here (`WebhookTarget.address`), so a DNS answer that changes between the check and the
connection cannot redirect it. Addresses are classified by the standard `ipaddress` module, not by string
rules; hosts written as numbers in any other spelling than the canonical one (`2130706433`, `0x7f.0.0.1`,
`017700000001`, `127.1`) are refused outright, since resolvers read them in ways that differ.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

Resolver = Callable[[str, int], list[str]]  # (host, port) -> the addresses it resolves to

MAX_URL_LENGTH = 2048
METADATA_ADDRESSES = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
NAT64_PREFIXES = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")


class UrlRefused(ValueError):
    """The URL may not be a webhook target; the message says why, for the caller."""


@dataclass(frozen=True)
class WebhookTarget:
    url: str
    scheme: str
    host: str  # the hostname as written (for Host, SNI and the certificate check)
    port: int
    target: str  # path and query
    address: str  # the checked address to connect to


def system_resolver(host: str, port: int) -> list[str]:
    """Every address the system's resolver gives for the host."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise UrlRefused(f"the host {host!r} does not resolve ({error})") from None
    return list(dict.fromkeys(info[4][0] for info in infos))


def _embedded_v4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 transition form carries, with the form's name."""
    if ip.ipv4_mapped is not None:
        return "IPv4-mapped", ip.ipv4_mapped
    if ip in IPV4_TRANSLATED:
        return "IPv4-translated", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if any(ip in net for net in NAT64_PREFIXES):
        return "NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return "6to4", ip.sixtofour
    if ip.teredo is not None:
        return "Teredo", ip.teredo[1]
    return None


def forbidden(address: str, allow_loopback: bool = False) -> str | None:
    """Why an address may not be a webhook target (None if it may)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone
    if isinstance(ip, ipaddress.IPv6Address) and (embedded := _embedded_v4(ip)):
        form, v4 = embedded
        inner = forbidden(str(v4), allow_loopback)
        if inner:
            return f"{form} form of {v4}, {inner}"
    if ip in METADATA_ADDRESSES:
        return "the cloud metadata address"
    if ip.is_loopback:
        return None if allow_loopback else "a loopback address"
    for test, name in ((ip.is_unspecified, "the unspecified address"), (ip.is_multicast, "a multicast address"),
                       (ip.is_link_local, "a link-local address"),
                       (isinstance(ip, ipaddress.IPv4Address) and ip in CGNAT, "a shared (CGNAT) address"),
                       (ip.is_reserved, "a reserved address"), (ip.is_private, "a private address"),
                       (not ip.is_global, "not a public address")):
        if test:
            return name
    return None


def _host_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The host as an address literal; refuses numbers in any but the canonical spelling."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    # No top-level domain is numeric, so a host ending in a number is an address in some other spelling.
    if _NUMERIC_LABEL.match(labels[-1]) or all(_NUMERIC_LABEL.match(label) for label in labels):
        raise UrlRefused(f"the host {host!r} is a number in a non-canonical spelling; write a hostname, or an "
                         "address in its usual form")
    return None


def check_url(url: object, *, allow_loopback: bool = False, resolve: Resolver = system_resolver) -> WebhookTarget:
    """Check a webhook URL and resolve it: every address its host resolves to must be allowed.
    `allow_loopback` (local development and tests) also lets http://127.0.0.1 and localhost through."""
    if not isinstance(url, str) or not url:
        raise UrlRefused("url must be a non-empty string")
    if len(url) > MAX_URL_LENGTH:
        raise UrlRefused(f"url is longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise UrlRefused(f"url is not a valid URL ({error})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise UrlRefused("url must start with https://")
    host = (parts.hostname or "").lower()
    if not host:
        raise UrlRefused("url has no host")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("url may not carry a user name or password")
    port = port or (443 if scheme == "https" else 80)
    literal = _host_address(host)
    addresses = [str(literal)] if literal else resolve(host, port)
    if not addresses:
        raise UrlRefused(f"the host {host!r} resolves to no address")
    for address in addresses:
        reason = forbidden(address, allow_loopback)
        if reason:
            where = f"{host!r} resolves to {address}" if literal is None else f"{host!r}"
            raise UrlRefused(f"url must reach a public address: {where} is {reason}")
    loopback = all(ipaddress.ip_address(a.split("%", 1)[0]).is_loopback for a in addresses)
    if scheme == "http" and not (allow_loopback and loopback):
        raise UrlRefused("url must start with https://")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return WebhookTarget(url=url, scheme=scheme, host=host, port=port, target=target, address=addresses[0])
