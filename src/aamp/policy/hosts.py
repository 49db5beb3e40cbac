"""How a rule and a destination host are written: one canonical spelling for every host.

A destination is a host and a port. Before any rule is consulted the host is brought to one
canonical spelling, so that no two spellings of one place can be judged differently:

- IDNA: Unicode names are mapped (UTS #46, non-transitional) and encoded to their A-label
  (punycode) form; `xn--` labels must decode and re-encode to themselves; everything is
  lower-cased; one trailing dot (`a.test.`) is dropped.
- Refused outright: whitespace, control characters and NUL, percent-encoding, userinfo (`@`),
  path or query characters, empty labels, over-long labels or names, IPv6 zone ids, and
  any host that ends in a number but is not a valid IPv4 address.
- Hosts that are IP literals in any spelling (`2130706433`, `0x7f.1`, `[::ffff:7f00:1]`) become
  the address they denote and are only ever matched by a rule that names that address.

Rules (`HostPattern`) are `host`, `*.suffix` or an IP (`10.0.0.5`, `[fd00::1]`), each with an
optional `:port`. Wildcards and the bare suffix: an *allow* rule `*.corp.example` matches any
name below `corp.example` (any depth) but not `corp.example` itself; a *deny* rule
`*.pastebin.com` matches the names below it AND `pastebin.com` itself. The spelling is
ambiguous in the wild (TLS wildcards exclude the apex, Squid's `.domain` includes it); we read
it, in each list, the way that refuses more. To allow the apex as well, list it:
`["corp.example", "*.corp.example"]`. How the rules are applied is `aamp.egress.rules`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import idna

from aamp.policy.addresses import AddressKind, IPAddress, NotAnAddress, classify, parse_ip_literal

Default = Literal["allow", "block", "ask"]
DEFAULTS = ("block", "allow", "ask")
_MAX_NAME = 253
_MAX_LABEL = 63
_ASCII_HOST_RE = re.compile(r"^[a-z0-9._-]+\Z")
_PORT_RE = re.compile(r"^[1-9][0-9]{0,4}\Z")
_FORBIDDEN_EXPLAINED = {
    "%": "percent-encoding is not accepted in a host",
    "@": "userinfo (user@host) is not accepted in a host",
    "/": "a host cannot contain '/'",
    "\\": "a host cannot contain '\\'",
    "?": "a host cannot contain '?'",
    "#": "a host cannot contain '#'",
    "*": "'*' is only allowed as the first label of a rule",
}


# Why a policy cannot name loopback, and why the proxy refuses a request for it.
LOOPBACK_IS_THE_SANDBOX = (
    "inside a sandbox, loopback always means the sandbox itself (its programs reach "
    "localhost and 127.0.0.1 directly, never through the proxy)"
)


def this_machine(name: str, ip: IPAddress | None, *, shown: str | None = None) -> str | None:
    """How a canonical host (`name`, or `ip` for a literal) names "this machine" — a loopback
    name (RFC 6761: `localhost` and the names below it), a loopback or unspecified address —
    in words, or None if it does not. `shown` is how to write the host in those words."""
    if ip is not None:
        verdict = classify(ip)
        if verdict.kind in (AddressKind.LOOPBACK, AddressKind.UNSPECIFIED):
            return verdict.describe()
        return None
    if name == "localhost" or name.endswith(".localhost"):
        return f"{shown or name} is a loopback name"
    return None


class HostError(ValueError):
    """A host or rule that cannot name a destination; the message says why."""


@dataclass(frozen=True)
class Host:
    """A destination host in its one canonical spelling: an A-label name, or an IP address."""

    name: str
    ip: IPAddress | None = None

    def __str__(self) -> str:
        if self.ip is not None and self.ip.version == 6:
            return f"[{self.ip}]"
        return self.name


def _show(raw: str) -> str:
    """A safe, short rendering of untrusted text for messages (no control bytes)."""
    text = raw if len(raw) <= 80 else raw[:77] + "..."
    return ascii(text)


def _check_chars(raw: str) -> None:
    for ch in raw:
        if ch == "\x00":
            raise HostError(f"NUL byte in host {_show(raw)}")
        if ord(ch) < 0x21 or ord(ch) == 0x7F or ch in "\u0085\u00a0\u2028\u2029":
            raise HostError(f"whitespace or control character in host {_show(raw)}")
        if ch in _FORBIDDEN_EXPLAINED:
            raise HostError(f"{_FORBIDDEN_EXPLAINED[ch]}: {_show(raw)}")


def _canonical_label(label: str, raw: str) -> str:
    if not label:
        raise HostError(f"empty label in host {_show(raw)}")
    if len(label) > _MAX_LABEL:
        raise HostError(f"a label longer than {_MAX_LABEL} characters in {_show(raw)}")
    if label.startswith("xn--"):
        try:
            again = idna.encode(idna.decode(label)).decode("ascii")
        except (idna.IDNAError, UnicodeError) as exc:
            raise HostError(f"{label!r} is not a valid punycode label: {exc}") from None
        if again != label:
            raise HostError(f"{label!r} is not the canonical punycode spelling ({again!r})")
    return label


def normalize_host(raw: str) -> Host:
    """The canonical `Host` for `raw` (no port), or `HostError` saying why it is refused."""
    if not isinstance(raw, str):
        raise HostError(f"a host must be text, got {type(raw).__name__}")
    if raw == "":
        raise HostError("empty host")
    if len(raw) > 2 * _MAX_NAME:
        raise HostError(f"host too long ({len(raw)} characters)")
    if raw.startswith("["):
        if not raw.endswith("]") or raw.count("[") != 1 or raw.count("]") != 1:
            raise HostError(f"unbalanced brackets in host {_show(raw)}")
        if "%" in raw:
            raise HostError(f"IPv6 zone ids are not accepted: {_show(raw)}")
        _check_chars(raw[1:-1].replace(":", ""))
        try:
            address = parse_ip_literal(raw)
        except NotAnAddress as exc:
            raise HostError(str(exc)) from None
        if address is None or address.version != 6:
            raise HostError(f"only IPv6 addresses go in brackets: {_show(raw)}")
        return Host(str(address), address)
    _check_chars(raw)
    if ":" in raw:
        raise HostError(f"an IPv6 address must be written in brackets: {_show(raw)}")
    if raw.isascii():
        text = raw.lower()
    else:
        try:
            text = idna.encode(raw, uts46=True, transitional=False, std3_rules=True).decode()
        except (idna.IDNAError, UnicodeError) as exc:
            raise HostError(f"{_show(raw)} is not a valid internationalised name: {exc}") from None
        _check_chars(text)
    if text.endswith("."):
        text = text[:-1]
    if not _ASCII_HOST_RE.match(text or "-"):
        raise HostError(f"a host may only contain letters, digits, '.', '-' and '_': {_show(raw)}")
    try:
        address = parse_ip_literal(text)
    except NotAnAddress as exc:
        raise HostError(str(exc)) from None
    if address is not None:
        return Host(str(address), address)
    labels = [_canonical_label(label, raw) for label in text.split(".")]
    name = ".".join(labels)
    if len(name) > _MAX_NAME:
        raise HostError(f"host name longer than {_MAX_NAME} characters")
    return Host(name)


def parse_port(text: str) -> int:
    """A TCP port from its decimal text: 1..65535, digits only, no sign or leading zero."""
    if not _PORT_RE.match(text) or int(text) > 65535:
        raise HostError(f"invalid port {_show(text)}: expected 1..65535")
    return int(text)


def split_host_port(text: str) -> tuple[str, str | None]:
    """`host[:port]` / `[v6][:port]` → (host, port text or None). No normalisation."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise HostError(f"unbalanced brackets in {_show(text)}")
        rest = text[end + 1 :]
        if rest == "":
            return text, None
        if not rest.startswith(":"):
            raise HostError(f"unexpected text after ']' in {_show(text)}")
        return text[: end + 1], rest[1:]
    if text.count(":") > 1:
        raise HostError(f"an IPv6 address must be written in brackets: {_show(text)}")
    if ":" in text:
        host, port = text.split(":")
        return host, port
    return text, None


