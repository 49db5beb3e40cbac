from __future__ import annotations

import dataclasses

import pytest

from aamp.policy import Policy, PolicyError, Resources, parse_policy

PRODUCT_EXAMPLE = """\
name: finance-reports
egress:                       # 1. which domains it can reach
  default: block              #    block | allow
  allow: ["crm.internal.example", "*.corp.example:443"]
  deny:  ["*.pastebin.com"]   #    deny beats allow
services: [crm-api]           # 2. which services it can call
image: browser                # 3. which dependencies exist inside
packages: ["tabulate==0.9.0"] #    extra Python packages
data:                         # 4. what data enters or leaves
  inbound:  {max_bytes: 50MB, types: [csv, xlsx, pdf]}
  outbound: {max_bytes: 20MB, types: [pdf, xlsx], approval: false}
lifetime: {ttl: 15m, idle: 5m}          # 5. how long the environment lives
resources: {cpus: 1, memory: 1GiB, pids: 256, disk: 2GiB}
"""


def test_the_product_example_parses():
    policy = parse_policy(PRODUCT_EXAMPLE)
    assert policy.name == "finance-reports"
    assert policy.egress.default == "block"
    assert policy.egress.allow == ("crm.internal.example", "*.corp.example:443")
    assert policy.egress.deny == ("*.pastebin.com",)
    assert policy.egress.max_bytes_out is None
    assert policy.services == ("crm-api",)
    assert policy.image == "browser"
    assert policy.packages == ("tabulate==0.9.0",)
    assert policy.data.inbound.max_bytes == 50_000_000
    assert policy.data.inbound.types == ("csv", "xlsx", "pdf")
    assert policy.data.outbound.approval_over is None
    assert (policy.lifetime.ttl_seconds, policy.lifetime.idle_seconds) == (900, 300)
    assert policy.resources == Resources(
        cpus=1.0, memory_bytes=1024**3, pids=256, disk_bytes=2 * 1024**3
    )


