"""The policy model: the five boundaries of a sandbox, parsed from YAML into frozen values.

A policy is read whole or not at all: `parse_policy` either returns a complete, validated
`Policy` or raises `PolicyError` listing every problem, each prefixed with the field path
(`egress.allow[2]: ...`, `resources.memory: ...`). Unknown keys are errors (a typo such as
`egres:` must not silently drop a boundary), duplicate YAML keys are errors (PyYAML would
otherwise keep the last one), and every omitted section gets the safe default: egress
`default: block` with no rules, the `base` image, no services, no packages, 15 minute ttl.
An egress rule naming loopback (`localhost`, `*.localhost`, 127.0.0.0/8, `::1`) or the
unspecified address is refused: inside a sandbox that is the sandbox itself.

Usage::

    policy = parse_policy(Path("finance.yaml").read_text())
    rules = EgressRules.from_policy(policy.egress)
    spec = SandboxSpec(image=policy.image, resources=policy.resources)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from aamp.policy.hosts import (
    DEFAULTS,
    LOOPBACK_IS_THE_SANDBOX,
    HostError,
    HostPattern,
    this_machine,
)
from aamp.policy.resources import Resources
from aamp.policy.units import parse_duration, parse_size

NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$")
SERVICE_RE = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?$")
IMAGE_RE = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?$")
BUILTIN_IMAGES = ("base", "browser", "docs", "rag")
# A pinned requirement from the offline wheelhouse: `name==version`, nothing else (no URLs,
# no ranges, no extras that could pull something unpinned).
PACKAGE_RE = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[A-Za-z0-9.+!_-]+)$"
)
FILE_TYPE_RE = re.compile(r"^[a-z0-9]{1,16}$")
MAX_TTL_SECONDS = 7 * 86400


class PolicyError(ValueError):
    """A policy that cannot be used. `problems` holds (field path, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        lines = [f"{path}: {message}" if path else message for path, message in problems]
        super().__init__("invalid policy:\n  " + "\n  ".join(lines))


@dataclass(frozen=True)
class EgressPolicy:
    default: Literal["allow", "block", "ask"] = "block"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    max_bytes_out: int | None = None


@dataclass(frozen=True)
class DataRule:
    """`approval_over` (outbound only) is where a person must start approving: each file that
    brings the run's output above that many bytes waits for approval. `approval: true` is 0
    (every file), `approval: 5MB` is 5,000,000, `approval: false` is None (never)."""

    max_bytes: int
    types: tuple[str, ...]
    approval_over: int | None = None

    def needs_approval(self, total_after: int) -> bool:
        """Whether a file that brings the run's output to `total_after` bytes must be approved."""
        if self.approval_over is None:
            return False
        return self.approval_over == 0 or total_after > self.approval_over


@dataclass(frozen=True)
class DataPolicy:
    # Safe defaults: modest sizes, no file types at all until the policy names them.
    inbound: DataRule = field(default_factory=lambda: DataRule(50 * 1000**2, ()))
    outbound: DataRule = field(default_factory=lambda: DataRule(20 * 1000**2, ()))


@dataclass(frozen=True)
class Lifetime:
    ttl_seconds: int = 15 * 60
    idle_seconds: int = 5 * 60


@dataclass(frozen=True)
class Policy:
    name: str
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    services: tuple[str, ...] = ()
    image: str = "base"
    packages: tuple[str, ...] = ()
    data: DataPolicy = field(default_factory=DataPolicy)
    lifetime: Lifetime = field(default_factory=Lifetime)
    resources: Resources = field(default_factory=Resources)

    @classmethod
    def from_yaml(cls, text: str) -> Policy:
        return parse_policy(text)

    @classmethod
    def from_dict(cls, data: object) -> Policy:
        return policy_from_dict(data)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class _Reader:
    """Collects problems with their paths while walking untrusted data."""

    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append((path, message))

    def mapping(self, value: object, path: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(path, f"expected a mapping, got {_kind(value)}")
            return {}
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str) or key not in allowed:
                where = f"{path}.{key}" if path else str(key)
                self.fail(where, f"unknown key; expected one of: {', '.join(allowed)}")
            else:
                out[key] = item
        return out

    def convert(self, value: object, path: str, fn: Callable[[object], Any], default: Any) -> Any:
        try:
            return fn(value)
        except (ValueError, TypeError) as exc:
            self.fail(path, str(exc))
            return default

    def string_list(
        self, value: object, path: str, check: Callable[[str], str | None]
    ) -> tuple[str, ...]:
        if not isinstance(value, list):
            self.fail(path, f"expected a list, got {_kind(value)}")
            return ()
        out: list[str] = []
        for index, item in enumerate(value):
            where = f"{path}[{index}]"
            if not isinstance(item, str):
                self.fail(where, f"expected text, got {_kind(item)}")
                continue
            problem = check(item)
            if problem:
                self.fail(where, problem)
            elif item in out:
                self.fail(where, f"{item!r} is listed twice")
            else:
                out.append(item)
        return tuple(out)


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "text", bool: "true/false"}.get(
        type(value), type(value).__name__
    )


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


