"""The one decision on a sandbox host's request for a leaf certificate (`HostLeaves`), on a
real store (SQLite and PostgreSQL), a real audit log and the installation's real egress CA:
signed only for a sandbox live on that host's current life, an HTTPS service its create was
granted, exactly that service's host, and a CSR whose signature holds and which names
nothing else — the certificate built by the replica (that one name, server authentication,
an hour), for the host's key, and checked against the CA. Every refusal, from a hostile host
asking for a name not granted, another host's sandbox, a lost one, a forged or over-broad
request, is `certificate.refused` (deny) naming the rule; every grant `certificate.issued`."""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from sqlalchemy import text

from aamp.catalog import Catalog
from aamp.egress.ca import InstallationCA, ca_dir, san_for
from aamp.fleet import FleetPlacer, HostFacts, HostRegistry
from aamp.fleet.leaves import HostLeaves
from aamp.fleet.link_ca import LinkCA
from aamp.fleet.links import HostLinks
from aamp.fleet.placement import Need, Placement
from aamp.fleet.sandboxes import Reservation
from aamp.sandbox.wheelhouse import Wheelhouse

NEED = Need(driver="gvisor", image="base", cpus=0.5, memory_mb=256)
KEY = ec.generate_private_key(ec.SECP256R1())


def csr(*names: str, key=KEY, cn: str | None = None) -> str:  # type: ignore[no-untyped-def]
    sans = [san_for(n) for n in names]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn or names[0])])
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    built = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return built.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def _records(store, action: str) -> list:  # type: ignore[no-untyped-def]
    with store.engine.connect() as conn:
        sql = "SELECT actor, decision, reason FROM audit_records WHERE action = :a ORDER BY seq"
        return list(conn.execute(text(sql), {"a": action}).all())


