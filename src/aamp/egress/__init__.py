"""The egress boundary: rules applied, host-side resolution, the proxy, the ledger,
credential injection for services (installation CA, TLS interception, scrubbing), a watched
sandbox's latest egress events in memory (`recent`: what the proxy refused during one tool
call), and the host's own checked connections to URLs an admin registered (model endpoints:
`registered`).

How a rule and a host are written, and what class of place an address is, belong to the
policy (`aamp.policy.hosts`, `aamp.policy.addresses`). Names load on first use
(`aamp.surface`): the CLI reading the CA certificate loads no proxy.
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    approvals: Answer Approver
    ca: LEAF_BACKDATE InstallationCA LeafCache LeafRefused LeafSource ca_cert_path ca_dir
        given_ca_cert_path leaf_context load_pem_chain san_for
    intercept: tls_server_name
    installation: InstallationListeners Listener announce listeners_dir
    ledger: EVENT_DECISIONS EVENT_KINDS AuditEgressSink EgressEvent EgressSink JsonLinesSink
    proxy: EgressContext EgressProxy EgressStats
    recent: KEPT_PER_SANDBOX EgressView RecentEgress RecentView
    registered: AddressVerdict CheckedTransport ConnectionRefused RegisteredUrl UrlError
        resolve_and_check
    resolver: DnsServerResolver ResolveError Resolver StaticResolver SystemResolver
        egress_resolver
    rules: EgressRules
    services: Auth Basic Bearer Header SecretReader Service ServiceError ServiceSet
        VaultSecretReader
    """,
)
