"""The service model: validation with clear errors, the JSON form the API stores, grants,
and credential rendering (values never in a repr or an error)."""

from __future__ import annotations

import base64

import pytest

from aamp.egress.services import (
    Basic,
    Bearer,
    CredentialError,
    Header,
    Service,
    ServiceError,
    ServiceSet,
    auth_from_dict,
    render,
)
from aamp.policy.hosts import normalize_host

VALUE = "v-Qm29xLp0"


class DictSecretsForTests:
    """A `SecretReader` over a dict (the vault itself is used in test_egress_intercept)."""

    def __init__(self, values: dict[str, str]):
        self.values = values
        self.calls: list[tuple[str, str]] = []

    async def reveal(self, name: str, *, purpose: str) -> str:
        self.calls.append((name, purpose))
        return self.values[name]


def test_upstream_is_a_canonical_origin():
    s = Service("crm-api", "HTTPS://CRM.Internal.Example.:443/", Bearer("crm_token"))
    assert (s.scheme, s.host, s.port, s.tls) == (
        "https",
        normalize_host("crm.internal.example"),
        443,
        True,
    )
    assert s.url == s.upstream == "https://crm.internal.example"
    s2 = Service("erp", "http://erp.test:8080", Basic("pw", user="agent"))
    assert (s2.port, s2.tls, s2.upstream) == (8080, False, "http://erp.test:8080")


@pytest.mark.parametrize(
    ("upstream", "message"),
    [
        ("ftp://x.test", "https:// or http://"),
        ("crm.test", "https:// or http://"),
        ("https://x.test/api", "an origin"),
        ("https://user@x.test", "an origin"),
        ("https://x.test?q", "an origin"),
        ("https://x.test:0", "upstream host"),
        ("https://x y.test", "upstream host"),
        (42, "URL string"),
    ],
)
def test_bad_upstreams_name_the_problem(upstream, message):
    with pytest.raises(ServiceError, match=message):
        Service("crm-api", upstream, Bearer("crm_token"))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Bearer("Bad-Name"), "not a valid secret name"),
        (lambda: Basic("pw"), "exactly one of user or user_secret"),
        (lambda: Basic("pw", user="a", user_secret="u"), "exactly one"),
        (lambda: Basic("pw", user="a:b"), "without ':'"),
        (lambda: Header("Host", "{{secret:k}}"), "owned by the proxy"),
        (lambda: Header("Content-Length", "{{secret:k}}"), "owned by the proxy"),
        (lambda: Header("Bad Name", "{{secret:k}}"), "not a valid HTTP field name"),
        (lambda: Header("X-Key", "no placeholder"), "at least one"),
        (lambda: Header("X-Key", "{{secret:k}} {{oops}}"), "malformed"),
        (lambda: Header("X-Key", "{{secret:Bad}}"), "not a valid secret name"),
        (lambda: Header("X-Key", "{{secret:k}}\r\nX: y"), "printable ASCII"),
    ],
)
def test_bad_auth_is_refused(make, message):
    with pytest.raises(ServiceError, match=message):
        make()


def test_json_round_trip_and_bad_json():
    for auth in (
        Bearer("crm_token"),
        Basic("pw", user="agent"),
        Basic("pw", user_secret="user"),
        Header("X-Api-Key", "Key {{secret:kb_key}}"),
    ):
        service = Service("svc", "https://svc.test:8443", auth)
        assert Service.from_dict(service.to_dict()) == service
    with pytest.raises(ServiceError, match="not one of"):
        auth_from_dict({"type": "oauth"})
    with pytest.raises(ServiceError, match="does not take extra"):
        auth_from_dict({"type": "bearer", "secret": "a", "extra": 1})
    with pytest.raises(ServiceError, match="bearer auth"):
        auth_from_dict({"type": "bearer"})


def test_service_sets_and_grants():
    a = Service("a", "https://a.test", Bearer("t"))
    b = Service("b", "https://b.test:8443", Bearer("t"))
    same_origin = Service("c", "https://A.test:443", Bearer("t"))
    with pytest.raises(ServiceError, match="same upstream"):
        ServiceSet([a, same_origin])
    with pytest.raises(ServiceError, match="listed twice"):
        ServiceSet([a, a])
    granted = ServiceSet.granted([a, b], ["b"])
    assert granted.names == ("b",)
    assert granted.for_destination(normalize_host("b.test"), 8443) == b
    assert granted.for_destination(normalize_host("b.test"), 443) is None
    assert granted.for_destination(normalize_host("a.test"), 443) is None
    with pytest.raises(ServiceError, match="no service named zzz"):
        ServiceSet.granted([a], ["zzz"])


async def test_render_builds_headers_and_scrub_forms_and_hides_values():
    reader = DictSecretsForTests({"user": "agent", "pw": VALUE, "t": VALUE})
    basic = await render(
        Service("erp", "https://e.test", Basic("pw", user_secret="user")), reader, "p"
    )
    pair = f"agent:{VALUE}".encode()
    assert basic.headers == (("Authorization", "Basic " + base64.b64encode(pair).decode()),)
    assert basic.secret_names == ("user", "pw")
    assert basic.replaces == {"authorization"}
    assert base64.b64encode(pair) in basic.scrub_forms and VALUE.encode() in basic.scrub_forms
    assert VALUE not in repr(basic)
    header = await render(
        Service("kb", "https://k.test", Header("X-Api-Key", "K {{secret:t}}")), reader, "p"
    )
    assert header.headers == (("X-Api-Key", f"K {VALUE}"),) and header.replaces == {"x-api-key"}
    assert [name for name, _ in reader.calls] == ["user", "pw", "t"]


async def test_unusable_secret_values_are_refused_without_echoing_them():
    service = Service("crm", "https://c.test", Bearer("t"))
    for bad in (VALUE + "\r\nX-Evil: 1", VALUE + "é", ""):
        with pytest.raises(CredentialError) as info:
            await render(service, DictSecretsForTests({"t": bad}), "p")
        assert VALUE not in str(info.value) and "'t'" in str(info.value)
    with pytest.raises(CredentialError, match="unavailable"):
        await render(service, DictSecretsForTests({}), "p")
