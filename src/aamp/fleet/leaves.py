"""`HostLeaves`: the one decision on a sandbox host's request for a leaf certificate, made by
a replica for the host whose link it dialled (so the host is proven by its certificate), and
signed with the installation's egress CA, whose key stays with the replicas (beside the
vault's) — a host never holds it, so every guest of the installation trusts one CA.

A request names a sandbox, one of its services, the service's host name and a certificate
signing request (PEM) for a key the host made. It is granted only if the sandbox is recorded
live on exactly that host, in the host's current life, the service is among those its create
was granted (`sandboxes.services`), the service's current definition is HTTPS at exactly that
host, the request's signature is valid, its key is EC P-256, and every name it carries (its
common name, its subject alternative names) is that host. The certificate is then built
here, not copied from the request — that one name, server authentication only, valid for
`HOST_LEAF_VALIDITY` — and `certificate.issued` (allow) is recorded; refused,
`certificate.refused` (deny) is recorded with the rule and the host told the rule only.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from aamp.audit import AuditSink
from aamp.egress.ca import InstallationCA
from aamp.egress.intercept import tls_server_name
from aamp.egress.services import Service
from aamp.errors import NotFound
from aamp.fleet.credentials import ask_names, granted_refusal
from aamp.store import Store

log = logging.getLogger(__name__)

HOST_LEAF_VALIDITY = dt.timedelta(hours=1)
MAX_CSR = 4096


def _csr_names(csr: x509.CertificateSigningRequest) -> list[str]:
    names = [str(a.value) for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return names
    for general in san:
        if isinstance(general, x509.DNSName | x509.IPAddress):
            names.append(str(general.value))
        else:  # a URI, an e-mail address, ...: nothing a service host is
            names.append(repr(general)[:100])
    return names


class HostLeaves:
    def __init__(
        self,
        store: Store,
        service_of: Callable[[str], Service],
        ca: InstallationCA,
        audit: AuditSink,
    ) -> None:
        """`service_of(name)` (blocking): a service's current definition, `NotFound` if
        there is no such service (the catalog's)."""
        self.store, self.service_of, self.ca, self.audit = store, service_of, ca, audit

    def refusal(
        self, host_id: str, sandbox_id: str, service: str, name: str, csr_pem: object
    ) -> tuple[str | None, x509.CertificateSigningRequest | None]:
        """(Blocking.) Why `host_id` may not have a leaf for `name` for `sandbox_id`'s
        `service` from `csr_pem` (None if it may), and the request read."""
        why = granted_refusal(self.store, host_id, sandbox_id, service)
        if why is not None:
            return why, None
        try:
            definition = self.service_of(service)
        except NotFound:
            return f"service {service} no longer exists", None
        if not definition.tls or tls_server_name(definition.host) != name:
            return f"service {service} is not HTTPS at {name}", None
        if not isinstance(csr_pem, str) or len(csr_pem) > MAX_CSR:
            return "a certificate request is a PEM CSR of at most 4096 characters", None
        try:
            csr = x509.load_pem_x509_csr(csr_pem.encode())
            valid = csr.is_signature_valid
        except ValueError:
            return "the certificate request is not a valid CSR", None
        if not valid:
            return "the certificate request's signature is not valid", None
        key = csr.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
            return "the certificate request's key is not EC P-256", None
        try:
            others = sorted({n for n in _csr_names(csr) if n != name})
        except (ValueError, x509.DuplicateExtension, x509.UnsupportedGeneralNameType):
            return "the certificate request's extensions cannot be read", None
        if others:
            # Shown escaped: a name is the host's text, and a refusal must stay recordable.
            shown = ", ".join(ascii(n)[:66] for n in others[:5])
            return f"the certificate request names more than {name}: {shown}", None
        return None, csr

    async def decide(self, host_id: str, ask: dict[str, Any]) -> dict[str, str]:
        """The answer to one request of `host_id`: `{"certificate": PEM}` or
        `{"refused": rule}`."""
        names = ask_names(ask, ("sandbox", "service", "name"))
        csr: x509.CertificateSigningRequest | None = None
        if names is None:
            why: str | None = "a certificate request names a sandbox, a service and a host"
            sandbox_id = service = name = "?"
        else:
            sandbox_id, service, name = names
            try:
                why, csr = await self.store.run(
                    self.refusal, host_id, sandbox_id, service, name, ask.get("csr")
                )
            except Exception:  # whatever a request's bytes make fail is refused, recorded
                log.exception("reading a certificate request of host %s", host_id)
                why, csr = "the certificate request cannot be read", None
        details = {"sandbox": sandbox_id, "name": name, "host": host_id}
        if why is not None or csr is None:
            await self.audit.record(
                actor=f"host:{host_id}",
                action="certificate.refused",
                resource=f"service:{service}",
                decision="deny",
                reason=why or "refused",
                details=details,
            )
            return {"refused": why or "refused"}
        key = csr.public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey)
        cert = self.ca.leaf_certificate(name, public_key=key, validity=HOST_LEAF_VALIDITY)
        await self.audit.record(
            actor=f"host:{host_id}",
            action="certificate.issued",
            resource=f"service:{service}",
            decision="allow",
            reason=f"a leaf for {name}, the host of service {service} granted to {sandbox_id}",
            details={
                **details,
                "serial": format(cert.serial_number, "x"),
                "not_after": cert.not_valid_after_utc.isoformat(),
            },
        )
        return {"certificate": cert.public_bytes(serialization.Encoding.PEM).decode()}
