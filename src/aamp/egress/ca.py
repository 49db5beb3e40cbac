"""The installation's CA: the one certificate guests trust for intercepted service hosts.

Created at first use under `settings.home / "ca"`: `ca.key` (EC P-256, PKCS#8 PEM, mode 0600,
in a 0700 directory) and `ca.crt` (self-signed, readable; the image builder bakes it into every
guest image). Two processes starting at once are serialised by a lock file, and each file is
written to a temporary name and renamed, so a reader never sees half a key.

The CA certificate says `CA:TRUE, pathlen:0` (it signs leaves, never another CA) and only
`keyCertSign`/`cRLSign`. It carries no name constraints: the hosts it must vouch for are the
service upstreams, which an admin adds and removes long after the CA (and the images that trust
it) were made, so any constraint written at creation would break the next service. Its reach is
bounded instead by where it is trusted — guest images only, never the host — and by the
proxy, which mints a leaf only for a host that is a granted service of that sandbox.

Leaf certificates are minted on demand for one host (SAN = that host, DNS name or IP), valid
for `LEAF_VALIDITY` (a day; a little back-dated for clock skew), and cached in memory as ready
`ssl.SSLContext`s until shortly before they expire (`LeafCache`). The leaf's key never touches
the disk: the PEM is handed to OpenSSL through an anonymous memfd (a 0600 file in the CA
directory, removed at once, where memfd does not exist).

A proxy takes its leaves from a `LeafSource` (`context_for(host)`): the CA itself where the CA
key is (a replica's own host), or, on a sandbox host on another machine, a source that asks a
replica to sign a certificate for a key it made (`aamp.fleet.host_outbox.LinkLeaves`; the
replica signs with `leaf_certificate(..., public_key=...)` only for a sandbox's granted
service: `aamp.fleet.leaves`). So every guest of the installation trusts one CA, and its key
stays where the vault's key is.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import ipaddress
import os
import ssl
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aamp.config import Settings
from aamp.egress.tls_streams import harden

CA_DIRNAME = "ca"
CA_KEY = "ca.key"
CA_CERT = "ca.crt"
GIVEN_CA_CERT = "installation-ca.crt"
CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=1)
LEAF_BACKDATE = dt.timedelta(minutes=5)
LEAF_RENEW_BEFORE = dt.timedelta(hours=1)
LEAF_CACHE_SIZE = 256


class CAError(RuntimeError):
    """The CA files cannot be used as they are; the message names the file and why."""


def ca_dir(settings: Settings) -> Path:
    return settings.home / CA_DIRNAME


def given_ca_cert_path(settings: Settings) -> Path:
    """Where a sandbox host keeps the installation's CA certificate it was given at
    registration (public; a host holds no CA key)."""
    return settings.home / GIVEN_CA_CERT


def ca_cert_path(settings: Settings) -> Path:
    """The CA certificate's path, creating the CA first if this installation has none yet —
    or, on a sandbox host (no CA of its own, the installation's certificate given at
    registration: `given_ca_cert_path`), that certificate, so its images trust the CA the
    replicas sign its leaves with.

    This is what the image builder's `ca_cert` parameter takes."""
    given = given_ca_cert_path(settings)
    if given.is_file() and not (ca_dir(settings) / CA_KEY).exists():
        return given
    return InstallationCA.load_or_create(ca_dir(settings)).cert_path


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    fd = os.open(directory / ".lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # the umask must not widen or narrow it
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def load_pem_chain(ctx: ssl.SSLContext, pem: bytes, scratch_dir: Path) -> None:
    """`load_cert_chain` from bytes: OpenSSL's Python binding only reads files."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        fd = memfd_create("aamp-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, pem)
            path = f"/proc/self/fd/{fd}"
            ctx.load_cert_chain(path, path)
        finally:
            os.close(fd)
        return
    tmp = scratch_dir / f".leaf.{os.getpid()}.{threading.get_ident()}.pem"  # pragma: no cover
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, pem)
        os.close(fd)
        ctx.load_cert_chain(str(tmp), str(tmp))
    finally:
        tmp.unlink(missing_ok=True)


_SNI_ATTR = "aamp_client_sni"


def _record_sni(ssl_object: ssl.SSLSocket, server_name: str | None, _ctx: ssl.SSLContext) -> None:
    setattr(ssl_object, _SNI_ATTR, server_name)


def client_sni(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
    """The server name a client sent in its TLS hello (None if it sent none)."""
    return getattr(ssl_object, _SNI_ATTR, None)


@dataclass
class _Leaf:
    context: ssl.SSLContext
    not_after: dt.datetime


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """What a key may do: the CA's signs certificates (and CRLs) only, a leaf's signs its TLS
    handshakes only."""
    return x509.KeyUsage(
        digital_signature=not signs_certificates,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


class LeafSource(Protocol):
    """Where a proxy gets the TLS server context it presents to its guest for a service
    host. Raises `LeafRefused` when it may not have one (the tunnel is then refused)."""

    async def context_for(self, host: str) -> ssl.SSLContext: ...


class LeafRefused(Exception):
    """No leaf for this host (a replica refused to sign one, or did not answer)."""


def leaf_context(cert_pem: bytes, key_pem: bytes, scratch_dir: Path) -> ssl.SSLContext:
    """A server-side TLS context presenting one leaf: HTTP/1.1 only (ALPN), TLS 1.2 or newer,
    no renegotiation; the server name the client sent (SNI) is kept on the connection's SSL
    object (read it with `client_sni`). The key reaches OpenSSL through memory only."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    harden(ctx)
    load_pem_chain(ctx, cert_pem + key_pem, scratch_dir)
    ctx.sni_callback = _record_sni
    return ctx


class LeafCache:
    """Ready leaf contexts by host, each until `renew_before` its expiry; least recently used
    dropped past `size`."""

    def __init__(self, renew_before: dt.timedelta, size: int = LEAF_CACHE_SIZE) -> None:
        self.renew_before, self.size = renew_before, size
        self._leaves: OrderedDict[str, _Leaf] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, host: str) -> ssl.SSLContext | None:
        with self._lock:
            leaf = self._leaves.get(host)
            if leaf is None or leaf.not_after - self.renew_before <= _now():
                return None
            self._leaves.move_to_end(host)
            return leaf.context

    def put(self, host: str, context: ssl.SSLContext, not_after: dt.datetime) -> None:
        with self._lock:
            self._leaves[host] = _Leaf(context, not_after)
            self._leaves.move_to_end(host)
            while len(self._leaves) > self.size:
                self._leaves.popitem(last=False)