def test_values_are_frozen():
    policy = parse_policy(PRODUCT_EXAMPLE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.egress.default = "allow"  # type: ignore[misc]


def test_omitted_sections_get_safe_defaults():
    policy = parse_policy("name: minimal\n")
    assert policy.egress.default == "block"
    assert policy.egress.allow == () and policy.egress.deny == ()
    assert policy.services == () and policy.packages == ()
    assert policy.image == "base"
    assert policy.data.inbound.types == () and policy.data.outbound.types == ()
    assert policy.lifetime.ttl_seconds == 900
    assert policy.resources == Resources()
    assert Policy.from_dict({"name": "minimal"}) == policy


def test_max_bytes_out_and_default_allow():
    policy = parse_policy("name: p\negress: {default: allow, max_bytes_out: 5MiB}\n")
    assert policy.egress.default == "allow" and policy.egress.max_bytes_out == 5 * 1024**2


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        ("name: p\negres: {}\n", "egres", "unknown key"),
        ("name: p\negress: {default: maybe}\n", "egress.default", "block"),
        ("name: p\negress: {allow: [a.test, b.test, 'bad host']}\n", "egress.allow[2]", "space"),
        ("name: p\negress: {deny: ['127.1']}\n", "egress.deny[0]", "127.0.0.1"),
        ("name: p\negress: {allow: [a.test, a.test]}\n", "egress.allow[1]", "twice"),
        ("name: p\negress: {allow: a.test}\n", "egress.allow", "list"),
        ("name: p\negress: {wat: 1}\n", "egress.wat", "unknown key"),
        ("name: p\negress: {max_bytes_out: lots}\n", "egress.max_bytes_out", "size"),
        ("name: p\nservices: [Bad Name]\n", "services[0]", "service"),
        ("name: p\nimage: 'Not/Valid'\n", "image", "image"),
        ("name: p\npackages: [requests]\n", "packages[0]", "name==version"),
        ("name: p\npackages: ['x>=1']\n", "packages[0]", "name==version"),
        ("name: p\ndata: {inbound: {max_bytes: 5XB}}\n", "data.inbound.max_bytes", "unit"),
        ("name: p\ndata: {inbound: {approval: true}}\n", "data.inbound.approval", "unknown"),
        ("name: p\ndata: {outbound: {approval: maybe}}\n", "data.outbound.approval", "true"),
        ("name: p\ndata: {outbound: {approval: -1}}\n", "data.outbound.approval", "negative"),
        ("name: p\ndata: {outbound: {approval: [1]}}\n", "data.outbound.approval", "5MB"),
        ("name: p\negress: {default: maybe}\n", "egress.default", "block, allow, ask"),
        ("name: p\ndata: {outbound: {types: [PDF]}}\n", "data.outbound.types[0]", "file type"),
        ("name: p\nlifetime: {ttl: 15x}\n", "lifetime.ttl", "duration"),
        ("name: p\nlifetime: {ttl: 1m, idle: 5m}\n", "lifetime.idle", "longer than ttl"),
        ("name: p\nlifetime: {ttl: 0s}\n", "lifetime.ttl", "longer than zero"),
        ("name: p\nlifetime: {ttl: 2d}\n", "lifetime.ttl", "at most 24 hours"),
        ("name: p\nresources: {cpus: 0}\n", "resources.cpus", "(0, 64]"),
        ("name: p\nresources: {cpus: true}\n", "resources.cpus", "number"),
        ("name: p\nresources: {memory: 1MiB}\n", "resources.memory", "64MiB"),
        ("name: p\nresources: {pids: 1}\n", "resources.pids", "[8, 65536]"),
        ("name: p\nresources: {disk: 1kB}\n", "resources.disk", "16MiB"),
        ("name: p\nresources: {gpus: 1}\n", "resources.gpus", "unknown key"),
        ("egress: {}\n", "name", "required"),
        ("name: 'Has Spaces'\n", "name", "valid name"),
        ("- just\n- a list\n", "", "mapping"),
        ("name: p\nname: q\n", "", "duplicate key"),
        ("name: p\negress: {deny: [a.test], deny: []}\n", "", "duplicate key"),
        ("name: [unclosed\n", "", "YAML"),
    ],
)
def test_errors_name_the_field(text, path, fragment):
    with pytest.raises(PolicyError) as info:
        parse_policy(text)
    paths = [p for p, _ in info.value.problems]
    assert path in paths, info.value.problems
    message = next(m for p, m in info.value.problems if p == path)
    assert fragment in message or fragment in str(info.value)
    if path:
        assert f"{path}: " in str(info.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(PolicyError) as info:
        parse_policy("name: p\negress: {default: nope, allow: ['a b']}\nimage: 'X'\n")
    assert [p for p, _ in info.value.problems] == ["egress.default", "egress.allow[0]", "image"]


@pytest.mark.parametrize(
    ("written", "over", "asks_at"),
    [
        ("true", 0, [(0, True), (1, True)]),
        ("false", None, [(0, False), (10**12, False)]),
        ("5MB", 5_000_000, [(5_000_000, False), (5_000_001, True)]),
        ("1KiB", 1024, [(1024, False), (1025, True)]),
    ],
)
def test_outbound_approval_is_never_always_or_above_a_size(written, over, asks_at) -> None:
    policy = parse_policy(f"name: p\ndata: {{outbound: {{approval: {written}}}}}\n")
    rule = policy.data.outbound
    assert rule.approval_over == over
    assert [rule.needs_approval(total) for total, _ in asks_at] == [a for _, a in asks_at]


def test_egress_default_may_be_ask() -> None:
    assert parse_policy("name: p\negress: {default: ask}\n").egress.default == "ask"


@pytest.mark.parametrize(
    ("rule", "what"),
    [
        ("localhost", "localhost is a loopback name"),
        ("LocalHost.:8080", "localhost:8080 is a loopback name"),
        ("*.localhost", "*.localhost is a loopback name"),
        ("app.localhost:3000", "app.localhost:3000 is a loopback name"),
        ("127.0.0.1", "127.0.0.1 is a loopback address"),
        ("127.5.6.7:80", "127.5.6.7 is a loopback address"),
        ("[::1]", "::1 is a loopback address"),
        ("[::ffff:127.0.0.1]:8700", "carries 127.0.0.1"),
        ("0.0.0.0", "0.0.0.0 is an unspecified address"),
        ("[::]:8700", ":: is an unspecified address"),
    ],
)
@pytest.mark.parametrize("where", ["allow", "deny"])
def test_a_rule_naming_loopback_is_refused_saying_what_to_write_instead(rule, what, where):
    """Loopback always means the sandbox itself (the guest's NO_PROXY sends localhost and
    127.0.0.1 to its own loopback), so no rule can point it at the host."""
    with pytest.raises(PolicyError) as info:
        parse_policy(f"name: p\negress: {{{where}: ['a.test', '{rule}']}}\n")
    [(path, message)] = info.value.problems
    assert path == f"egress.{where}[1]"
    assert what in message
    assert "the sandbox itself" in message and "DNS name that resolves to it" in message


def test_a_dns_name_for_a_host_on_the_network_is_the_way_instead():
    policy = parse_policy("name: p\negress: {allow: ['llm.internal:8080', 'localhost.example']}\n")
    assert policy.egress.allow == ("llm.internal:8080", "localhost.example")


def test_the_longest_lifetime_a_policy_accepts_is_one_a_sandbox_can_have():
    # A policy must not accept a lifetime that every sandbox made from it would then refuse.
    from aamp.policy import MAX_TTL_SECONDS
    from aamp.sandbox.manager import CreateRequest

    longest = f"{MAX_TTL_SECONDS}s"
    policy = parse_policy(f"name: p\nlifetime: {{ttl: {longest}, idle: {longest}}}\n")
    request = CreateRequest(
        ttl=float(policy.lifetime.ttl_seconds), idle=float(policy.lifetime.idle_seconds)
    )
    assert request.ttl == MAX_TTL_SECONDS
    with pytest.raises(PolicyError, match=r"lifetime\.ttl"):
        parse_policy(f"name: p\nlifetime: {{ttl: {MAX_TTL_SECONDS + 1}s}}\n")