def _check_regex(regex: re.Pattern[str], what: str) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        return None if regex.match(text) else f"{text!r} is not a valid {what}"

    return check


def _parse_egress(r: _Reader, raw: object) -> EgressPolicy:
    m = r.mapping(raw, "egress", ("default", "allow", "deny", "max_bytes_out"))
    default = m.get("default", "block")
    if default not in DEFAULTS:
        r.fail("egress.default", f"must be one of {', '.join(DEFAULTS)}; got {default!r}")
        default = "block"
    allow = r.string_list(m.get("allow", []), "egress.allow", _check_rule)
    deny = r.string_list(m.get("deny", []), "egress.deny", _check_rule)
    max_out = None
    if m.get("max_bytes_out") is not None:
        max_out = r.convert(m["max_bytes_out"], "egress.max_bytes_out", parse_size, None)
    return EgressPolicy(default, allow, deny, max_out)


def _parse_data_rule(r: _Reader, raw: object, path: str, default: DataRule) -> DataRule:
    keys = (
        ("max_bytes", "types", "approval") if path.endswith("outbound") else ("max_bytes", "types")
    )
    m = r.mapping(raw, path, keys)
    max_bytes = default.max_bytes
    if "max_bytes" in m:
        max_bytes = r.convert(m["max_bytes"], f"{path}.max_bytes", parse_size, max_bytes)
    types = r.string_list(
        m.get("types", list(default.types)),
        f"{path}.types",
        _check_regex(FILE_TYPE_RE, "file type"),
    )
    over = default.approval_over
    if "approval" in m:
        over = r.convert(m["approval"], f"{path}.approval", _approval_threshold, 0)
    return DataRule(max_bytes, types, over)


def _approval_threshold(value: object) -> int | None:
    """`approval:` is true (every file), false (never) or a size (above it)."""
    if value is True:
        return 0
    if value is False:
        return None
    if not isinstance(value, int | str) or isinstance(value, bool):
        raise ValueError(f"expected true, false or a size such as 5MB, got {value!r}")
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ValueError(f"expected true, false or a size such as 5MB: {exc}") from None


def _parse_data(r: _Reader, raw: object) -> DataPolicy:
    m = r.mapping(raw, "data", ("inbound", "outbound"))
    defaults = DataPolicy()
    inbound = defaults.inbound
    outbound = defaults.outbound
    if "inbound" in m:
        inbound = _parse_data_rule(r, m["inbound"], "data.inbound", defaults.inbound)
    if "outbound" in m:
        outbound = _parse_data_rule(r, m["outbound"], "data.outbound", defaults.outbound)
    return DataPolicy(inbound, outbound)


