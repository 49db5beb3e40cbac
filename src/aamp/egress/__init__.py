"""The egress boundary: rules, address classes, host-side resolution, the proxy, the ledger."""

from aamp.egress.addresses import AddressKind, classify, parse_ip_literal
from aamp.egress.ledger import EgressEvent, EgressSink, JsonLinesSink
from aamp.egress.proxy import EgressProxy, EgressStats, ProxyLimits
from aamp.egress.resolver import (
    DnsServerResolver,
    ResolveError,
    Resolver,
    StaticResolver,
    SystemResolver,
)
from aamp.egress.rules import Decision, EgressRules, HostError, HostPattern, normalize_host

__all__ = [
    "AddressKind",
    "Decision",
    "DnsServerResolver",
    "EgressEvent",
    "EgressProxy",
    "EgressRules",
    "EgressSink",
    "EgressStats",
    "HostError",
    "HostPattern",
    "JsonLinesSink",
    "ProxyLimits",
    "ResolveError",
    "Resolver",
    "StaticResolver",
    "SystemResolver",
    "classify",
    "normalize_host",
    "parse_ip_literal",
]
