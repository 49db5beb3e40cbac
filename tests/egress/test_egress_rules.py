from __future__ import annotations

import ipaddress

import pytest

from aamp.egress.rules import EgressRules
from aamp.policy import parse_policy
from aamp.policy.hosts import HostError, HostPattern, normalize_host

RULES = EgressRules.from_lists(
    "block",
    allow=["a.test", "*.corp.example:443", "10.0.0.5", "[fd00::1]:80", "bücher.example"],
    deny=["*.pastebin.com", "bad.corp.example"],
)


@pytest.mark.parametrize(
    ("host", "port", "allowed", "rule"),
    [
        ("a.test", 80, True, "allow[0] a.test"),
        ("A.TeSt.", 1234, True, "allow[0] a.test"),
        ("x.corp.example", 443, True, "allow[1] *.corp.example:443"),
        ("deep.x.corp.example", 443, True, "allow[1] *.corp.example:443"),
        ("corp.example", 443, False, "default: block"),  # allow wildcard excludes the apex
        ("x.corp.example", 80, False, "default: block"),  # wrong port
        ("bad.corp.example", 443, False, "deny[1] bad.corp.example"),  # deny beats allow
        ("pastebin.com", 80, False, "deny[0] *.pastebin.com"),  # deny wildcard includes apex
        ("WWW.PASTEBIN.COM.", 443, False, "deny[0] *.pastebin.com"),
        ("ｗｗｗ．ｐａｓｔｅｂｉｎ．ｃｏｍ", 443, False, "deny[0] *.pastebin.com"),  # fullwidth
        ("www。pastebin。com", 443, False, "deny[0] *.pastebin.com"),  # ideographic dots
        ("BÜCHER.example", 80, True, "allow[4] xn--bcher-kva.example"),
        ("XN--BCHER-KVA.example", 80, True, "allow[4] xn--bcher-kva.example"),
        ("10.0.0.5", 80, True, "allow[2] 10.0.0.5"),
        ("012.0.0.5", 80, True, "allow[2] 10.0.0.5"),  # octal spelling of the named IP
        ("167772165", 80, True, "allow[2] 10.0.0.5"),
        ("10.0.0.6", 80, False, "ip-literal"),
        ("[fd00::1]", 80, True, "allow[3] [fd00::1]:80"),
        ("[fd00::1]", 81, False, "ip-literal"),
        ("[::ffff:10.0.0.5]", 80, False, "ip-literal"),  # a different literal than the rule's
        ("a.test", 0, False, "invalid port"),
        ("a.test", 65536, False, "invalid port"),
    ],
)
def test_decide(host, port, allowed, rule):
    decision = RULES.decide(host, port)
    assert (decision.allowed, decision.rule) == (allowed, rule)


@pytest.mark.parametrize(
    "host",
    [
        "",
        "a.test\x00",
        "a.test ",
        " a.test",
        "a\tb.test",
        "a.test\r\nx",
        "a%2etest",
        "user@a.test",
        "a.test/x",
        "a\\b.test",
        "a..test",
        ".a.test",
        "a.test..",
        "xn--pastebin-.com",
        "x" * 64 + ".test",
        ".".join(["a" * 60] * 5),
        "1.2.3.4.5",
        "256.0.0.1",
        "0x100000000",
        "::1",
        "[::1",
        "[fe80::1%eth0]",
        "[1.2.3.4]",
        "a.test\u2028",
    ],
)
def test_tricky_hosts_are_refused(host):
    with pytest.raises(HostError):
        normalize_host(host)
    assert RULES.decide(host, 80).allowed is False
    assert RULES.decide(host, 80).rule == "invalid host"


def test_normalisation_is_one_spelling():
    assert normalize_host("BÜCHER.Example.").name == "xn--bcher-kva.example"
    assert normalize_host("0x7f.1").ip == ipaddress.ip_address("127.0.0.1")
    assert str(normalize_host("[::FFFF:7F00:1]")) == "[::ffff:7f00:1]"
    assert normalize_host("under_score.test").name == "under_score.test"
    # UTS 46 drops zero-width characters; the name checked is the name resolved.
    assert normalize_host("XN--bcher-KVA.example.\u200b").name == "xn--bcher-kva.example"


def test_default_allow_still_refuses_ip_literals_and_denied_names():
    rules = EgressRules.from_lists("allow", deny=["*.pastebin.com"])
    assert rules.decide("example.org", 443).rule == "default: allow"
    assert rules.decide("1.1.1.1", 443).rule == "ip-literal"
    assert rules.decide("x.pastebin.com", 443).rule == "deny[0] *.pastebin.com"


@pytest.mark.parametrize(
    ("rule", "address", "allowed", "why"),
    [
        ("a.test", "127.0.0.1", True, "allow[0] a.test"),  # exact name may reach loopback
        ("*.test", "127.0.0.1", False, "address: loopback"),
        ("*.test", "10.1.2.3", False, "address: private"),
        ("*.test", "169.254.169.254", False, "address: metadata"),
        ("*.test", "::ffff:10.1.2.3", False, "address: private"),
        ("*.test", "1.1.1.1", True, "allow[0] *.test"),
    ],
)
def test_check_address(rule, address, allowed, why):
    rules = EgressRules.from_lists("block", allow=[rule])
    decision = rules.decide("a.test", 80)
    verdict = rules.check_address(decision, "a.test", ipaddress.ip_address(address))
    assert (verdict.allowed, verdict.rule) == (allowed, why)


def test_default_allow_never_reaches_private_addresses():
    rules = EgressRules.from_lists("allow")
    decision = rules.decide("intranet.test", 80)
    verdict = rules.check_address(decision, "intranet.test", ipaddress.ip_address("192.168.1.1"))
    assert (verdict.allowed, verdict.rule) == (False, "address: private")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("*", "IPv6"),  # no: '*' alone is not a host
        ("a.*.test", "'*'"),
        ("*a.test", "'*'"),
        ("*.10.0.0.1", "wildcard cannot cover IP"),
        ("127.1", "write the address as 127.0.0.1"),
        ("a.test:0", "invalid port"),
        ("a.test:08", "invalid port"),
        ("a.test:http", "invalid port"),
        (" a.test", "surrounding spaces"),
        ("a.test:80:90", "brackets"),
    ],
)
def test_bad_rules_are_refused_with_their_index(text, message):
    with pytest.raises(HostError) as info:
        EgressRules.from_lists("block", allow=["ok.test", text])
    assert str(info.value).startswith("allow[1]: ")
    if message != "IPv6":
        assert message in str(info.value)


def test_pattern_canonical_form():
    assert HostPattern.parse("*.BÜCHER.example:443").canonical == "*.xn--bcher-kva.example:443"
    assert HostPattern.parse("[FD00::1]").canonical == "[fd00::1]"


def test_from_policy():
    policy = parse_policy(
        "name: p\negress: {default: allow, deny: ['*.x.test'], max_bytes_out: 1MB}\n"
    )
    rules = EgressRules.from_policy(policy.egress)
    assert rules.default == "allow" and rules.max_bytes_out == 1_000_000
    assert rules.decide("a.x.test", 1).rule == "deny[0] *.x.test"