@dataclass(frozen=True)
class HostPattern:
    """One rule: an exact host, a `*.suffix` wildcard, or an exact IP; optional port."""

    text: str
    host: str  # canonical host; for a wildcard, the suffix without "*."
    wildcard: bool = False
    ip: IPAddress | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        if not isinstance(text, str):
            raise HostError(f"a rule must be text, got {type(text).__name__}")
        if text != text.strip() or text == "":
            raise HostError(f"a rule cannot be empty or have surrounding spaces: {_show(text)}")
        host_text, port_text = split_host_port(text)
        port = parse_port(port_text) if port_text is not None else None
        if host_text.startswith("*."):
            host = normalize_host(host_text[2:])
            if host.ip is not None:
                raise HostError(f"a wildcard cannot cover IP addresses: {_show(text)}")
            return cls(text, host.name, wildcard=True, port=port)
        host = normalize_host(host_text)
        if host.ip is not None and host.ip.version == 4 and host_text.rstrip(".") != host.name:
            raise HostError(f"write the address as {host.name}, not {_show(host_text)}")
        return cls(text, host.name, ip=host.ip, port=port)

    @property
    def canonical(self) -> str:
        """The rule in canonical ASCII (A-labels, lower case), as logs and headers show it."""
        host = f"[{self.ip}]" if self.ip is not None and self.ip.version == 6 else self.host
        text = f"*.{host}" if self.wildcard else host
        return text if self.port is None else f"{text}:{self.port}"

    def matches(self, host: Host, port: int, *, include_apex: bool = False) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.ip is not None or host.ip is not None:
            return self.ip is not None and host.ip is not None and self.ip == host.ip
        if self.wildcard:
            if host.name.endswith("." + self.host):
                return True
            return include_apex and host.name == self.host
        return host.name == self.host
