"""The policy model: the five boundaries of a sandbox, parsed from YAML into frozen values.

A policy is read whole or not at all: `parse_policy` either returns a complete, validated
`Policy` or raises `PolicyError` listing every problem, each prefixed with the field path
(`egress.allow[2]: ...`, `resources.memory: ...`; see `document.py`, which reads agent
definitions the same way). Unknown keys are errors (a typo such as `egres:` must not silently
drop a boundary), duplicate YAML keys are errors (PyYAML would otherwise keep the last one),
and every omitted section gets the safe default: egress `default: block` with no rules, the
`base` image, no services, no packages, 15 minute ttl, no sandboxes kept warm (`warm: N`).
An egress rule naming loopback (`localhost`, `*.localhost`, 127.0.0.0/8, `::1`) or the
unspecified address is refused: inside a sandbox that is the sandbox itself.

Usage::

    policy = parse_policy(Path("finance.yaml").read_text())
    rules = EgressRules.from_policy(policy.egress)
    spec = SandboxSpec(image=policy.image, resources=policy.resources)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, TypeAdapter, model_validator
from pydantic.dataclasses import dataclass

from aamp.policy.document import DOCUMENT, Problem, distinct, text, validate
from aamp.policy.hosts import (
    DEFAULTS,
    LOOPBACK_IS_THE_SANDBOX,
    Default,
    HostError,
    HostPattern,
    this_machine,
)
from aamp.policy.resources import Resources
from aamp.policy.source import load_yaml
from aamp.policy.units import parse_duration, parse_size

NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?\Z")
SERVICE_RE = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?\Z")
IMAGE_RE = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?\Z")
BUILTIN_IMAGES = ("base", "browser", "docs", "rag")
# A pinned requirement from the offline wheelhouse: `name==version`, nothing else (no URLs,
# no ranges, no extras that could pull something unpinned).
PACKAGE_RE = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[A-Za-z0-9.+!_-]+)\Z"
)
FILE_TYPE_RE = re.compile(r"^[a-z0-9]{1,16}\Z")
MAX_TTL_SECONDS = 24 * 3600
DEFAULT_TTL_SECONDS = 15 * 60
DEFAULT_IDLE_SECONDS = 5 * 60
# A policy's `warm:` (sandboxes kept started ahead of its runs) is at most this; what all
# policies ask for together is bounded by the installation (AAMP_WARM_POOL_MAX).
MAX_WARM = 32


class PolicyError(ValueError):
    """A policy that cannot be used. `problems` holds (field path, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        lines = [f"{path}: {message}" if path else message for path, message in problems]
        super().__init__("invalid policy:\n  " + "\n  ".join(lines))


def _check_rule(text: str) -> str | None:
    try:
        pattern = HostPattern.parse(text)
    except HostError as exc:
        return str(exc)
    what = this_machine(pattern.host, pattern.ip, shown=pattern.canonical)
    if what is not None:
        return (
            f"{what}: {LOOPBACK_IS_THE_SANDBOX}, so a rule cannot point it at the host; to "
            "reach a server on the host or your network, name it by a DNS name that resolves "
            "to it, with its port (e.g. app.internal:8443)"
        )
    return None


def _matching(regex: re.Pattern[str], what: str) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        return None if regex.match(text) else f"{text!r} is not a valid {what}"

    return check


def _check_package(text: str) -> str | None:
    if PACKAGE_RE.match(text):
        return None
    return f"{text!r} must be a pinned requirement 'name==version' (the wheelhouse is offline)"


def _default(value: object) -> Default:
    if value not in DEFAULTS:
        raise ValueError(f"must be one of {', '.join(DEFAULTS)}; got {value!r}")
    return value  # type: ignore[return-value]


def _optional_size(value: object) -> int | None:
    return None if value is None else parse_size(value)


def _approval_threshold(value: object) -> int | None:
    """`approval:` is true (every file), false (never) or a size (above it)."""
    if value is True:
        return 0
    if value is False:
        return None
    if not isinstance(value, int | str):
        raise ValueError(f"expected true, false or a size such as 5MB, got {value!r}")
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ValueError(f"expected true, false or a size such as 5MB: {exc}") from None


def _lifetime(value: object) -> int:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("must be longer than zero")
    if seconds > MAX_TTL_SECONDS:
        raise ValueError(f"must be at most {MAX_TTL_SECONDS // 3600} hours")
    return seconds


def _warm(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be a whole number of sandboxes, got {value!r}")
    if not 0 <= value <= MAX_WARM:
        raise ValueError(f"must be between 0 and {MAX_WARM}, got {value}")
    return value


def _name(value: object) -> str:
    if value is None:
        raise ValueError("is required")
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ValueError(
            f"{value!r} is not a valid name (lower-case letters, digits, '.', '_', '-')"
        )
    return value


def _image(value: object) -> str:
    if not isinstance(value, str) or not IMAGE_RE.match(value):
        raise ValueError(
            f"{value!r} is not a valid image name "
            f"({', '.join(BUILTIN_IMAGES)} or a custom image's name)"
        )
    return value


Size = Annotated[int, BeforeValidator(parse_size)]
LifetimeSeconds = Annotated[int, BeforeValidator(_lifetime)]
Rules = distinct(text(_check_rule))
ServiceNames = distinct(text(_matching(SERVICE_RE, "service name")))
Packages = distinct(text(_check_package))
FileTypes = distinct(text(_matching(FILE_TYPE_RE, "file type")))


@dataclass(frozen=True, config=DOCUMENT)
class EgressPolicy:
    default: Annotated[Default, BeforeValidator(_default)] = "block"
    allow: Rules = ()
    deny: Rules = ()
    max_bytes_out: Annotated[int | None, BeforeValidator(_optional_size)] = None


@dataclass(frozen=True, config=DOCUMENT)
class DataRule:
    """What may come into the sandbox (`data.inbound`), and the base of what may leave it: at
    most `max_bytes` in all, files of these `types` only (none until the policy names them)."""

    max_bytes: Size = 50 * 1000**2
    types: FileTypes = ()

    def refusal(self, rule: str, name: str, size: int | None) -> str | None:
        """Why this rule (`rule`: `data.inbound` or `data.outbound`) refuses one file of that
        name and size (None: not known yet), or None. A file's type is its extension."""
        kind = file_type(name)
        if kind not in self.types:
            allowed = ", ".join(self.types) or "none"
            shown = repr(kind) if kind else "no extension"
            return f"{name!r}: {rule}.types does not allow {shown} (allowed: {allowed})"
        if size is not None and size > self.max_bytes:
            return f"{name!r}: {size} bytes; {rule}.max_bytes is {self.max_bytes} bytes"
        return None


def file_type(name: str) -> str:
    """A file's type as data rules name it: its extension, lower-cased ("" without one)."""
    base = name.rsplit("/", 1)[-1]
    return base.rsplit(".", 1)[-1].lower() if "." in base else ""


@dataclass(frozen=True, config=DOCUMENT)
class OutboundRule(DataRule):
    """`data.outbound`. `approval_over` is where a person must start approving: each file that
    brings the run's output above that many bytes waits for approval. `approval: true` is 0
    (every file), `approval: 5MB` is 5,000,000, `approval: false` is None (never)."""

    max_bytes: Size = 20 * 1000**2
    approval_over: Annotated[int | None, BeforeValidator(_approval_threshold)] = Field(
        None, alias="approval"
    )

    def needs_approval(self, total_after: int) -> bool:
        """Whether a file that brings the run's output to `total_after` bytes must be approved."""
        if self.approval_over is None:
            return False
        return self.approval_over == 0 or total_after > self.approval_over


@dataclass(frozen=True, config=DOCUMENT)
class DataPolicy:
    inbound: DataRule = Field(default_factory=DataRule)
    outbound: OutboundRule = Field(default_factory=OutboundRule)

    def to_json(self) -> str:
        """These rules as JSON that `from_json` reads back (a sandbox's row keeps them)."""
        approval = self.outbound.approval_over
        return json.dumps(
            {
                "inbound": {"max_bytes": self.inbound.max_bytes, "types": self.inbound.types},
                "outbound": {
                    "max_bytes": self.outbound.max_bytes,
                    "types": self.outbound.types,
                    "approval": False if approval is None else approval,
                },
            }
        )

    @staticmethod
    def from_json(text: str) -> DataPolicy:
        return TypeAdapter(DataPolicy).validate_python(json.loads(text))


@dataclass(frozen=True, config=DOCUMENT)
class Lifetime:
    ttl_seconds: LifetimeSeconds = Field(DEFAULT_TTL_SECONDS, alias="ttl")
    idle_seconds: LifetimeSeconds = Field(DEFAULT_IDLE_SECONDS, alias="idle")

    @model_validator(mode="before")
    @classmethod
    def _idle_at_most_ttl_by_default(cls, raw: Any) -> Any:
        """An omitted `idle` is 5 minutes, or the ttl if that is shorter."""
        if isinstance(raw, Mapping) and "idle" not in raw and "ttl" in raw:
            try:
                return {**raw, "idle": min(DEFAULT_IDLE_SECONDS, _lifetime(raw["ttl"]))}
            except ValueError:
                return raw  # the ttl's own problem is reported
        return raw

    @model_validator(mode="after")
    def _idle_within_ttl(self) -> Lifetime:
        if self.idle_seconds > self.ttl_seconds:
            raise Problem(
                [
                    (
                        "idle",
                        f"idle ({self.idle_seconds}s) cannot be longer than ttl "
                        f"({self.ttl_seconds}s)",
                    )
                ]
            )
        return self


@dataclass(frozen=True, config=DOCUMENT)
class Policy:
    name: Annotated[str, BeforeValidator(_name)] = Field(None, validate_default=True)
    egress: EgressPolicy = Field(default_factory=EgressPolicy)
    services: ServiceNames = ()
    image: Annotated[str, BeforeValidator(_image)] = "base"
    packages: Packages = ()
    data: DataPolicy = Field(default_factory=DataPolicy)
    lifetime: Lifetime = Field(default_factory=Lifetime)
    resources: Resources = Field(default_factory=Resources)
    # Sandboxes of this policy kept started ahead of its runs (booted alike, unused; its
    # rules and services are applied when one is handed out). Only a stored policy has them.
    warm: Annotated[int, BeforeValidator(_warm)] = 0

    @classmethod
    def from_yaml(cls, text: str) -> Policy:
        return parse_policy(text)

    @classmethod
    def from_dict(cls, data: object) -> Policy:
        return policy_from_dict(data)


def policy_from_dict(data: object) -> Policy:
    """Validate already-loaded data (e.g. from JSON) into a `Policy`, or raise `PolicyError`."""
    found = validate(Policy, data)
    if isinstance(found, list):
        raise PolicyError(found)
    return found


def parse_policy(text: str) -> Policy:
    """Parse a YAML policy document; raises `PolicyError` naming every bad field."""
    try:
        data = load_yaml(text)
    except ValueError as exc:
        raise PolicyError([("", str(exc))]) from None
    return policy_from_dict(data)
