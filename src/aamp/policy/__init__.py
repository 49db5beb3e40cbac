"""Policies: the five boundaries of a sandbox (egress, services, image, data, lifetime)."""

from aamp.policy.model import (
    DataPolicy,
    DataRule,
    EgressPolicy,
    Lifetime,
    Policy,
    PolicyError,
    PolicyResources,
    parse_policy,
    policy_from_dict,
)
from aamp.policy.units import parse_duration, parse_size

__all__ = [
    "DataPolicy",
    "DataRule",
    "EgressPolicy",
    "Lifetime",
    "Policy",
    "PolicyError",
    "PolicyResources",
    "parse_duration",
    "parse_policy",
    "parse_size",
    "policy_from_dict",
]
