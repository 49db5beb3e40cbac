"""The egress boundary: rules, address classes, host-side resolution, the proxy, the ledger,
credential injection for services (installation CA, TLS interception, scrubbing), and the
host's own checked connections to URLs an admin registered (model endpoints: `registered`).

Import from the modules themselves (`aamp.egress.proxy`, `aamp.egress.rules`, ...): this
package imports nothing, so that `aamp.policy` can use the rules without pulling in the proxy.
"""
