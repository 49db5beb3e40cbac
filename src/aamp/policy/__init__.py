"""Policies: the five boundaries of a sandbox (egress, services, image, data, lifetime), and
what a policy is written in — sizes and durations, the host and rule grammar, address classes,
the resources a sandbox may use — read the way every document a person writes is read
(`document.py`, `source.py`). Depends on nothing but its own types.

Names load on first use (`aamp.surface`): reading a YAML file loads no validator.
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    addresses: AddressKind IPAddress classify unwrap
    document: DOCUMENT Problem distinct problems text validate
    hosts: DEFAULTS LOOPBACK_IS_THE_SANDBOX Default Host HostError HostPattern normalize_host
        parse_port split_host_port this_machine
    model: DEFAULT_IDLE_SECONDS DEFAULT_TTL_SECONDS IMAGE_RE MAX_TTL_SECONDS NAME_RE SERVICE_RE
        DataPolicy DataRule EgressPolicy Lifetime OutboundRule Policy PolicyError file_type
        parse_policy policy_from_dict
    resources: Resources
    source: load_json load_yaml
    units: GiB MiB parse_duration parse_size
    """,
)
