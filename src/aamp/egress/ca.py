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
`ssl.SSLContext`s until shortly before they expire. The leaf's key never touches the disk: the
PEM is handed to OpenSSL through an anonymous memfd (a 0600 file in the CA directory, removed
at once, where memfd does not exist).
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

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aamp.config import Settings
from aamp.egress.tls_socket import harden

CA_DIRNAME = "ca"
CA_KEY = "ca.key"
CA_CERT = "ca.crt"
CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=1)
LEAF_BACKDATE = dt.timedelta(minutes=5)
LEAF_RENEW_BEFORE = dt.timedelta(hours=1)
LEAF_CACHE_SIZE = 256


class CAError(RuntimeError):
    """The CA files cannot be used as they are; the message names the file and why."""


def ca_dir(settings: Settings) -> Path:
    return settings.home / CA_DIRNAME


def ca_cert_path(settings: Settings) -> Path:
    """The CA certificate's path, creating the CA first if this installation has none yet.

    This is what the image builder's `ca_cert` parameter takes."""
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
        self._leaves: OrderedDict[str, _Leaf] = OrderedDict()
        self._lock = threading.Lock()
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

    def leaf_certificate(self, host: str, now: dt.datetime | None = None) -> x509.Certificate:
        """A fresh leaf for `host` (a canonical host name or IP literal), signed by this CA."""
        now = now or _now()
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
        except ValueError:
            san = x509.DNSName(host)
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.certificate.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - LEAF_BACKDATE)
            .not_valid_after(now + LEAF_VALIDITY)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
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
        """A server-side TLS context presenting a leaf for `host` (cached until near expiry).

        HTTP/1.1 only (ALPN), TLS 1.2 or newer, no renegotiation. The server name the client
        sent (SNI) is kept on the connection's SSL object; read it with `client_sni`."""
        now = _now()
        with self._lock:
            leaf = self._leaves.get(host)
            if leaf is not None and leaf.not_after - LEAF_RENEW_BEFORE > now:
                self._leaves.move_to_end(host)
                return leaf.context
        cert = self.leaf_certificate(host, now)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        harden(ctx)
        pem = cert.public_bytes(serialization.Encoding.PEM) + self._leaf_key_pem
        load_pem_chain(ctx, pem, self.directory)
        ctx.sni_callback = _record_sni
        with self._lock:
            self._leaves[host] = _Leaf(ctx, cert.not_valid_after_utc)
            self._leaves.move_to_end(host)
            while len(self._leaves) > LEAF_CACHE_SIZE:
                self._leaves.popitem(last=False)
        return ctx
