"""A client connection's service credentials: read once per connection, counted, recorded once.

The vault read behind a credential is audited durably before the value is returned (one
`secret.reveal` per secret), and that append dominated a small service call's latency when
it happened per request. So a connection reads a service's secrets on its first request to
that service and holds the built `Credential` (headers and scrub forms) in this object only:
never on disk, in a log, a repr or another connection, and dropped when the connection ends.
Every later request on the connection to the same service definition gets the same
credential; a changed definition (another secret, another header) is read anew. A read that
fails holds nothing (and its refusal ends the connection).

When the connection ends, one `secret.use` audit record per service it called says how many
requests got the credential, by method (the egress ledger has each request). A secret rotated
or deleted while a connection is open: that connection keeps the value it read (its responses
are scrubbed of that value, the one it sends); the next connection reads the new one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from aamp.egress.services import Credential, SecretReader, Service, render


@dataclass
class _Held:
    credential: Credential = field(repr=False)
    purpose: str
    methods: Counter[str] = field(default_factory=Counter)


class HeldCredentials:
    """The credentials one client connection holds, by service definition."""

    def __init__(self, reader: SecretReader, sandbox_id: str, connection: int):
        self._reader = reader
        self._where = f"egress {sandbox_id}: connection {connection}"
        self._held: dict[Service, _Held] = {}

    async def for_request(self, service: Service, method: str, host: object) -> Credential:
        """The service's credential for one request: read on the first, then held.

        Raises `CredentialError` (names secrets, never values) when it cannot be built."""
        held = self._held.get(service)
        if held is None:
            purpose = f"{self._where}: service {service.name} (first request {method} {host})"
            held = _Held(await render(service, self._reader, purpose), purpose)
            self._held[service] = held
        held.methods[method] += 1
        return held.credential

    def __bool__(self) -> bool:
        return bool(self._held)

    async def close(self) -> None:
        """Forget the values and write one `secret.use` record per service called."""
        held, self._held = self._held, {}
        for service, use in held.items():
            details = {
                "service": service.name,
                "secrets": list(use.credential.secret_names),
                "requests": sum(use.methods.values()),
                "methods": dict(use.methods),
            }
            await self._reader.record_use(service.name, purpose=use.purpose, details=details)
