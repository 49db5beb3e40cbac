"""`HostLinks`: a replica's links to the sandbox hosts, one `LinkClient` per host and
address, all with this replica's client certificate (`LinkCA.replica_context`).

`verify` is what a registration asks before it is accepted: the host at the address it
announces must answer over the link with the certificate issued for its id, and serve there
the proof (a fresh random nonce) that the registration carries. The certificate refuses a
stolen or replayed token without the host's key, a host holding someone else's certificate,
or one from another CA; the proof refuses a stolen token that names the real host's link (the
real host serves only the nonce of its own registration in flight, and only to replicas).
A refusal says only that the link did not prove the host; why (the dial's error, the answer)
is `LinkNotProven.detail`, for the audit record alone — a registration is no port scanner.

Every host answer a client refuses (`LinkClient.refuse`: too large, a status the link does not
use, malformed, a bad sandbox id) is audited here (`host.answer_refused`, actor `host:ID`),
and so is a host's refusal of a create's packages (`host.packages_refused`).
The clients are closed when the replica stops (`close`, from the API's lifespan).
"""

from __future__ import annotations

import hmac
import re

from aamp.audit import AuditSink
from aamp.errors import InvalidInput
from aamp.fleet.link_ca import LinkCA
from aamp.fleet.link_client import LinkClient
from aamp.fleet.registry import HostRefused

PROOF_RE = re.compile(r"^[A-Za-z0-9_-]{32,128}\Z")
ADDRESS_RE = re.compile(r"^[A-Za-z0-9.-]{1,253}:[0-9]{1,5}\Z|^\[[0-9a-fA-F:.]{2,45}\]:[0-9]{1,5}\Z")


def check_address(address: object) -> str:
    if not isinstance(address, str) or not ADDRESS_RE.match(address):
        raise InvalidInput(f"link: {str(address)[:64]!r} is not HOST:PORT")
    if not 0 < int(address.rsplit(":", 1)[1]) < 65536:
        raise InvalidInput(f"link: port of {address!r} is out of range")
    return address


class LinkNotProven(HostRefused):
    """A registration's link did not prove the host; `detail` (why) is for the audit only."""

    def __init__(self, host_id: str, detail: str) -> None:
        super().__init__(
            f"host {host_id!r} refused: its link did not prove it is {host_id} (the"
            " certificate from this installation's link CA and this registration's proof)"
        )
        self.detail = detail[:500]


class HostLinks:
    def __init__(self, ca: LinkCA, audit: AuditSink | None = None) -> None:
        self.ca = ca  # issues hosts' certificates (`aamp host add`)
        self.tls = ca.replica_context()
        self.audit = audit
        self._clients: dict[tuple[str, str], LinkClient] = {}

    async def refused(self, host_id: str, why: str) -> None:
        """A host's answer was refused (`LinkClient.refuse`): audited, actor `host:ID`."""
        await self._deny(host_id, "host.answer_refused", why)

    async def packages_refused(self, host_id: str, why: str) -> None:
        """A host could not take a create's packages (a wheel refused, the layer not built):
        audited as its refusal (`host.packages_refused`, actor `host:ID`)."""
        await self._deny(host_id, "host.packages_refused", why)

    async def _deny(self, host_id: str, action: str, why: str) -> None:
        if self.audit is not None:
            await self.audit.record(
                actor=f"host:{host_id}",
                action=action,
                resource=f"host:{host_id}",
                decision="deny",
                reason=why[:1000],
            )

    def client(self, host_id: str, address: str) -> LinkClient:
        key = (host_id, address)
        if key not in self._clients:
            self._clients[key] = LinkClient(host_id, address, self.tls, refused=self.refused)
        return self._clients[key]

    async def verify(self, host_id: str, address: str, proof: object) -> None:
        """The host at `address` proves it is `host_id` (its link certificate) and that this
        registration is its own (it serves `proof`), or `LinkNotProven`."""
        check_address(address)
        if not isinstance(proof, str) or not PROOF_RE.match(proof):
            raise LinkNotProven(host_id, "the registration carries no valid proof")
        probe = LinkClient(host_id, address, self.tls, timeout=10)
        try:
            hello = await probe.hello()
        except Exception as exc:
            raise LinkNotProven(host_id, f"dialling {address}: {exc}") from None
        finally:
            await probe.close()
        if hello.get("id") != host_id:
            raise LinkNotProven(host_id, f"its link at {address} answers as {hello.get('id')!r}")
        served = hello.get("proof")
        if not isinstance(served, str) or not hmac.compare_digest(served.encode(), proof.encode()):
            raise LinkNotProven(
                host_id, f"the host at {address} serves another proof: not its registration"
            )

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
