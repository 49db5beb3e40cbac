"""The egress boundary: rules, address classes, host-side resolution, the proxy, the ledger,
and credential injection for services (installation CA, TLS interception, scrubbing)."""

from aamp.egress.addresses import AddressKind, classify, parse_ip_literal
from aamp.egress.ca import CAError, InstallationCA, ca_cert_path
from aamp.egress.intercept import upstream_tls_context
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
from aamp.egress.services import (
    Basic,
    Bearer,
    Header,
    SecretReader,
    Service,
    ServiceError,
    ServiceSet,
    VaultSecretReader,
    auth_from_dict,
)

__all__ = [
    "AddressKind",
    "Basic",
    "Bearer",
    "CAError",
    "Decision",
    "DnsServerResolver",
    "EgressEvent",
    "EgressProxy",
    "EgressRules",
    "EgressSink",
    "EgressStats",
    "Header",
    "HostError",
    "HostPattern",
    "InstallationCA",
    "JsonLinesSink",
    "ProxyLimits",
    "ResolveError",
    "Resolver",
    "SecretReader",
    "Service",
    "ServiceError",
    "ServiceSet",
    "StaticResolver",
    "SystemResolver",
    "VaultSecretReader",
    "auth_from_dict",
    "ca_cert_path",
    "classify",
    "normalize_host",
    "parse_ip_literal",
    "upstream_tls_context",
]
