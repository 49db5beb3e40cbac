"""The egress boundary: rules, address classes, host-side resolution, the proxy, the ledger,
and credential injection for services (installation CA, TLS interception, scrubbing).

Import from the modules themselves (`aamp.egress.proxy`, `aamp.egress.rules`, ...): this
package imports nothing, so that `aamp.policy` can use the rules without pulling in the proxy.
"""
