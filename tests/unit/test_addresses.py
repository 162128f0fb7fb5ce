"""Where a webhook may be sent, judged against the IANA IPv4 and IPv6 Special-Purpose Address Registries as they
are published (written out again here, independently of the service's own table): every block whose "Globally
Reachable" is False is refused at its first, middle and last address, on every Python patch level; the
globally reachable exceptions inside those blocks, and public addresses, are accepted; the forms that carry an
IPv4 address are judged by that address. A refused host name never echoes what it resolved to."""

from __future__ import annotations

import ipaddress

import pytest

from batchinfer.addresses import UrlRefused, check_url, forbidden

# (block, a word the refusal names) for every registry entry whose "Globally Reachable" is False.
NOT_GLOBALLY_REACHABLE = [
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/29", "service continuity"),
    ("192.0.0.8/32", "dummy"),
    ("192.0.0.170/32", "NAT64/DNS64"),
    ("192.0.0.171/32", "NAT64/DNS64"),
    ("192.0.2.0/24", "documentation"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "broadcast"),
    ("::1/128", "loopback"),
    ("::/128", "unspecified"),
    ("::ffff:0:0/96", "IPv4-mapped"),
    ("64:ff9b:1::/48", "NAT64"),
    ("100::/64", "discard-only"),
    ("100:0:0:1::/64", "dummy"),
    ("2001::/32", "Teredo"),
    ("2001:2::/48", "benchmarking"),
    ("2001:10::/28", "ORCHID"),
    ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "SRv6"),
    ("fc00::/7", "unique-local"),
    ("fe80::/10", "link-local"),
]
# 192.0.0.0/24 and 2001::/23 as a whole, at addresses no more specific entry holds.
IETF_PROTOCOL_ASSIGNMENTS = ["192.0.0.11", "192.0.0.100", "192.0.0.255", "2001:1::4", "2001:5::1", "2001:1ff::1"]
# Globally reachable entries inside a refused block, and public addresses of each family.
ACCEPTED = ["192.0.0.9", "192.0.0.10", "192.31.196.1", "192.52.193.1", "192.175.48.1", "2001:1::1", "2001:1::2",
            "2001:1::3", "2001:3::1", "2001:4:112::1", "2001:20::1", "2001:30::1", "2620:4f:8000::1",
            "93.184.216.34", "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2a00:1450:4001::1"]


# Single addresses inside a listed block that the registry lists again on their own, under another name.
NAMED_ON_THEIR_OWN = {"0.0.0.0": "unspecified", "255.255.255.255": "broadcast"}


def _first_middle_last(block: str) -> list[str]:
    net = ipaddress.ip_network(block)
    return list(dict.fromkeys(str(ip) for ip in (
        net.network_address, net.network_address + net.num_addresses // 2, net.broadcast_address)))


@pytest.mark.parametrize(("block", "named"), NOT_GLOBALLY_REACHABLE, ids=[b for b, _ in NOT_GLOBALLY_REACHABLE])
def test_every_block_that_is_not_globally_reachable_is_refused_and_named(block, named):
    for address in _first_middle_last(block):
        reason = forbidden(address)
        assert reason is not None, address
        assert NAMED_ON_THEIR_OWN.get(address, named).lower() in reason.lower(), (address, reason)


@pytest.mark.parametrize("address", IETF_PROTOCOL_ASSIGNMENTS)
def test_ietf_protocol_assignments_outside_their_exceptions_are_refused(address):
    assert forbidden(address) is not None


@pytest.mark.parametrize("address", ACCEPTED)
def test_globally_reachable_addresses_are_accepted(address):
    assert forbidden(address) is None


@pytest.mark.parametrize(("address", "named"), [
    ("64:ff9b::a9fe:a9fe", "NAT64 form of 169.254.169.254"),
    ("64:ff9b::c000:201", "NAT64 form of 192.0.2.1, a documentation"),
    ("64:ff9b::c612:1", "NAT64 form of 198.18.0.1, a benchmarking"),
    ("2002:c0a8:101::1", "6to4 form of 192.168.1.1, a private"),
    ("2002:6440:1::1", "6to4 form of 100.64.0.1, a shared"),
    ("2002:f000:1::1", "6to4 form of 240.0.0.1, a reserved"),
    ("::ffff:10.0.0.1", "IPv4-mapped form of 10.0.0.1"),
    ("224.0.0.251", "multicast"),
    ("ff02::1", "multicast"),
    ("fec0::1", "not a global unicast"),
    ("4000::1", "not a global unicast"),
])
def test_forms_that_carry_an_ipv4_address_are_judged_by_it(address, named):
    assert named in (forbidden(address) or "")


@pytest.mark.parametrize("address", ["64:ff9b::808:808", "2002:808:808::1"])
def test_nat64_and_6to4_forms_of_a_public_address_are_accepted(address):
    assert forbidden(address) is None


def test_loopback_is_accepted_only_with_the_local_switch():
    assert forbidden("127.0.0.1") == "a loopback address"
    assert forbidden("127.0.0.1", allow_loopback=True) is None
    assert forbidden("::1", allow_loopback=True) is None
    assert forbidden("10.0.0.1", allow_loopback=True) == "a private address"


@pytest.mark.parametrize("answers", [["10.0.0.5"], ["93.184.216.34", "192.168.7.7"], ["198.18.3.4"], []])
def test_a_refused_name_never_echoes_what_it_resolved_to(answers):
    with pytest.raises(UrlRefused) as refused:
        check_url("https://hooks.example.com/x", resolve=lambda host, port: answers)
    message = str(refused.value)
    assert message == "url must reach a public address: the host 'hooks.example.com' does not resolve to a public " \
                      "address"
    for answer in answers:
        assert answer not in message


def test_a_literal_address_is_named_with_its_class():
    with pytest.raises(UrlRefused, match=r"'198\.51\.100\.7' is a documentation address \(TEST-NET-2\)"):
        check_url("https://198.51.100.7/hook", resolve=lambda host, port: [])
    target = check_url("https://hooks.example.com:8443/x?y=1", resolve=lambda host, port: ["93.184.216.34"])
    assert (target.address, target.port, target.target) == ("93.184.216.34", 8443, "/x?y=1")
