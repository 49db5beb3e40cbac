"""Which `Host` and `Origin` `/mcp` answers: its guard against DNS rebinding.

A page on another site that gets a browser to reach the control plane under a name of its
own (DNS rebinding) sends that name as `Host`; a page's request also carries its `Origin`.
`/mcp` answers only the names it is told are its own: `AAMP_MCP_ALLOWED_HOSTS`, a
comma-separated list of `Host` values — `name`, `name:port`, or `name:*` for any port —
such as the name a reverse proxy in front of it is reached by. Without it, only the loopback
names (127.0.0.1, localhost, [::1], any port) and the address `aamp up` listens on (unless
that is a wildcard such as 0.0.0.0) are answered. An `Origin`, when a request has one, must
be `http://` or `https://` followed by an allowed host. (The API has no such list: its pages
check `Origin` against the request's own `Host`.)
"""

from __future__ import annotations

import re
from typing import NamedTuple

from aamp.config import ConfigError, Settings

HOSTS_ENV = "AAMP_MCP_ALLOWED_HOSTS"
LOOPBACK = ("127.0.0.1:*", "localhost:*", "[::1]:*")
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::", "[::]")
# A Host header value: a name or IPv4 address, or a bracketed IPv6 one; then a port or `*`.
HOST_RE = re.compile(
    r"^(?:[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?|\[[0-9a-f:.]+\])(?::(?:[0-9]{1,5}|\*))?\Z"
)


def allowed_hosts(settings: Settings) -> tuple[str, ...]:
    """The `Host` values `/mcp` answers (lower case), from `AAMP_MCP_ALLOWED_HOSTS` or the
    default; a value that is not a host[:port] is a `ConfigError` naming the setting."""
    given = settings.env.get(HOSTS_ENV, "").strip()
    if not given:
        own = settings.listen_host.lower()
        if own in WILDCARD_ADDRESSES:
            return LOOPBACK
        if ":" in own and not own.startswith("["):
            own = f"[{own}]"  # an IPv6 address, as a Host header writes it
        return (*LOOPBACK, f"{own}:{settings.listen_port}")
    hosts = tuple(h.strip().lower() for h in given.split(","))
    for host in hosts:
        if not HOST_RE.match(host):
            raise ConfigError(
                f"{HOSTS_ENV}: {host!r} is not a host as a Host header names it "
                "(name, name:port or name:*, e.g. aamp.example.com, without http://)"
            )
    return hosts


def host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """Whether `host` is one of `allowed` (`name:*`: the name with any port, or none)."""
    host = host.lower()
    name, _, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    for entry in allowed:
        if host == entry:
            return True
        if entry.endswith(":*") and entry[:-2] in (host, name if port.isdigit() else None):
            return True
    return False


def refusal(host: str | None, origin: str | None, allowed: tuple[str, ...]) -> Refusal | None:
    """Why a request's `Host` (421) or `Origin` (403) is not answered at `/mcp`, or None."""
    if not host or not host_allowed(host, allowed):
        return Refusal(
            421,
            "host_not_allowed",
            f"/mcp does not answer to the host {(host or '')[:200]!r}: it is not in "
            f"{HOSTS_ENV} ({', '.join(allowed)})",
        )
    if origin is None:
        return None
    scheme, sep, rest = origin.partition("://")
    if sep and scheme.lower() in ("http", "https") and host_allowed(rest, allowed):
        return None
    return Refusal(
        403,
        "origin_not_allowed",
        f"/mcp does not answer a page of the origin {origin[:200]!r}: its host is not in "
        f"{HOSTS_ENV} ({', '.join(allowed)})",
    )


class Refusal(NamedTuple):
    status: int
    code: str
    message: str
