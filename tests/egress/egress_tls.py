"""TLS material for interception tests: an upstream CA of the test's own and TLS clients.

The upstream's CA is NOT the installation CA: the proxy must verify the real upstream with the
bundle it is configured with, and the guest-side client must trust only the installation CA.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from egress_client import Response, read_response


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def make_upstream_tls(directory: Path, hosts: list[str]) -> tuple[ssl.SSLContext, Path]:
    """(server context for `hosts`, path of the CA bundle that verifies it)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("upstream test CA"))
        .issuer_name(_name("upstream test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_path = directory / "upstream-ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain = directory / "upstream-leaf.pem"
    chain.write_bytes(
        leaf.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(chain)
    return server, ca_path


def client_context(cafile: Path, *, check_hostname: bool = True) -> ssl.SSLContext:
    """A guest-side client trusting only `cafile` (the installation CA)."""
    ctx = ssl.create_default_context(cafile=str(cafile))
    ctx.check_hostname = check_hostname
    ctx.set_alpn_protocols(["h2", "http/1.1"])  # the proxy must pick http/1.1
    return ctx


async def open_tls_tunnel(
    sock: Path, target: str, ctx: ssl.SSLContext, server_name: str | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """CONNECT `target` through the proxy, then TLS inside it with SNI `server_name`."""
    reader, writer = await asyncio.open_unix_connection(str(sock))
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    await writer.drain()
    async with asyncio.timeout(10):
        response = await read_response(reader, head_only=True)
    if response.status != 200:
        writer.close()
        raise ConnectionRefusedError(f"CONNECT answered {response.status}: {response.headers}")
    await writer.start_tls(ctx, server_hostname=server_name)
    return reader, writer


async def request(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    path: str,
    host: str,
    extra: str = "",
    method: str = "GET",
) -> Response:
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode("latin-1"))
    await writer.drain()
    async with asyncio.timeout(10):
        return await read_response(reader)