async def test_a_host_gets_leaves_only_for_its_own_sandboxes_granted_https_hosts(
    settings, store, audit
):
    registry = HostRegistry(store)
    for host_id in ("h1", "h2"):
        _, token = registry.add(host_id, by="test")
        registry.register(host_id, token, HostFacts(("gvisor",), 4, 4096, 8, ()))
    placement = Placement(registry)
    placer = FleetPlacer(placement, "rep", HostLinks(LinkCA.of(settings)), Wheelhouse(settings))
    catalog = Catalog(store)
    for name, upstream in (
        ("crm", "https://crm.test"),
        ("erp", "https://erp.test:8443"),
        ("ipsvc", "https://10.77.0.5:8443"),
        ("plain", "http://plain.test"),
    ):
        catalog.put_service(name, upstream=upstream, auth="bearer", secrets=["t"],
                            header_name=None, by="test")  # fmt: skip

    async def place(services: tuple[str, ...], sandbox_id: str) -> None:
        placed = placement.place(NEED, ("h1",))
        await placer.placed(Reservation(placed, NEED), sandbox_id, 3600.0, services)

    await place(("crm", "ipsvc", "plain"), "sb-aaaaaaaaaaaa")
    await place((), "sb-bbbbbbbbbbbb")
    ca = InstallationCA.load_or_create(ca_dir(settings))
    leaves = HostLeaves(store, lambda name: catalog.get_service(name).for_egress(), ca, audit)

    def ask(host, sandbox, service, name, request=None):  # type: ignore[no-untyped-def]
        body = {"sandbox": sandbox, "service": service, "name": name}
        return leaves.decide(host, {**body, "csr": request or csr(name)})

    granted = await ask("h1", "sb-aaaaaaaaaaaa", "crm", "crm.test")
    by_ip = await ask("h1", "sb-aaaaaaaaaaaa", "ipsvc", "10.77.0.5")
    for answer, name in ((granted, "crm.test"), (by_ip, "10.77.0.5")):
        cert = x509.load_pem_x509_certificate(answer["certificate"].encode())
        cert.verify_directly_issued_by(ca.certificate)
        assert cert.public_key() == KEY.public_key()
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(v) for v in sans.get_values_for_type(x509.DNSName)] + [
            str(v) for v in sans.get_values_for_type(x509.IPAddress)
        ] == [name]
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        life = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
        assert dt.timedelta(minutes=55) < life <= dt.timedelta(hours=1)

    # A request whose signature does not hold (its last byte, inside the signature, changed).
    der = bytearray(x509.load_pem_x509_csr(csr("crm.test").encode()).public_bytes(
        serialization.Encoding.DER))  # fmt: skip
    der[-1] ^= 0x01
    forged = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM).decode()
    rsa_request = csr("crm.test", key=rsa.generate_private_key(65537, 2048))
    refused = {
        "a name not granted": await ask("h1", "sb-aaaaaaaaaaaa", "crm", "evil.example"),
        "another service's host": await ask("h1", "sb-aaaaaaaaaaaa", "crm", "erp.test"),
        "an ungranted service": await ask("h1", "sb-aaaaaaaaaaaa", "erp", "erp.test"),
        "a sandbox granted nothing": await ask("h1", "sb-bbbbbbbbbbbb", "crm", "crm.test"),
        "another host's sandbox": await ask("h2", "sb-aaaaaaaaaaaa", "crm", "crm.test"),
        "no sandbox": await ask("h1", "sb-cccccccccccc", "crm", "crm.test"),
        "plain HTTP": await ask("h1", "sb-aaaaaaaaaaaa", "plain", "plain.test"),
        "more names": await ask(
            "h1", "sb-aaaaaaaaaaaa", "crm", "crm.test", csr("crm.test", "bank.example")
        ),
        "another common name": await ask(
            "h1", "sb-aaaaaaaaaaaa", "crm", "crm.test", csr("crm.test", cn="bank.example")
        ),
        "a forged request": await ask("h1", "sb-aaaaaaaaaaaa", "crm", "crm.test", forged),
        "an RSA key": await ask("h1", "sb-aaaaaaaaaaaa", "crm", "crm.test", rsa_request),
        "no request": await leaves.decide(
            "h1", {"sandbox": "sb-aaaaaaaaaaaa", "service": "crm", "name": "crm.test"}
        ),
        "malformed": await leaves.decide("h1", {"sandbox": ["x"]}),
        "a control character": await ask("h1", "sb-aaaaaaaaaaaa", "crm", "crm.test\x1b[31m"),
        # NULs inside the request's own names: refused with the names escaped, so recorded.
        "a NUL in the common name": await ask(
            "h1", "sb-aaaaaaaaaaaa", "crm", "crm.test", csr("crm.test", cn="crm.test\x00.evil")
        ),
        "a NUL in an alternative name": await ask(
            "h1", "sb-aaaaaaaaaaaa", "crm", "crm.test", csr("crm.test", "bank\x00.example")
        ),
    }
    registry.lost_after = 0.0  # both silent from now: marked lost, their sandboxes with them
    assert sorted(h.id for h in registry.mark_lost()) == ["h1", "h2"]
    refused["lost"] = await ask("h1", "sb-aaaaaaaaaaaa", "crm", "crm.test")
    assert all(set(answer) == {"refused"} for answer in refused.values()), refused
    rules = {k: v["refused"] for k, v in refused.items()}
    assert "not HTTPS at evil.example" in rules["a name not granted"]
    assert "not HTTPS at erp.test" in rules["another service's host"]
    assert "service erp is not granted" in rules["an ungranted service"]
    assert "service crm is not granted" in rules["a sandbox granted nothing"]
    assert "not placed on host h2" in rules["another host's sandbox"]
    assert "not placed on host h1" in rules["no sandbox"]
    assert "not HTTPS" in rules["plain HTTP"]
    assert "bank.example" in rules["more names"] and "bank.example" in rules["another common name"]
    assert "signature is not valid" in rules["a forged request"]
    assert "EC P-256" in rules["an RSA key"]
    assert "PEM CSR" in rules["no request"]
    assert "not live" in rules["lost"]
    assert "\\x00" in rules["a NUL in the common name"]
    assert "\\x00" in rules["a NUL in an alternative name"]
    issued = _records(store, "certificate.issued")
    assert [(r.actor, r.decision) for r in issued] == [("host:h1", "allow")] * 2
    denials = _records(store, "certificate.refused")
    assert len(denials) == len(refused) and {d.decision for d in denials} == {"deny"}
    assert {d.actor for d in denials} == {"host:h1", "host:h2"}
