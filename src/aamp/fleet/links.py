"""`HostLinks`: a replica's links to the sandbox hosts, one `LinkClient` per host and
address, all with this replica's client certificate (`LinkCA.replica_context`).

`verify` is what a registration asks before it is accepted: the host at the address it
announces must answer over the link with the certificate issued for its id — a stolen or
replayed token without the host's key, a host holding someone else's certificate, or one
from another CA is refused there.
"""

from __future__ import annotations

import re

from aamp.errors import InvalidInput
from aamp.fleet.link_ca import LinkCA
from aamp.fleet.link_client import LinkClient
from aamp.fleet.registry import HostRefused

ADDRESS_RE = re.compile(r"^[A-Za-z0-9.-]{1,253}:[0-9]{1,5}$|^\[[0-9a-fA-F:.]{2,45}\]:[0-9]{1,5}$")


def check_address(address: object) -> str:
    if not isinstance(address, str) or not ADDRESS_RE.match(address):
        raise InvalidInput(f"link: {str(address)[:64]!r} is not HOST:PORT")
    if not 0 < int(address.rsplit(":", 1)[1]) < 65536:
        raise InvalidInput(f"link: port of {address!r} is out of range")
    return address


class HostLinks:
    def __init__(self, ca: LinkCA) -> None:
        self.ca = ca  # issues hosts' certificates (`aamp host add`)
        self.tls = ca.replica_context()
        self._clients: dict[tuple[str, str], LinkClient] = {}

    def client(self, host_id: str, address: str) -> LinkClient:
        key = (host_id, address)
        if key not in self._clients:
            self._clients[key] = LinkClient(host_id, address, self.tls)
        return self._clients[key]

    async def verify(self, host_id: str, address: str) -> None:
        """The host at `address` proves it is `host_id` (its link certificate), or
        `HostRefused` naming why."""
        check_address(address)
        probe = LinkClient(host_id, address, self.tls, timeout=10)
        try:
            hello = await probe.hello()
        except Exception as exc:
            raise HostRefused(
                f"host {host_id!r} refused: its link at {address} did not prove it is "
                f"{host_id} with a certificate from this installation's link CA ({exc})"
            ) from None
        finally:
            await probe.close()
        if hello.get("id") != host_id:
            raise HostRefused(f"host {host_id!r} refused: its link answers as {hello.get('id')!r}")

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
