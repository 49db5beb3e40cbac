"""Policies: the five boundaries of a sandbox (egress, services, image, data, lifetime), and
what a policy is written in — sizes and durations, the host and rule grammar, address classes,
the resources a sandbox may use. Depends on nothing but its own types.
"""

from aamp.policy.addresses import AddressKind, IPAddress, classify, unwrap
from aamp.policy.hosts import (
    DEFAULTS,
    LOOPBACK_IS_THE_SANDBOX,
    Default,
    Host,
    HostError,
    HostPattern,
    normalize_host,
    parse_port,
    split_host_port,
    this_machine,
)
from aamp.policy.model import (
    IMAGE_RE,
    NAME_RE,
    SERVICE_RE,
    DataPolicy,
    DataRule,
    EgressPolicy,
    Lifetime,
    Policy,
    PolicyError,
    parse_policy,
    policy_from_dict,
)
from aamp.policy.resources import Resources
from aamp.policy.units import GiB, MiB, parse_duration, parse_size

__all__ = [
    "DEFAULTS",
    "IMAGE_RE",
    "LOOPBACK_IS_THE_SANDBOX",
    "NAME_RE",
    "SERVICE_RE",
    "AddressKind",
    "DataPolicy",
    "DataRule",
    "Default",
    "EgressPolicy",
    "GiB",
    "Host",
    "HostError",
    "HostPattern",
    "IPAddress",
    "Lifetime",
    "MiB",
    "Policy",
    "PolicyError",
    "Resources",
    "classify",
    "normalize_host",
    "parse_duration",
    "parse_policy",
    "parse_port",
    "parse_size",
    "policy_from_dict",
    "split_host_port",
    "this_machine",
    "unwrap",
]
