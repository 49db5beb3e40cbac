"""Credential injection through the proxy, end to end with real parts.

A real HTTPS upstream on 127.0.0.10 (certificate from a test CA of its own) plays a careless
service that echoes the credential it got. Secrets live in a real `Vault` (SQLite store, real
audit log). The guest side is a raw client on the proxy's Unix socket that trusts only the
installation CA. Every test checks what the upstream received and that no form of the secret
value reached the client, the ledger or the log.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl

import pytest
from egress_client import connect, get, read_response, send
from egress_tls import client_context, make_upstream_tls, open_tls_tunnel, request
from egress_upstream import UpstreamServer
from secret_leaks import leaked
from sqlalchemy import text

from aamp.audit import AuditLog
from aamp.config import Settings
from aamp.egress.approvals import Answer
from aamp.egress.ca import InstallationCA
from aamp.egress.intercept import upstream_tls_context
from aamp.egress.ledger import JsonLinesSink
from aamp.egress.proxy import EgressContext, EgressProxy
from aamp.egress.resolver import StaticResolver
from aamp.egress.rules import EgressRules
from aamp.egress.services import Basic, Bearer, Header, Service, ServiceSet, VaultSecretReader
from aamp.store import Store
from aamp.vault import Vault

SANDBOX = "sb-0000000000c1"
TOKEN = "tok-Zq8v3Lr9sNw2Kp7X"  # the bearer secret's value
PASSWORD = "pw-Hk4mT9qW2zR"
API_KEY = "key-Jd83nFq0Lm"
NAMES = {"svc.test": ["127.0.0.10"], "a.test": ["127.0.0.11"], "basic.test": ["127.0.0.10"]}


def forms(value: str) -> list[bytes]:
    """What must never reach the guest for `value` (used as a bearer token or password)."""
    raw = value.encode()
    pair = f"agent:{value}".encode()
    return [raw, base64.b64encode(raw), base64.b64encode(pair)]


def assert_clean(data: bytes) -> None:
    for value in (TOKEN, PASSWORD, API_KEY):
        for form in forms(value):
            assert form not in data, f"a form of a secret reached the guest: {form[:6]!r}..."


@pytest.fixture
async def vault(tmp_path):
    home = tmp_path / "home"
    settings = Settings(home=home, runtime_dir=tmp_path / "run", image_dir=home / "images")
    store = Store.open(settings)
    async with AuditLog.open(settings, store) as log:
        v = Vault.open(settings, store, log)
        await v.put("crm_token", TOKEN, actor="user:admin")
        await v.put("erp_password", PASSWORD, actor="user:admin")
        await v.put("kb_key", API_KEY, actor="user:admin")
        await v.put("erp_user", "agent", actor="user:admin")
        v.store = store  # for reveals()
        yield v
    store.close()


def reveals(vault) -> list[str]:
    with vault.store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT resource FROM audit_records WHERE action = 'secret.reveal'")
        )
        return [row[0] for row in rows]


def uses(vault) -> list[tuple[str, str, dict]]:
    """(resource, reason, details) of the `secret.use` records: one per connection and service."""
    with vault.store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT resource, reason, details FROM audit_records WHERE action = 'secret.use'")
        )
        return [(row[0], row[1], json.loads(row[2])) for row in rows]


@pytest.fixture
def ca(tmp_path):
    return InstallationCA.load_or_create(tmp_path / "home" / "ca")


@pytest.fixture
def upstream_tls(tmp_path):
    return make_upstream_tls(tmp_path / "upstream-tls", ["svc.test", "basic.test"])


@pytest.fixture
async def service_upstream(upstream_tls):
    async with UpstreamServer("127.0.0.10", ssl=upstream_tls[0]) as server:
        yield server


@pytest.fixture
async def plain_upstream():
    async with UpstreamServer("127.0.0.11") as server:
        yield server


@pytest.fixture
def sink(sockdir):
    return JsonLinesSink(sockdir / "ledger.jsonl")


def services_for(port: int) -> ServiceSet:
    return ServiceSet(
        [
            Service("crm-api", f"https://svc.test:{port}", Bearer("crm_token")),
            Service("erp", f"https://basic.test:{port}", Basic("erp_password", user="agent")),
        ]
    )


@pytest.fixture
async def proxy(sockdir, sink, vault, ca, upstream_tls, service_upstream):
    rules = EgressRules.from_lists(
        "block", allow=["svc.test", "a.test", "basic.test"], deny=["*.pastebin.test"]
    )
    p = EgressProxy(
        SANDBOX,
        sockdir / "egress.sock",
        rules,
        EgressContext(
            StaticResolver(NAMES),
            sink,
            secrets=VaultSecretReader(vault),
            ca=ca,
            upstream_tls=upstream_tls_context(upstream_tls[1]),
        ),
        services=services_for(service_upstream.port),
    )
    await p.start()
    yield p
    await p.close()


async def wait_events(proxy, sink, count: int) -> list:
    """The ledger once `count` events are in it (a tunnel's event follows its close)."""
    async with asyncio.timeout(5):
        while True:
            await proxy.flush()
            events = sink.read()
            if len(events) >= count:
                return events
            await asyncio.sleep(0.01)


async def tunnel(proxy, ca, host: str, port: int, sni: str | None = None, **kw):
    ctx = client_context(ca.cert_path, **kw)
    return await open_tls_tunnel(proxy.socket_path, f"{host}:{port}", ctx, sni or host)


async def test_bearer_injected_guest_header_replaced_and_echo_scrubbed(
    proxy, sink, ca, vault, service_upstream, caplog
):
    caplog.set_level(logging.DEBUG)
    port = service_upstream.port
    reader, writer = await tunnel(proxy, ca, "svc.test", port)
    try:
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
        host = f"svc.test:{port}"
        guest = "Authorization: Bearer guest-made-up\r\nauthorization: Basic Zm9vOmJhcg==\r\n"
        first = await request(reader, writer, "/whoami", host, guest)
        second = await request(reader, writer, "/whoami", host)  # kept alive
    finally:
        writer.close()
    # The upstream got the real credential, once, and nothing the guest set.
    for seen in service_upstream.seen:
        assert [v for k, v in seen if k == "authorization"] == [f"Bearer {TOKEN}"]
        assert ("accept-encoding", "identity") in seen
    assert len(service_upstream.seen) == 2
    assert service_upstream.connections == 1  # one upstream TLS connection for both
    for response in (first, second):
        assert response.status == 200
        assert_clean(json.dumps(response.headers).encode() + response.body)
        echoed = json.loads(response.body)["authorization"]
        assert echoed.startswith("Bearer ") and "****" in echoed
        assert "****" in response.headers["x-echo-authorization"]
    await proxy.flush()
    events = sink.read()
    assert [(e.kind, e.service, e.secrets, e.status) for e in events] == [
        ("connect", "crm-api", (), 200),
        ("service", "crm-api", ("crm_token",), 200),
        ("service", "crm-api", ("crm_token",), 200),
    ]
    assert all(e.rule == "allow[0] svc.test" and e.allowed for e in events)
    assert events[1].bytes_down > 0 and events[1].address == "127.0.0.10"
    assert_clean(sink.path.read_bytes())
    assert_clean(caplog.text.encode())
    # Read once for the connection; its one use record counts both requests.
    assert reveals(vault) == ["secret:crm_token"]
    [(resource, reason, details)] = uses(vault)
    assert resource == "service:crm-api" and "connection" in reason
    assert details == {
        "service": "crm-api",
        "secrets": ["crm_token"],
        "requests": 2,
        "methods": {"GET": 2},
        "reads": 1,
    }


@pytest.mark.parametrize(
    ("auth", "host", "expected"),
    [
        (
            Basic("erp_password", user="agent"),
            "basic.test",
            ("authorization", "Basic " + base64.b64encode(f"agent:{PASSWORD}".encode()).decode()),
        ),
        (
            Basic("erp_password", user_secret="erp_user"),
            "basic.test",
            ("authorization", "Basic " + base64.b64encode(f"agent:{PASSWORD}".encode()).decode()),
        ),
        (Header("X-Api-Key", "{{secret:kb_key}}"), "svc.test", ("x-api-key", API_KEY)),
        (
            Header("Authorization", "Token {{secret:kb_key}}/{{secret:crm_token}}"),
            "svc.test",
            ("authorization", f"Token {API_KEY}/{TOKEN}"),
        ),
    ],
)
async def test_basic_and_header_auth(proxy, ca, service_upstream, auth, host, expected):
    port = service_upstream.port
    proxy.update_services(ServiceSet([Service("svc", f"https://{host}:{port}", auth)]))
    reader, writer = await tunnel(proxy, ca, host, port)
    try:
        extra = f"{expected[0]}: guest-value\r\n"
        whoami = await request(reader, writer, "/whoami", f"{host}:{port}", extra)
        leaked = await request(reader, writer, "/leak/chunked/3", f"{host}:{port}")
    finally:
        writer.close()
    for seen in service_upstream.seen:
        assert [(k, v) for k, v in seen if k == expected[0]] == [expected]
    for response in (whoami, leaked):
        assert response.status == 200
        assert_clean(json.dumps(response.headers).encode() + response.body)
    assert leaked.body.startswith(b"before ") and leaked.body.endswith(b" after")


@pytest.mark.parametrize("framing", ["chunked", "length", "close"])
@pytest.mark.parametrize("split", [1, 5, 12])
async def test_value_split_across_reads_is_scrubbed(proxy, ca, service_upstream, framing, split):
    port = service_upstream.port
    reader, writer = await tunnel(proxy, ca, "svc.test", port)
    try:
        response = await request(reader, writer, f"/leak/{framing}/{split}", f"svc.test:{port}")
    finally:
        writer.close()
    assert response.status == 200
    assert response.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in response.headers
    assert_clean(response.body)
    assert response.body == b"before ******** after"


async def test_basic_forms_split_and_gzip_are_scrubbed(proxy, ca, service_upstream):
    port = service_upstream.port
    reader, writer = await tunnel(proxy, ca, "basic.test", port)
    try:
        split = await request(reader, writer, "/leak/chunked/4", f"basic.test:{port}")
        zipped = await request(reader, writer, "/leak/gzip/0", f"basic.test:{port}")
    finally:
        writer.close()
    for response in (split, zipped):
        assert response.status == 200
        assert_clean(response.body)
        # base64 token, decoded "user:password" (user kept, password gone), password
        assert response.body == b"before ******** | agent:******** | ******** after"
    assert "content-encoding" not in zipped.headers  # decoded, scrubbed, sent plain


async def test_sni_and_host_must_name_the_tunnel_host(proxy, ca, sink, vault, service_upstream):
    port = service_upstream.port
    # SNI names another host than the CONNECT (fronting at the TLS layer).
    reader, writer = await tunnel(proxy, ca, "svc.test", port, sni="a.test", check_hostname=False)
    try:
        response = await request(reader, writer, "/whoami", f"svc.test:{port}")
    finally:
        writer.close()
    assert (response.status, response.rule) == (421, "tls: sni mismatch")
    # SNI right, Host header names another (fronting at the HTTP layer).
    reader, writer = await tunnel(proxy, ca, "svc.test", port)
    try:
        response = await request(reader, writer, "/whoami", f"a.test:{port}")
    finally:
        writer.close()
    assert (response.status, response.rule) == (421, "tls: host mismatch")
    # Same host, other port in Host.
    reader, writer = await tunnel(proxy, ca, "svc.test", port)
    try:
        response = await request(reader, writer, "/whoami", "svc.test")
    finally:
        writer.close()
    assert (response.status, response.rule) == (421, "tls: host mismatch")
    # No SNI at all for a name host.
    ctx = client_context(ca.cert_path, check_hostname=False)
    reader, writer = await open_tls_tunnel(proxy.socket_path, f"svc.test:{port}", ctx, None)
    try:
        response = await request(reader, writer, "/whoami", f"svc.test:{port}")
    finally:
        writer.close()
    assert (response.status, response.rule) == (421, "tls: no sni")
    assert service_upstream.seen == []
    assert reveals(vault) == []
    await proxy.flush()
    refused = [e for e in sink.read() if not e.allowed]
    assert [e.rule for e in refused] == [
        "tls: sni mismatch",
        "tls: host mismatch",
        "tls: host mismatch",
        "tls: no sni",
    ]
    assert all(e.kind == "service" and e.service == "crm-api" for e in refused)


async def test_secret_exfiltration_to_a_non_service_host(proxy, ca, sink, vault, plain_upstream):
    """The guest asks for its secret to be sent elsewhere: a template in headers and body,
    the service's host in a Host header of a request to another host, a CONNECT elsewhere.
    The proxy never reads a secret for these, so it has no value to send."""
    port = plain_upstream.port
    template = "{{secret:crm_token}}"
    body = f"token={template}".encode()
    response = await send(
        proxy.socket_path,
        (
            f"POST http://a.test:{port}/echo HTTP/1.1\r\nHost: a.test:{port}\r\n"
            f"Authorization: Bearer {template}\r\nX-Api-Key: {template}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body,
    )
    assert response.status == 200 and response.body == body  # sent verbatim, unexpanded
    seen = plain_upstream.seen[-1]
    assert ("authorization", f"Bearer {template}") in seen
    fronted = await get(proxy.socket_path, f"http://a.test:{port}/", host="svc.test")
    assert fronted.status == 400 and fronted.rule == "client: host mismatch"
    status, reader, writer = await connect(proxy.socket_path, f"a.test:{port}")
    try:  # an ordinary tunnel: bytes pass untouched, nothing is added
        assert status.status == 200
        head = f"GET /whoami HTTP/1.1\r\nHost: a.test:{port}\r\nAuthorization: {template}\r\n"
        writer.write(head.encode() + b"\r\n")
        await writer.drain()
        echoed = json.loads((await read_response(reader)).body)
    finally:
        writer.close()
    assert echoed["authorization"] == template
    assert all(TOKEN not in v for seen in plain_upstream.seen for _, v in seen)
    assert reveals(vault) == []
    events = await wait_events(proxy, sink, 3)
    assert [(e.kind, e.host, e.service) for e in events] == [
        ("http", "a.test", None),
        ("malformed", "a.test", None),
        ("connect", "a.test", None),
    ]
    assert events[0].allowed and events[0].secrets == ()


async def test_rules_still_apply_to_service_hosts(proxy, ca, vault, service_upstream):
    port = service_upstream.port
    proxy.update_rules(
        EgressRules.from_lists("block", allow=["svc.test", "basic.test"], deny=["svc.test"])
    )
    response, _reader, writer = await connect(proxy.socket_path, f"svc.test:{port}")
    writer.close()
    assert (response.status, response.rule) == (403, "deny[0] svc.test")
    plain = await get(proxy.socket_path, f"http://svc.test:{port}/whoami")
    assert (plain.status, plain.rule) == (403, "deny[0] svc.test")
    assert service_upstream.seen == [] and reveals(vault) == []


async def test_plain_http_to_a_service_host_is_injected_over_tls(proxy, service_upstream):
    port = service_upstream.port
    response = await get(proxy.socket_path, f"http://svc.test:{port}/whoami")
    assert response.status == 200
    assert_clean(json.dumps(response.headers).encode() + response.body)
    [seen] = service_upstream.seen  # the upstream only speaks TLS: the hop was upgraded
    assert ("authorization", f"Bearer {TOKEN}") in seen


async def test_the_same_host_on_another_port_is_not_a_service(
    proxy, ca, vault, service_upstream, plain_upstream
):
    # a.test resolves to the plain upstream; make a service on a.test's *other* port.
    proxy.update_services(ServiceSet([Service("other", "https://a.test:1", Bearer("crm_token"))]))
    response = await get(proxy.socket_path, f"http://a.test:{plain_upstream.port}/whoami")
    assert response.status == 200
    assert json.loads(response.body)["authorization"] == ""
    assert reveals(vault) == []


async def test_untrusted_upstream_certificate_is_502(
    sockdir, sink, vault, ca, service_upstream, tmp_path
):
    _other_ctx, other_ca = make_upstream_tls(tmp_path / "other", ["svc.test"])
    async with EgressProxy(
        SANDBOX,
        sockdir / "e2.sock",
        EgressRules.from_lists("block", allow=["svc.test"]),
        EgressContext(
            StaticResolver(NAMES),
            sink,
            secrets=VaultSecretReader(vault),
            ca=ca,
            upstream_tls=upstream_tls_context(other_ca),
        ),
        services=services_for(service_upstream.port),
    ) as proxy:
        port = service_upstream.port
        reader, writer = await tunnel(proxy, ca, "svc.test", port)
        try:
            response = await request(reader, writer, "/whoami", f"svc.test:{port}")
        finally:
            writer.close()
    assert response.status == 502
    assert b"not trusted" in response.body
    assert service_upstream.seen == []


async def test_live_service_changes_and_missing_secret(proxy, ca, vault, service_upstream):
    port = service_upstream.port
    reader, writer = await tunnel(proxy, ca, "svc.test", port)
    try:
        ok = await request(reader, writer, "/whoami", f"svc.test:{port}")
        proxy.update_services(ServiceSet())
        gone = await request(reader, writer, "/whoami", f"svc.test:{port}")
    finally:
        writer.close()
    assert ok.status == 200
    assert (gone.status, gone.rule) == (403, "services: not granted")
    # Without the service, the host is an ordinary destination again: a plain tunnel.
    response, _r, writer = await connect(proxy.socket_path, f"svc.test:{port}")
    writer.close()
    assert response.status == 200
    proxy.update_services(
        ServiceSet([Service("crm-api", f"https://svc.test:{port}", Bearer("no_such"))])
    )
    reader, writer = await tunnel(proxy, ca, "svc.test", port)
    try:
        missing = await request(reader, writer, "/whoami", f"svc.test:{port}")
    finally:
        writer.close()
    assert (missing.status, missing.rule) == (503, "services: credential unavailable")
    assert b"no_such" in missing.body
    assert len(service_upstream.seen) == 1


async def test_each_connection_reads_the_secret_and_a_rotation_reaches_the_next_request(
    proxy, ca, vault, service_upstream
):
    """A connection holds the value it read; a secret rotated meanwhile goes with the next
    request of every connection, open or new (read again once, audited), and each
    connection's responses are scrubbed of every value it sent."""
    port, host = service_upstream.port, f"svc.test:{service_upstream.port}"
    new = "tok-Rot8dNw2Kp7Xq9"
    first_reader, first_writer = await tunnel(proxy, ca, "svc.test", port)
    try:
        before = await request(first_reader, first_writer, "/whoami", host)
        held = await request(first_reader, first_writer, "/whoami", host)
        await vault.put("crm_token", new, actor="user:admin")
        second_reader, second_writer = await tunnel(proxy, ca, "svc.test", port)
        try:
            after = await request(second_reader, second_writer, "/whoami", host)
            rotated = await request(first_reader, first_writer, "/whoami", host)
            rotated_held = await request(first_reader, first_writer, "/whoami", host)
        finally:
            second_writer.close()
    finally:
        first_writer.close()
    sent = [[v for k, v in seen if k == "authorization"] for seen in service_upstream.seen]
    assert sent == [
        [f"Bearer {TOKEN}"],
        [f"Bearer {TOKEN}"],
        [f"Bearer {new}"],
        [f"Bearer {new}"],
        [f"Bearer {new}"],
    ]
    for response in (before, held, after, rotated, rotated_held):
        assert response.status == 200 and "****" in json.loads(response.body)["authorization"]
        assert_clean(response.body)
        assert new.encode() not in response.body
    await proxy.flush()
    # One read per connection, and one more by the open connection after the rotation.
    assert reveals(vault) == ["secret:crm_token"] * 3
    assert sorted((d["requests"], d["reads"]) for _r, _w, d in uses(vault)) == [(1, 1), (4, 2)]


async def test_a_deleted_secret_is_not_used_by_an_open_connection(
    proxy, ca, sink, vault, service_upstream
):
    """Revocation: once a secret is deleted, the next request on a connection that holds
    its value is refused (503, nothing sent upstream) and the connection ends."""
    port, host = service_upstream.port, f"svc.test:{service_upstream.port}"
    reader, writer = await tunnel(proxy, ca, "svc.test", port)
    try:
        ok = await request(reader, writer, "/whoami", host)
        await vault.delete("crm_token", actor="user:admin")
        revoked = await request(reader, writer, "/whoami", host)
        assert await reader.read() == b""  # the proxy ended the connection
    finally:
        writer.close()
    assert ok.status == 200
    assert (revoked.status, revoked.rule) == (503, "services: credential unavailable")
    assert b"crm_token" in revoked.body
    assert_clean(revoked.body)
    assert len(service_upstream.seen) == 1
    events = await wait_events(proxy, sink, 3)
    refused = [e for e in events if e.kind == "service" and not e.allowed]
    assert [(e.status, e.rule) for e in refused] == [(503, "services: credential unavailable")]
    assert reveals(vault) == ["secret:crm_token"]  # the failed read reveals nothing
    assert [(d["requests"], d["reads"]) for _r, _w, d in uses(vault)] == [(1, 1)]


async def test_guest_tls_that_does_not_trust_the_ca_fails_and_is_recorded(
    proxy, sink, service_upstream
):
    ctx = ssl.create_default_context()  # the system store, not the installation CA
    with pytest.raises(ssl.SSLCertVerificationError):
        await open_tls_tunnel(
            proxy.socket_path, f"svc.test:{service_upstream.port}", ctx, "svc.test"
        )
    [event] = await wait_events(proxy, sink, 1)
    assert (event.kind, event.rule, event.service) == (
        "connect",
        "tls: client handshake",
        "crm-api",
    )
    assert service_upstream.seen == []


REFLECTING = [
    (Bearer("crm_token"), "svc.test", [TOKEN]),
    (Basic("erp_password", user="agent"), "basic.test", [PASSWORD]),
    (Basic("erp_password", user_secret="erp_user"), "basic.test", [PASSWORD, "agent"]),
    (Header("X-Api-Key", "K {{secret:kb_key}}/{{secret:crm_token}}"), "svc.test", [API_KEY, TOKEN]),
]


@pytest.mark.parametrize("coding", ["identity", "gzip", "deflate", "br"])
@pytest.mark.parametrize(("chunk", "pad"), [(1, 0), (7, 40_000), (65_536, 40_000)])
@pytest.mark.parametrize(
    ("auth", "host", "secrets"),
    REFLECTING,
    ids=["bearer", "basic", "basic-user-secret", "header-two-secrets"],
)
async def test_no_form_of_any_secret_reaches_the_guest(
    proxy, ca, service_upstream, auth, host, secrets, coding, chunk, pad
):
    # The upstream writes back every credential it got in every form a careless service
    # might (see reflected_forms), in headers and in a body encoded with `coding`, sent in
    # `chunk`-byte chunks (forms split across reads); `pad` bytes before them make the body
    # long enough for the scrubber's anchor search.
    port = service_upstream.port
    proxy.update_services(ServiceSet([Service("svc", f"https://{host}:{port}", auth)]))
    reader, writer = await tunnel(proxy, ca, host, port)
    try:
        target = f"/reflect/{coding}/{chunk}/{pad}"
        response = await request(reader, writer, target, f"{host}:{port}")
    finally:
        writer.close()
    assert response.status == 200
    (forms,) = service_upstream.reflected
    sent = b"\n".join(forms.values())
    assert all(leaked(sent, [secret]) == secret for secret in secrets)  # they were all sent
    assert leaked(json.dumps(response.headers).encode(), secrets) is None
    assert leaked(response.body, secrets) is None
    assert "content-encoding" not in response.headers  # decoded, scrubbed, sent plain
    for name in forms:  # the body is all there, each form scrubbed in place
        assert f"\n{name}=[".encode() in response.body
    assert response.body.startswith(b"lorem ipsum "[: min(pad, 12)])


async def test_a_granted_service_is_reachable_without_an_egress_rule_for_its_host(
    sockdir, sink, vault, ca, upstream_tls, service_upstream
):
    """Granted and listed is enough: the service's origin needs no `egress.allow` entry, and
    the grant opens that origin only, through the credential-injecting path. The same host
    on another port is an ordinary destination, governed by the rules (here: refused); a
    `default: ask` policy does not ask for the service."""
    port = service_upstream.port
    asked = []

    async def approver(host, port):
        asked.append((host, port))
        return Answer("denied", by="user:alice")

    async with EgressProxy(
        SANDBOX,
        sockdir / "g.sock",
        EgressRules.from_lists("ask"),
        EgressContext(
            StaticResolver(NAMES),
            sink,
            secrets=VaultSecretReader(vault),
            ca=ca,
            upstream_tls=upstream_tls_context(upstream_tls[1]),
        ),
        services=services_for(port),
    ) as proxy:
        proxy.approvals.approver = approver
        reader, writer = await tunnel(proxy, ca, "svc.test", port)
        try:
            inside = await request(reader, writer, "/whoami", f"svc.test:{port}")
        finally:
            writer.close()
        plain = await get(proxy.socket_path, f"http://svc.test:{port}/whoami")
        other, _r, w = await connect(proxy.socket_path, "svc.test:443")
        w.close()
        other_plain = await get(proxy.socket_path, "http://svc.test:8080/")
        events = await wait_events(proxy, sink, 5)
    assert inside.status == 200 and plain.status == 200
    assert [v for s in service_upstream.seen for k, v in s if k == "authorization"] == [
        f"Bearer {TOKEN}"
    ] * 2
    denied = "default: ask, denied by user:alice"
    assert (other.status, other.rule) == (403, denied)
    assert (other_plain.status, other_plain.rule) == (403, denied)
    assert asked == [("svc.test", 443), ("svc.test", 8080)]  # never the service's origin
    assert [(e.kind, e.decision, e.rule, e.service) for e in events] == [
        ("connect", "allowed", "service: crm-api", "crm-api"),
        ("service", "allowed", "service: crm-api", "crm-api"),
        ("http", "allowed", "service: crm-api", "crm-api"),
        ("connect", "refused", denied, None),
        ("http", "refused", denied, None),
    ]
    assert (
        events[1].reason
        == f"svc.test:{port} is the upstream of service crm-api, granted to this sandbox"
    )
    assert_clean(inside.body + plain.body)
