"""The egress boundary: rules applied, host-side resolution, the proxy, the ledger,
credential injection for services (installation CA, TLS interception, scrubbing), and the
host's own checked connections to URLs an admin registered (model endpoints: `registered`).

How a rule and a host are written, and what class of place an address is, belong to the
policy (`aamp.policy.hosts`, `aamp.policy.addresses`). Import from the modules themselves
(`aamp.egress.proxy`, `aamp.egress.rules`, ...): this package imports nothing.
"""
