"""What kind of place an IP address is, and which spellings of a host are IP literals.

Two jobs, both about not being fooled:

- `parse_ip_literal` recognises every spelling that a C library, a browser or curl would turn
  into an IPv4 address — `2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1` — following the WHATWG
  URL rule: a host whose last label is a number *is* an IPv4 address (or is invalid); it is never
  a name to resolve. IPv6 literals come in brackets; zone ids (`%eth0`) are refused.
- `classify` says whether an address is an ordinary public destination or one of the places a
  sandbox must not reach without a rule naming that exact host: loopback, RFC 1918 private,
  CGNAT, ULA, link-local, multicast, unspecified, reserved/documentation, cloud metadata.
  IPv6 forms that carry an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64) are unwrapped
  first and judged by the IPv4 address inside, since that is where the packets would go.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressKind(enum.Enum):
    PUBLIC = "public"
    LOOPBACK = "loopback"
    PRIVATE = "private"
    CGNAT = "cgnat"
    ULA = "unique-local"
    LINK_LOCAL = "link-local"
    MULTICAST = "multicast"
    UNSPECIFIED = "unspecified"
    BROADCAST = "broadcast"
    RESERVED = "reserved"
    METADATA = "metadata"


# Cloud and platform metadata / control endpoints. Several sit inside ranges that are refused
# anyway; they are named so the ledger says "metadata", and a few (Azure's WireServer, Alibaba's
# 100.100.100.200) would otherwise look public or merely CGNAT.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure IMDS, OpenStack, DigitalOcean, Oracle
        "169.254.169.253",  # AWS VPC DNS
        "169.254.169.123",  # AWS time sync
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.170.23",  # AWS EKS pod identity
        "169.254.0.23",  # Tencent Cloud
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud (legacy)
        "168.63.129.16",  # Azure WireServer
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::253",  # AWS VPC DNS over IPv6
        "fd00:ec2::123",  # AWS time sync over IPv6
        "fd00:ec2::23",  # AWS EKS pod identity over IPv6
    )
)

_N = ipaddress.ip_network
# Order matters only for the label; every listed range is refused.
_V4_RANGES: tuple[tuple[ipaddress.IPv4Network, AddressKind], ...] = (
    (_N("0.0.0.0/8"), AddressKind.UNSPECIFIED),
    (_N("127.0.0.0/8"), AddressKind.LOOPBACK),
    (_N("10.0.0.0/8"), AddressKind.PRIVATE),
    (_N("172.16.0.0/12"), AddressKind.PRIVATE),
    (_N("192.168.0.0/16"), AddressKind.PRIVATE),
    (_N("100.64.0.0/10"), AddressKind.CGNAT),
    (_N("169.254.0.0/16"), AddressKind.LINK_LOCAL),
    (_N("224.0.0.0/4"), AddressKind.MULTICAST),
    (_N("255.255.255.255/32"), AddressKind.BROADCAST),
    (_N("240.0.0.0/4"), AddressKind.RESERVED),
    (_N("192.0.0.0/24"), AddressKind.RESERVED),  # IETF protocol assignments
    (_N("192.0.2.0/24"), AddressKind.RESERVED),  # TEST-NET-1
    (_N("198.51.100.0/24"), AddressKind.RESERVED),  # TEST-NET-2
    (_N("203.0.113.0/24"), AddressKind.RESERVED),  # TEST-NET-3
    (_N("198.18.0.0/15"), AddressKind.RESERVED),  # benchmarking
    (_N("192.88.99.0/24"), AddressKind.RESERVED),  # 6to4 relay anycast
)
_V6_RANGES: tuple[tuple[ipaddress.IPv6Network, AddressKind], ...] = (
    (_N("::/128"), AddressKind.UNSPECIFIED),
    (_N("::1/128"), AddressKind.LOOPBACK),
    (_N("fc00::/7"), AddressKind.ULA),
    (_N("fe80::/10"), AddressKind.LINK_LOCAL),
    (_N("fec0::/10"), AddressKind.PRIVATE),  # deprecated site-local
    (_N("ff00::/8"), AddressKind.MULTICAST),
    (_N("::/8"), AddressKind.RESERVED),  # remaining IETF-reserved low block
    (_N("100::/64"), AddressKind.RESERVED),  # discard-only
    (_N("64:ff9b:1::/48"), AddressKind.PRIVATE),  # local-use NAT64
    (_N("2001::/23"), AddressKind.RESERVED),  # IETF protocol assignments incl. Teredo
    (_N("2001:db8::/32"), AddressKind.RESERVED),  # documentation
    (_N("2002::/16"), AddressKind.RESERVED),  # 6to4: tunnels to an embedded IPv4
    (_N("3fff::/20"), AddressKind.RESERVED),  # documentation (RFC 9637)
)
_NAT64 = _N("64:ff9b::/96")
_V4_COMPAT = _N("::/96")


@dataclass(frozen=True)
class AddressClass:
    """The verdict on one address: `address` as resolved, `effective` the IPv4 address inside an
    IPv4-carrying IPv6 form (else the same), and its `kind`."""

    address: IPAddress
    effective: IPAddress
    kind: AddressKind

    @property
    def public(self) -> bool:
        return self.kind is AddressKind.PUBLIC

    def describe(self) -> str:
        inner = f" (carries {self.effective})" if self.effective != self.address else ""
        article = "an" if self.kind.value[0] in "aeiou" else "a"
        return f"{self.address}{inner} is {article} {self.kind.value} address"


def unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address would deliver to, if it carries one."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address in _V4_COMPAT and int(address) > 1:  # :: and ::1 are not IPv4-compatible
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def classify(address: IPAddress | str) -> AddressClass:
    """Say what kind of destination `address` is (after unwrapping IPv4-in-IPv6)."""
    original = ipaddress.ip_address(address) if isinstance(address, str) else address
    effective = unwrap(original)
    for candidate in (original, effective):
        if candidate in METADATA_ADDRESSES:
            return AddressClass(original, effective, AddressKind.METADATA)
    ranges = _V4_RANGES if isinstance(effective, ipaddress.IPv4Address) else _V6_RANGES
    for network, kind in ranges:
        if effective in network:
            return AddressClass(original, effective, kind)
    if isinstance(effective, ipaddress.IPv6Address) and not effective.is_global:
        return AddressClass(original, effective, AddressKind.RESERVED)
    return AddressClass(original, effective, AddressKind.PUBLIC)


class NotAnAddress(ValueError):
    """The host looks like an IP literal (it ends in a number) but is not a valid one."""


_NUMBER_RE = re.compile(r"^(?:0[xX][0-9a-fA-F]*|[0-9]+)\Z")


def _ends_in_number(host: str) -> bool:
    labels = host.split(".")
    if labels and labels[-1] == "":
        labels = labels[:-1]
    return bool(labels) and bool(_NUMBER_RE.match(labels[-1]))


def _ipv4_part(part: str) -> int:
    if part[:2] in ("0x", "0X"):
        digits = part[2:]
        return int(digits, 16) if digits else 0
    if len(part) > 1 and part.startswith("0"):
        if not re.fullmatch(r"[0-7]+", part):
            raise NotAnAddress(f"{part!r} is not an octal number")
        return int(part, 8)
    if not part.isdigit():
        raise NotAnAddress(f"{part!r} is not a number")
    return int(part)


def _parse_ipv4_any_form(host: str) -> ipaddress.IPv4Address:
    parts = host.split(".")
    if parts[-1] == "":
        parts = parts[:-1]  # one trailing dot, as in a fully-qualified name
    if not 1 <= len(parts) <= 4 or any(p == "" for p in parts):
        raise NotAnAddress(f"{host!r} ends in a number but is not an IPv4 address")
    numbers = [_ipv4_part(p) for p in parts]
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        raise NotAnAddress(f"{host!r} ends in a number but is out of the IPv4 range")
    value = last
    for index, number in enumerate(head):
        value += number << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address `host` denotes if it is an IP literal in any spelling, else None.

    `[v6]` (brackets) and bare IPv6 are both accepted here; callers that parse `host:port`
    strip brackets first. Raises `NotAnAddress` for hosts that must be an address but are not a
    valid one (`1.2.3.4.5`, `999.1.1.1`, `[::1%eth0]`), so they are never resolved as names.
    """
    if host.startswith("[") or ":" in host:
        inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if "%" in inner:
            raise NotAnAddress(f"IPv6 zone ids are not accepted: {host!r}")
        try:
            return ipaddress.IPv6Address(inner)
        except ValueError:
            raise NotAnAddress(f"{host!r} is not a valid IPv6 address") from None
    if _ends_in_number(host):
        return _parse_ipv4_any_form(host)
    return None