def san_for(host: str) -> x509.GeneralName:
    """The subject alternative name for `host` (a canonical host name or IP literal)."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


class InstallationCA:
    """The CA's key and certificate, and the leaf contexts minted from them. Usage::

    ca = InstallationCA.load_or_create(settings.home / "ca")
    ctx = ca.server_context("crm.internal.example")   # for asyncio start_tls(server_side)
    """

    # Written into the certificate at creation; a subclass with another purpose names it.
    COMMON_NAME = "aamp installation CA"

    def __init__(self, directory: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate):
        self.directory = directory
        self._key = key
        self.certificate = cert
        self._leaves = LeafCache(LEAF_RENEW_BEFORE)
        # One key for every leaf of this process: minting then costs one signature, not a
        # key generation, and the key lives only in this process's memory.
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key_pem = self._leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        self._ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())

    def __repr__(self) -> str:
        return f"InstallationCA({str(self.directory)!r})"

    @property
    def cert_path(self) -> Path:
        return self.directory / CA_CERT

    @property
    def key_path(self) -> Path:
        return self.directory / CA_KEY

    @classmethod
    def load_or_create(cls, directory: Path) -> InstallationCA:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(directory, 0o700)
        with _locked(directory):
            key_path, cert_path = directory / CA_KEY, directory / CA_CERT
            if not key_path.exists() and not cert_path.exists():
                cls._create(key_path, cert_path)
            return cls._load(directory, key_path, cert_path)

    @classmethod
    def _create(cls, key_path: Path, cert_path: Path) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "aamp installation"),
                x509.NameAttribute(NameOID.COMMON_NAME, cls.COMMON_NAME),
            ]
        )
        now = _now()
        public = key.public_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - LEAF_BACKDATE)
            .not_valid_after(now + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(signs_certificates=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _write_atomically(key_path, key_pem, 0o600)
        _write_atomically(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)

    @classmethod
    def _load(cls, directory: Path, key_path: Path, cert_path: Path) -> InstallationCA:
        for path in (key_path, cert_path):
            if not path.exists():
                raise CAError(f"{path} is missing (the other CA file exists); restore it")
        mode = key_path.stat().st_mode & 0o777
        if mode & 0o077:
            raise CAError(f"{key_path} has mode {mode:o}; the CA key must be 0600")
        try:
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        except ValueError as exc:
            raise CAError(f"cannot read the CA in {directory}: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise CAError(f"{key_path} is not an EC private key")
        if cert.public_key() != key.public_key():
            raise CAError(f"{cert_path} does not belong to {key_path}")
        return cls(directory, key, cert)

    # -- leaves ----------------------------------------------------------------------------

    def leaf_certificate(
        self,
        host: str,
        now: dt.datetime | None = None,
        *,
        public_key: ec.EllipticCurvePublicKey | None = None,
        validity: dt.timedelta = LEAF_VALIDITY,
    ) -> x509.Certificate:
        """A fresh leaf for `host` (a canonical host name or IP literal), signed by this CA,
        for `public_key` (default: this process's leaf key)."""
        now = now or _now()
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.certificate.subject)
            .public_key(public_key or self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - LEAF_BACKDATE)
            .not_valid_after(now + validity)
            .add_extension(x509.SubjectAlternativeName([san_for(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(signs_certificates=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(self._ski),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server-side TLS context presenting a leaf for `host` (cached until near expiry;
        `leaf_context` says what it allows)."""
        cached = self._leaves.get(host)
        if cached is not None:
            return cached
        cert = self.leaf_certificate(host)
        pem = cert.public_bytes(serialization.Encoding.PEM)
        ctx = leaf_context(pem, self._leaf_key_pem, self.directory)
        self._leaves.put(host, ctx, cert.not_valid_after_utc)
        return ctx

    async def context_for(self, host: str) -> ssl.SSLContext:
        """(`LeafSource`.) The CA's own leaf for `host`."""
        return self.server_context(host)