def _positive_duration(value: object) -> int:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("must be longer than zero")
    if seconds > MAX_TTL_SECONDS:
        raise ValueError(f"must be at most {MAX_TTL_SECONDS // 86400} days")
    return seconds


def _parse_lifetime(r: _Reader, raw: object) -> Lifetime:
    m = r.mapping(raw, "lifetime", ("ttl", "idle"))
    d = Lifetime()
    ttl = r.convert(m.get("ttl", d.ttl_seconds), "lifetime.ttl", _positive_duration, d.ttl_seconds)
    idle_default = min(d.idle_seconds, ttl)
    idle = r.convert(m.get("idle", idle_default), "lifetime.idle", _positive_duration, idle_default)
    if idle > ttl:
        r.fail("lifetime.idle", f"idle ({idle}s) cannot be longer than ttl ({ttl}s)")
    return Lifetime(ttl, idle)


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number, got {value!r}")
    return value


def _parse_resources(r: _Reader, raw: object) -> Resources:
    m = r.mapping(raw, "resources", ("cpus", "memory", "pids", "disk"))
    d = Resources()
    cpus = r.convert(m.get("cpus", d.cpus), "resources.cpus", _number, d.cpus)
    memory = r.convert(m.get("memory", d.memory_bytes), "resources.memory", parse_size, None)
    pids = r.convert(m.get("pids", d.pids), "resources.pids", _whole, d.pids)
    disk = r.convert(m.get("disk", d.disk_bytes), "resources.disk", parse_size, None)
    if memory is None or disk is None:
        return d
    try:
        return Resources(cpus, memory, pids, disk)  # its bounds are the drivers' too
    except ValueError as exc:
        message = str(exc)
        field_name = next(
            (f for f in ("cpus", "memory", "pids", "disk") if f"resources.{f}" in message), ""
        )
        r.fail(f"resources.{field_name}" if field_name else "resources", message.split(" ", 1)[1])
        return d


def policy_from_dict(data: object) -> Policy:
    """Validate already-loaded data (e.g. from JSON) into a `Policy`, or raise `PolicyError`."""
    r = _Reader()
    top = r.mapping(
        data,
        "",
        ("name", "egress", "services", "image", "packages", "data", "lifetime", "resources"),
    )
    if not isinstance(data, Mapping):
        raise PolicyError(r.problems)
    name = top.get("name")
    if name is None:
        r.fail("name", "is required")
    elif not isinstance(name, str) or not NAME_RE.match(name):
        r.fail("name", f"{name!r} is not a valid name (lower-case letters, digits, '.', '_', '-')")
    egress = _parse_egress(r, top["egress"]) if "egress" in top else EgressPolicy()
    services = r.string_list(
        top.get("services", []), "services", _check_regex(SERVICE_RE, "service name")
    )
    image = top.get("image", "base")
    if not isinstance(image, str) or not IMAGE_RE.match(image):
        r.fail(
            "image",
            f"{image!r} is not a valid image name "
            f"({', '.join(BUILTIN_IMAGES)} or a custom image's name)",
        )
    packages = r.string_list(top.get("packages", []), "packages", _check_package)
    data_policy = _parse_data(r, top["data"]) if "data" in top else DataPolicy()
    lifetime = _parse_lifetime(r, top.get("lifetime", {}))
    resources = _parse_resources(r, top.get("resources", {}))
    if r.problems:
        raise PolicyError(r.problems)
    return Policy(
        name=name,
        egress=egress,
        services=services,
        image=image,
        packages=packages,
        data=data_policy,
        lifetime=lifetime,
        resources=resources,
    )


def _check_package(text: str) -> str | None:
    if PACKAGE_RE.match(text):
        return None
    return f"{text!r} must be a pinned requirement 'name==version' (the wheelhouse is offline)"


def parse_policy(text: str) -> Policy:
    """Parse a YAML policy document; raises `PolicyError` naming every bad field."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PolicyError([("", f"not valid YAML: {exc}")]) from None
    return policy_from_dict(data)
