"""The installation CA: files, modes, the CA certificate's shape, leaves that verify only
for their host, and a real TLS handshake with a client that trusts only this CA."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import ssl
import stat

import pytest
from cryptography import x509
from cryptography.x509 import DNSName, IPAddress
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from aamp.config import Settings
from aamp.egress.ca import CAError, InstallationCA, ca_cert_path


def _settings(tmp_path) -> Settings:
    home = tmp_path / "home"
    return Settings(home=home, runtime_dir=tmp_path / "run", image_dir=home / "images")


def _verify(ca: InstallationCA, leaf: x509.Certificate, name) -> None:
    store = Store([ca.certificate])
    PolicyBuilder().store(store).build_server_verifier(name).verify(leaf, [])


def test_created_at_first_use_with_private_key_0600(tmp_path):
    settings = _settings(tmp_path)
    path = ca_cert_path(settings)
    directory = settings.home / "ca"
    assert path == directory / "ca.crt"
    assert stat.S_IMODE((directory / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca and basic.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and not usage.digital_signature
    # The second use loads the same CA; nothing is re-created.
    before = path.read_bytes(), (directory / "ca.key").read_bytes()
    assert ca_cert_path(settings) == path
    assert (path.read_bytes(), (directory / "ca.key").read_bytes()) == before
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_a_widened_key_or_a_lost_file_is_refused(tmp_path):
    directory = tmp_path / "ca"
    InstallationCA.load_or_create(directory)
    os.chmod(directory / "ca.key", 0o644)
    with pytest.raises(CAError, match="must be 0600"):
        InstallationCA.load_or_create(directory)
    os.chmod(directory / "ca.key", 0o600)
    (directory / "ca.crt").unlink()
    with pytest.raises(CAError, match=r"ca\.crt is missing"):
        InstallationCA.load_or_create(directory)
    assert not (directory / "ca.crt").exists()  # nothing was silently re-made


def test_leaf_verifies_only_for_its_host(tmp_path):
    ca = InstallationCA.load_or_create(tmp_path / "ca")
    leaf = ca.leaf_certificate("crm.internal.example")
    _verify(ca, leaf, DNSName("crm.internal.example"))
    for other in ("other.example", "x.crm.internal.example", "internal.example"):
        with pytest.raises(VerificationError):
            _verify(ca, leaf, DNSName(other))
    validity = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    assert validity.total_seconds() <= 2 * 24 * 3600
    ip_leaf = ca.leaf_certificate("10.0.0.5")
    _verify(ca, ip_leaf, IPAddress(ipaddress.ip_address("10.0.0.5")))
    # A leaf from another installation's CA does not verify against this one.
    stranger = InstallationCA.load_or_create(tmp_path / "other").leaf_certificate(
        "crm.internal.example"
    )
    with pytest.raises(VerificationError):
        _verify(ca, stranger, DNSName("crm.internal.example"))


def test_server_context_is_cached_and_speaks_http11(tmp_path):
    ca = InstallationCA.load_or_create(tmp_path / "ca")
    assert ca.server_context("a.test") is ca.server_context("a.test")
    assert ca.server_context("a.test") is not ca.server_context("b.test")

    async def handshake(server_name: str) -> str:
        async def serve(reader, writer):
            try:
                await writer.start_tls(ca.server_context("svc.test"))
                writer.write(b"ok")
                await writer.drain()
            except (ssl.SSLError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            client = ssl.create_default_context(cafile=str(ca.cert_path))
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client, server_hostname=server_name
            )
            data = await reader.read()
            writer.close()
            return data.decode()
        finally:
            server.close()

    assert asyncio.run(handshake("svc.test")) == "ok"
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        asyncio.run(handshake("other.test"))
