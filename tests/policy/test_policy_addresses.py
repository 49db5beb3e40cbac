from __future__ import annotations

import ipaddress

import pytest

from aamp.policy.addresses import AddressKind, NotAnAddress, classify, parse_ip_literal


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("1.1.1.1", AddressKind.PUBLIC),
        ("2606:4700:4700::1111", AddressKind.PUBLIC),
        ("127.0.0.1", AddressKind.LOOPBACK),
        ("127.255.0.2", AddressKind.LOOPBACK),
        ("::1", AddressKind.LOOPBACK),
        ("10.0.0.5", AddressKind.PRIVATE),
        ("172.16.0.1", AddressKind.PRIVATE),
        ("172.31.255.255", AddressKind.PRIVATE),
        ("192.168.0.1", AddressKind.PRIVATE),
        ("100.64.0.1", AddressKind.CGNAT),
        ("100.127.255.254", AddressKind.CGNAT),
        ("fc00::1", AddressKind.ULA),
        ("fd12:3456::1", AddressKind.ULA),
        ("169.254.1.1", AddressKind.LINK_LOCAL),
        ("fe80::1", AddressKind.LINK_LOCAL),
        ("224.0.0.1", AddressKind.MULTICAST),
        ("ff02::1", AddressKind.MULTICAST),
        ("0.0.0.0", AddressKind.UNSPECIFIED),
        ("::", AddressKind.UNSPECIFIED),
        ("255.255.255.255", AddressKind.BROADCAST),
        ("240.0.0.1", AddressKind.RESERVED),
        ("192.0.2.1", AddressKind.RESERVED),
        ("2001:db8::1", AddressKind.RESERVED),
        ("2002:7f00:1::", AddressKind.RESERVED),
        ("169.254.169.254", AddressKind.METADATA),
        ("fd00:ec2::254", AddressKind.METADATA),
        ("100.100.100.200", AddressKind.METADATA),
        ("168.63.129.16", AddressKind.METADATA),
        ("::ffff:169.254.169.254", AddressKind.METADATA),  # IPv4-mapped, unwrapped
        ("::ffff:127.0.0.1", AddressKind.LOOPBACK),
        ("::ffff:10.1.1.1", AddressKind.PRIVATE),
        ("::10.1.1.1", AddressKind.PRIVATE),  # IPv4-compatible
        ("64:ff9b::a9fe:a9fe", AddressKind.METADATA),  # NAT64 of 169.254.169.254
        ("::ffff:1.1.1.1", AddressKind.PUBLIC),
    ],
)
def test_classify(address, kind):
    assert classify(address).kind is kind
    assert classify(ipaddress.ip_address(address)).public is (kind is AddressKind.PUBLIC)


def test_unwrapped_address_is_reported():
    verdict = classify("::ffff:169.254.169.254")
    assert str(verdict.effective) == "169.254.169.254"
    assert "carries 169.254.169.254" in verdict.describe()


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0X7F.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("169.254.43518", "169.254.169.254"),
        ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
        ("1.1.1.1.", "1.1.1.1"),
        ("0", "0.0.0.0"),
        ("[::1]", "::1"),
        ("::ffff:7f00:1", "::ffff:7f00:1"),
    ],
)
def test_non_canonical_ipv4_forms_are_ip_literals(text, address):
    assert parse_ip_literal(text) == ipaddress.ip_address(address)


@pytest.mark.parametrize(
    "text", ["1.2.3.4.5", "256.1.1.1", "08.1.1.1", "1..1", "[fe80::1%lo]", "4294967296"]
)
def test_things_that_must_be_addresses_but_are_not(text):
    with pytest.raises(NotAnAddress):
        parse_ip_literal(text)


@pytest.mark.parametrize("text", ["a.test", "0x1g", "1e3.com", "0x.test", "127.0.0.1.nip.io"])
def test_names_are_not_literals(text):
    assert parse_ip_literal(text) is None
