"""`LinkCA`: the installation's CA for the link between control-plane replicas and sandbox
hosts — a key and purpose of its own, separate from the egress CA that guests trust.

Kept under `$AAMP_HOME/link-ca` (the same files and locking as `aamp.egress.ca`), which every
replica shares as it shares the vault key. It issues two kinds of certificate:

- a host's (`issue_host`, at `aamp host add`): SAN `ID.link.aamp.invalid`, extended key
  usage *server only*; the host serves its link with it, and a replica dialling host ID checks
  that exact name, so a host holding another host's certificate is refused;
- a replica's (`replica_context`, made at each start, its key only in memory): extended key
  usage *client only*, so a host's certificate can never open another host's link as if it
  were a replica (OpenSSL checks the purpose of a client certificate).
"""

from __future__ import annotations

import datetime as dt
import secrets
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aamp.config import Settings
from aamp.egress.ca import LEAF_BACKDATE, InstallationCA, load_pem_chain

LINK_CA_DIRNAME = "link-ca"
HOST_CERT_VALIDITY = dt.timedelta(days=397)
REPLICA_CERT_VALIDITY = dt.timedelta(days=30)  # made again at every start


def link_name(host_id: str) -> str:
    """The name a host's link certificate carries and a replica checks."""
    return f"{host_id}.link.aamp.invalid"


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class LinkCA(InstallationCA):
    COMMON_NAME = "aamp link CA"

    @classmethod
    def of(cls, settings: Settings) -> LinkCA:
        ca = cls.load_or_create(settings.home / LINK_CA_DIRNAME)
        assert isinstance(ca, LinkCA)
        return ca

    def _issue(
        self, name: str, usage: x509.ObjectIdentifier, validity: dt.timedelta
    ) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - LEAF_BACKDATE)
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)

    def issue_host(self, host_id: str) -> tuple[bytes, bytes]:
        """A host's link certificate and key (PEM), for `aamp host add` to hand over once."""
        return self._issue(link_name(host_id), ExtendedKeyUsageOID.SERVER_AUTH, HOST_CERT_VALIDITY)

    def replica_context(self) -> ssl.SSLContext:
        """A replica's client context: trusts only this CA, presents a fresh client
        certificate whose key never leaves this process, checks the host's name."""
        name = f"replica-{secrets.token_hex(6)}.link.aamp.invalid"
        cert, key = self._issue(name, ExtendedKeyUsageOID.CLIENT_AUTH, REPLICA_CERT_VALIDITY)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_verify_locations(
            cadata=self.certificate.public_bytes(serialization.Encoding.PEM).decode()
        )
        load_pem_chain(ctx, key + cert, self.directory)
        return ctx
