"""The host's own connections to a registered URL (model endpoints): the URL is brought to one
canonical spelling; an IP literal reaches exactly that address whatever its class; a name
reaches public, loopback, private, CGNAT and unique-local addresses only; the transport
resolves once, connects to the checked address, and refuses any other host or port (so a
redirect elsewhere goes nowhere). Connections here go to 127.0.0.1 only; refused ones are
refused before any packet is sent (the static resolver answers without the network)."""

from __future__ import annotations

import http.server
import ipaddress
import re
import threading
from collections.abc import Iterator

import httpx
import pytest
from egress_tls import make_upstream_tls

from aamp.egress.registered import (
    AddressVerdict,
    CheckedTransport,
    ConnectionRefused,
    RegisteredUrl,
    UrlError,
    check_address,
)
from aamp.egress.resolver import StaticResolver


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("http://LLM.Internal:8080/v1/", "http://llm.internal:8080/v1"),
        ("https://llm.internal/v1", "https://llm.internal:443/v1"),
        ("http://10.0.0.5/v1", "http://10.0.0.5:80/v1"),
        ("http://[fd00::1]:8000", "http://[fd00::1]:8000"),
    ],
)
def test_urls_have_one_spelling(text: str, canonical: str) -> None:
    assert RegisteredUrl.parse(text).url == canonical


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("ftp://llm/v1", "expected an http(s) URL"),
        ("http://user:pw@llm/v1", "credentials"),
        ("http://llm/v1?x=1", "query"),
        ("http://2130706433/v1", "write the address as 127.0.0.1"),
        ("http://llm:0/v1", "port"),
        ("http://llm:99999/v1", "port"),
        ("http://ll m/v1", "host"),
        ("http://[fe80::1%25eth0]/v1", "zone"),
    ],
)
def test_bad_urls_are_refused_saying_why(text: str, words: str) -> None:
    with pytest.raises(UrlError, match=re.escape(words)):
        RegisteredUrl.parse(text)


NAME = RegisteredUrl.parse("http://llm.test:8080/v1")


@pytest.mark.parametrize(
    ("address", "allowed", "kind"),
    [
        ("8.8.8.8", True, "public"),
        ("127.0.0.1", True, "loopback"),
        ("10.1.2.3", True, "private"),
        ("100.64.0.9", True, "cgnat"),
        ("fd12::5", True, "unique-local"),
        ("169.254.169.254", False, "metadata"),
        ("::ffff:169.254.169.254", False, "metadata"),
        ("169.254.7.7", False, "link-local"),
        ("fe80::1", False, "link-local"),
        ("224.0.0.1", False, "multicast"),
        ("0.0.0.0", False, "unspecified"),
        ("255.255.255.255", False, "broadcast"),
        ("192.0.2.1", False, "reserved"),
    ],
)
def test_a_name_reaches_only_some_address_classes(address: str, allowed: bool, kind: str) -> None:
    verdict = check_address("model endpoint llm", NAME, ipaddress.ip_address(address))
    assert (verdict.allowed, verdict.kind.value) == (allowed, kind)
    assert verdict.reason.startswith("model endpoint llm: llm.test resolved to")
    if not allowed:
        assert str(ipaddress.ip_address(address)) in verdict.reason
        assert f"{kind} address" in verdict.reason
        assert "register the URL with the IP address itself" in verdict.reason


def test_an_ip_literal_reaches_exactly_that_address() -> None:
    url = RegisteredUrl.parse("http://169.254.169.254:8080/v1")
    exact = check_address("e", url, ipaddress.ip_address("169.254.169.254"))
    assert exact.allowed and exact.kind.value == "metadata"
    other = check_address("e", url, ipaddress.ip_address("8.8.8.8"))
    assert not other.allowed and "is not 169.254.169.254" in other.reason


class _Redirecting(http.server.BaseHTTPRequestHandler):
    """/ok answers; /away redirects to another host name on the same port."""

    def do_GET(self) -> None:
        if self.path == "/away":
            self.send_response(302)
            self.send_header("Location", f"http://other.test:{self.server.server_port}/ok")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"reached"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirecting)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


async def test_the_transport_connects_to_the_checked_address_only(server) -> None:
    port = server.server_address[1]
    resolver = StaticResolver(
        {"llm.test": ["127.0.0.1"], "other.test": ["127.0.0.1"], "imds.test": ["169.254.169.254"]}
    )
    seen: list[tuple[list[AddressVerdict], AddressVerdict | None]] = []

    async def on_connect(verdicts: list[AddressVerdict], used: AddressVerdict | None) -> None:
        seen.append((verdicts, used))

    url = RegisteredUrl.parse(f"http://llm.test:{port}/v1")
    transport = CheckedTransport("model endpoint llm", url, resolver, on_connect=on_connect)
    async with httpx.AsyncClient(transport=transport, follow_redirects=True) as c:
        assert (await c.get(f"http://llm.test:{port}/ok")).text == "reached"
        [(verdicts, used)] = seen
        assert used is not None and str(used.address) == "127.0.0.1"
        assert used.kind.value == "loopback"
        # A redirect to another host — even one resolving to the same address — goes nowhere.
        with pytest.raises(ConnectionRefused, match=re.escape("connects only to llm.test")):
            await c.get(f"http://llm.test:{port}/away")
        with pytest.raises(ConnectionRefused, match=re.escape(f"not llm.test:{port + 1}")):
            await c.get(f"http://llm.test:{port + 1}/ok")
    bad = RegisteredUrl.parse(f"http://imds.test:{port}/v1")
    transport = CheckedTransport("model endpoint imds", bad, resolver, on_connect=on_connect)
    async with httpx.AsyncClient(transport=transport) as c:
        with pytest.raises(
            ConnectionRefused, match=re.escape("169.254.169.254 is a metadata address")
        ):
            await c.get(f"http://imds.test:{port}/ok")
    verdicts, used = seen[-1]
    assert used is None and [v.allowed for v in verdicts] == [False]


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args: object) -> None:
        pass


async def test_tls_is_verified_for_the_urls_name_at_the_checked_address(
    tmp_path, monkeypatch
) -> None:
    """The connection goes to the address the name resolved to, and TLS verifies the
    certificate for the name in the URL (with the site's CA from SSL_CERT_FILE)."""
    context, ca = make_upstream_tls(tmp_path, ["llm.test"])
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    resolver = StaticResolver({"llm.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    try:
        for name, works in (("llm.test", True), ("other.test", False)):
            url = RegisteredUrl.parse(f"https://{name}:{port}/v1")
            async with httpx.AsyncClient(transport=CheckedTransport("e", url, resolver)) as c:
                if works:
                    assert (await c.get(f"https://{name}:{port}/")).text == "hello"
                else:
                    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                        await c.get(f"https://{name}:{port}/")
    finally:
        srv.shutdown()
        srv.server_close()
