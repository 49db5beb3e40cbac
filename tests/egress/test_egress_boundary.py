"""The adversarial suite, run inside a network namespace this test creates (egress_netns).

Every attempt must be refused with the expected status and rule, be in the ledger with that
rule, and cause no connection to any fake "outside" host."""

from __future__ import annotations

import pytest
from egress_attacks import ATTACKS, NETNS_ADDRESSES

EXTRA = [
    ("slowloris", 408, "client: header timeout"),
    ("keepalive-recheck", 403, "ip-literal"),
]
CASES = [(name, status, rule) for name, _phase, _data, status, rule in ATTACKS] + EXTRA


@pytest.fixture(scope="module")
def outcome(netns):
    return netns("egress_attacks:run", {}, NETNS_ADDRESSES)


def test_the_suite_has_at_least_25_distinct_bypass_attempts():
    assert len({name for name, _, _ in CASES}) == len(CASES) >= 25


@pytest.mark.parametrize(("name", "status", "rule"), CASES, ids=[c[0] for c in CASES])
def test_bypass_attempt_is_refused_and_in_the_ledger(outcome, name, status, rule):
    result = outcome[name]
    assert result["status"] == status, result
    assert result["rule"].startswith(rule), result
    assert result["rule"] in result["body"]
    refused = [e for e in result["events"] if e["decision"] == "refused"]
    assert len(refused) == 1, result["events"]
    event = refused[0]
    assert event["rule"] == result["rule"]
    assert event["status"] == status
    assert event["sandbox_id"] == "sb-0000000000aa"
    assert event["bytes_up"] == 0 and event["bytes_down"] == 0
    reached = {host: n for host, n in result["hits"].items() if n}
    if name == "keepalive-recheck":
        assert result["first_status"] == 200
        assert reached == {"127.0.0.10": 1}  # only the allowed first request
    else:
        assert reached == {}


@pytest.mark.parametrize(
    ("name", "reached", "rule"),
    [
        ("allowed-name", "127.0.0.10", "allow[0] a.test"),
        ("wildcard-public", "1.1.1.1", "allow[3] *.wild.test"),
        ("wildcard-connect-public", "1.1.1.1", "allow[3] *.wild.test"),
        ("mixed-answer-uses-public", "1.1.1.1", "allow[3] *.wild.test"),
        ("port-pinned-rule", "1.1.1.1", "allow[2] files.test:8080"),
    ],
)
def test_positive_controls_reach_the_fake_outside(outcome, name, reached, rule):
    """Proves the fake hosts answer, so the refusals above are the proxy's doing."""
    result = outcome[name]
    assert result["status"] == 200
    assert {h: n for h, n in result["hits"].items() if n} == {reached: 1}
    assert [(e["decision"], e["rule"], e["address"]) for e in result["events"]] == [
        ("allowed", rule, reached)
    ]


def test_rule_naming_the_exact_ip_allows_it_after_a_live_change(outcome):
    assert outcome["rule-change-exact-ip"]["status"] == 200
    assert outcome["rule-change-exact-private-ip"]["status"] == 200
    hits = {h: n for h, n in outcome["rule-change-hits"].items() if n}
    assert hits == {"1.1.1.1": 1, "10.0.0.5": 1}


def test_name_is_resolved_once_and_the_checked_address_is_used(outcome):
    dns = outcome["dns"]
    # First connection: the DNS server said 1.1.1.1 (public) → allowed and connected there.
    assert dns["first"]["status"] == 200
    assert "hello from 1.1.1.1:80" in dns["first"]["body"]
    # Second connection: the server now says 10.0.0.5 (private) → refused, never connected.
    assert dns["second"]["status"] == 403
    assert dns["second"]["rule"] == "address: private"
    assert {h: n for h, n in dns["hits"].items() if n} == {"1.1.1.1": 1}
    # One A (and one AAAA) query per connection: no second lookup before connecting.
    a_queries = [q for q in dns["queries"] if q == ["flip.wild.test", "A"]]
    assert len(a_queries) == 2
    assert dns["unknown"]["status"] == 502
    assert [(e["decision"], e["rule"], e["address"]) for e in dns["events"]] == [
        ("allowed", "allow[3] *.wild.test", "1.1.1.1"),
        ("refused", "address: private", "10.0.0.5"),
        ("refused", "resolve", None),
    ]
