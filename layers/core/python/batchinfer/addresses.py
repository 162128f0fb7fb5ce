"""Where a webhook may be sent: HTTPS to public addresses only (no way into private networks).

The URL is checked at registration and again before every delivery, and the delivery connects to the very
address checked here (`WebhookTarget.address`), so a DNS answer that changes between the check and the
connection cannot redirect it. Addresses are parsed by the standard `ipaddress` module, not by string rules,
and judged against the IANA special-purpose registries written out below (`SPECIAL_PURPOSE`). A refused host
name is answered only with "does not resolve to a public address": neither what it resolved to nor whether it
exists, so the check cannot be used to read internal DNS. Hosts written as numbers in any other spelling
than the canonical one (`2130706433`, `0x7f.0.0.1`, `017700000001`, `127.1`) are refused outright, since
resolvers read them in ways that differ.
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
IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")

# How an address that a special-purpose range holds is judged.
DENY, ALLOW, EMBEDDED = "deny", "allow", "embedded"

# The IANA IPv4 and IPv6 Special-Purpose Address Registries, written out here so that what a webhook may reach
# does not change with the Python patch level's `ipaddress` tables. Every entry whose "Globally Reachable" is
# False is denied; the True ones that sit inside a denied block are allowed (the most specific entry wins);
# the forms that carry an IPv4 address (NAT64's well-known prefix, 6to4) are judged by that address. Beyond the
# registries: multicast, and in IPv6 anything outside global unicast (2000::/3), are denied as well.
SPECIAL_PURPOSE: tuple[tuple[str, str, str], ...] = (
    # IPv4 (RFC 6890 and its updates)
    ("0.0.0.0/8", DENY, "a 'this network' address"),
    ("0.0.0.0/32", DENY, "the unspecified address"),
    ("10.0.0.0/8", DENY, "a private address"),
    ("100.64.0.0/10", DENY, "a shared (CGNAT) address"),
    ("127.0.0.0/8", DENY, "a loopback address"),
    ("169.254.0.0/16", DENY, "a link-local address"),
    ("172.16.0.0/12", DENY, "a private address"),
    ("192.0.0.0/24", DENY, "an IETF protocol assignment"),
    ("192.0.0.0/29", DENY, "an IPv4 service continuity address"),
    ("192.0.0.8/32", DENY, "the IPv4 dummy address"),
    ("192.0.0.9/32", ALLOW, "the PCP anycast address"),
    ("192.0.0.10/32", ALLOW, "the TURN anycast address"),
    ("192.0.0.170/31", DENY, "a NAT64/DNS64 discovery address"),
    ("192.0.2.0/24", DENY, "a documentation address (TEST-NET-1)"),
    ("192.31.196.0/24", ALLOW, "AS112-v4"),
    ("192.52.193.0/24", ALLOW, "AMT"),
    ("192.88.99.0/24", DENY, "a deprecated 6to4 relay anycast address"),
    ("192.168.0.0/16", DENY, "a private address"),
    ("192.175.48.0/24", ALLOW, "AS112 direct delegation"),
    ("198.18.0.0/15", DENY, "a benchmarking address"),
    ("198.51.100.0/24", DENY, "a documentation address (TEST-NET-2)"),
    ("203.0.113.0/24", DENY, "a documentation address (TEST-NET-3)"),
    ("240.0.0.0/4", DENY, "a reserved address"),
    ("255.255.255.255/32", DENY, "the limited broadcast address"),
    # IPv6 (RFC 6890 and its updates)
    ("::/128", DENY, "the unspecified address"),
    ("::1/128", DENY, "a loopback address"),
    ("::ffff:0:0/96", DENY, "an IPv4-mapped address"),
    ("64:ff9b::/96", EMBEDDED, "NAT64"),
    ("64:ff9b:1::/48", DENY, "a local-use NAT64 address"),
    ("100::/64", DENY, "a discard-only address"),
    ("100:0:0:1::/64", DENY, "a dummy IPv6 address"),
    ("2001::/23", DENY, "an IETF protocol assignment"),
    ("2001::/32", DENY, "a Teredo address"),
    ("2001:1::1/128", ALLOW, "the PCP anycast address"),
    ("2001:1::2/128", ALLOW, "the TURN anycast address"),
    ("2001:1::3/128", ALLOW, "the DNS-SD SRP anycast address"),
    ("2001:2::/48", DENY, "a benchmarking address"),
    ("2001:3::/32", ALLOW, "AMT"),
    ("2001:4:112::/48", ALLOW, "AS112-v6"),
    ("2001:10::/28", DENY, "a deprecated ORCHID address"),
    ("2001:20::/28", ALLOW, "ORCHIDv2"),
    ("2001:30::/28", ALLOW, "a drone remote ID entity tag"),
    ("2001:db8::/32", DENY, "a documentation address"),
    ("2002::/16", EMBEDDED, "6to4"),
    ("2620:4f:8000::/48", ALLOW, "AS112 direct delegation"),
    ("3fff::/20", DENY, "a documentation address"),
    ("5f00::/16", DENY, "a segment routing (SRv6) SID"),
    ("fc00::/7", DENY, "a private (unique-local) address"),
    ("fe80::/10", DENY, "a link-local address"),
)
_SPECIAL = tuple(sorted(((ipaddress.ip_network(net), rule, name) for net, rule, name in SPECIAL_PURPOSE),
                        key=lambda entry: entry[0].prefixlen, reverse=True))  # most specific first
_MULTICAST = (ipaddress.ip_network("224.0.0.0/4"), ipaddress.ip_network("ff00::/8"))
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")


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
    except (socket.gaierror, UnicodeError):
        return []  # refused as a host without a public address: whether a name exists is not for callers to learn
    return list(dict.fromkeys(info[4][0] for info in infos))


def _special(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> tuple[str, str] | None:
    """The most specific special-purpose entry holding the address: (rule, name)."""
    for net, rule, name in _SPECIAL:
        if ip.version == net.version and ip in net:
            return rule, name
    return None


def _embedded_v4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 transition form carries, with the form's name."""
    if ip.ipv4_mapped is not None:
        return "IPv4-mapped", ip.ipv4_mapped
    if ip in IPV4_TRANSLATED:
        return "IPv4-translated", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in ipaddress.ip_network("64:ff9b::/96") or ip in ipaddress.ip_network("64:ff9b:1::/48"):
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
    if ip.is_loopback and allow_loopback:
        return None
    special = _special(ip)
    if special is not None:
        rule, name = special
        if rule == DENY:
            return name
        return None  # allowed, or a form whose embedded IPv4 address was judged above
    if any(ip in net for net in _MULTICAST if ip.version == net.version):
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv6Address) and ip not in _GLOBAL_UNICAST_V6:
        return "not a global unicast address"
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
    if literal is not None:
        addresses = [str(literal)]
        reason = forbidden(addresses[0], allow_loopback)
        if reason:
            raise UrlRefused(f"url must reach a public address: {host!r} is {reason}")
    else:
        # A name's answers are never echoed, nor why they were refused, nor whether the name exists: the
        # message would otherwise read the service's internal DNS out to any caller.
        addresses = resolve(host, port)
        if not addresses or any(forbidden(address, allow_loopback) for address in addresses):
            raise UrlRefused(f"url must reach a public address: the host {host!r} does not resolve to a public "
                             "address")
    loopback = all(ipaddress.ip_address(a.split("%", 1)[0]).is_loopback for a in addresses)
    if scheme == "http" and not (allow_loopback and loopback):
        raise UrlRefused("url must start with https://")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return WebhookTarget(url=url, scheme=scheme, host=host, port=port, target=target, address=addresses[0])
