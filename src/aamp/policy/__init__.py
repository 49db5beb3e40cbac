"""Policies: the five boundaries of a sandbox (egress, services, image, data, lifetime)."""

from aamp.policy.model import (
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
    "DataPolicy",
    "DataRule",
    "EgressPolicy",
    "GiB",
    "Lifetime",
    "MiB",
    "Policy",
    "PolicyError",
    "Resources",
    "parse_duration",
    "parse_policy",
    "parse_size",
    "policy_from_dict",
]
