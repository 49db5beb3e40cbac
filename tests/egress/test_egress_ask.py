"""`egress.default: ask`: a destination outside the rules is put to a person, once per
sandbox and host:port, through a real proxy in a network namespace (see egress_ask.py)."""

from __future__ import annotations

import pytest
from egress_ask import NETNS_ADDRESSES
from egress_netns import netns_available, run_in_netns

from aamp.egress.rules import EgressRules

pytestmark = pytest.mark.skipif(netns_available() is not None, reason=str(netns_available()))


@pytest.fixture(scope="module")
def outcome() -> dict:
    return run_in_netns("egress_ask:run", {}, NETNS_ADDRESSES)


def test_rules_mark_unmatched_destinations_ask_and_deny_still_wins() -> None:
    rules = EgressRules.from_lists("ask", allow=["a.test"], deny=["*.evil.test"])
    asked = rules.decide("b.test", 443)
    assert (asked.allowed, asked.ask, asked.rule) == (False, True, "default: ask")
    assert rules.decide("a.test", 443).allowed and not rules.decide("a.test", 443).ask
    denied = rules.decide("x.evil.test", 443)
    assert not denied.allowed and not denied.ask
    literal = rules.decide("1.1.1.1", 80)  # IP literals are never put to a person
    assert not literal.allowed and not literal.ask


def test_without_an_approver_ask_is_refused_saying_so(outcome) -> None:
    result = outcome["no-approver"]
    assert result["status"] == 403 and result["rule"] == "default: ask"
    assert "only a run can ask a person" in result["body"]


def test_rules_decide_without_asking(outcome) -> None:
    assert outcome["allowed-by-rule"]["status"] == 200
    assert outcome["denied-by-rule"]["status"] == 403
    assert outcome["denied-by-rule"]["rule"].startswith("deny[0]")
    assert not {"known.test:80", "x.evil.test:80"} & set(outcome["questions"])


def test_concurrent_connections_share_one_question_and_the_answer_is_kept(outcome) -> None:
    assert [r["status"] for r in outcome["concurrent"]] == [200] * 5
    assert outcome["again"]["status"] == 200
    assert outcome["questions"].count("shop.test:80") == 1
    assert "hello from 1.1.1.1:80" in outcome["again"]["body"]


def test_each_port_is_its_own_question(outcome) -> None:
    assert outcome["connect-other-port"]["status"] == 200
    assert outcome["questions"].count("shop.test:443") == 1


def test_an_approval_never_reaches_a_private_address(outcome) -> None:
    result = outcome["intranet"]
    assert result["status"] == 403 and result["rule"] == "address: private"
    assert outcome["hits"]["10.0.0.5"] == 0


def test_a_denial_is_refused_naming_who_and_kept(outcome) -> None:
    for key in ("refused", "refused-again"):
        assert outcome[key]["status"] == 403
        assert outcome[key]["rule"] == "default: ask, denied by user:bob"
    assert "not for this task" in outcome["refused"]["body"]
    assert outcome["questions"].count("refused.test:80") == 1


def test_no_answer_is_refused_and_asked_again_next_time(outcome) -> None:
    assert outcome["silent"]["status"] == 403
    assert outcome["silent"]["rule"] == "default: ask, unanswered"
    assert outcome["questions"].count("silent.test:80") == 2


def test_closing_the_proxy_withdraws_an_open_question(outcome) -> None:
    assert outcome["closed-while-asking"]["done"]
    assert "shop.test:8080" in outcome["questions"]


def test_the_ledger_names_who_approved(outcome) -> None:
    rules = [(e["host"], e["rule"], e["decision"]) for e in outcome["ledger"]]
    assert ("shop.test", "default: ask, approved by user:alice", "allowed") in rules
    assert ("shop.test", "default: ask", "refused") in rules  # before an approver existed
