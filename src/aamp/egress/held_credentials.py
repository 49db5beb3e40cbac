"""A client connection's service credentials: read once per connection, counted, recorded once.

The vault read behind a credential is audited durably before the value is returned (one
`secret.reveal` per secret), and that append dominated a small service call's latency when
it happened per request. So a connection reads a service's secrets on its first request to
that service and holds the built `Credential` (headers and scrub forms) in this object only:
never on disk, in a log, a repr or another connection, and dropped when the connection ends.
Every later request on the connection to the same service definition gets the same
credential; a changed definition (another secret, another header) is read anew. A read that
fails holds nothing (and its refusal ends the connection).

Rotation and revocation: before each request the held credential is checked against the
reader's change count of each of its secrets (`SecretReader.changes`, in memory, no audit).
A secret replaced since it was read is read again (audited) and the new value goes with this
request; a deleted one fails that read, so the request is refused (503, `services: credential
unavailable`) and the connection ends. A credential is therefore never used after the change
that replaced or revoked it. After a rotation the connection's responses are scrubbed of the
forms of both values: an upstream may still echo the old one.

When the connection ends, one `secret.use` audit record per service it called says how many
requests got the credential, by method, and how often it was read (the egress ledger has
each request).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from aamp.egress.scrub import SecretForms
from aamp.egress.services import Credential, SecretReader, Service, render


@dataclass
class _Held:
    credential: Credential = field(repr=False)
    purpose: str
    marks: tuple[int, ...]  # the reader's change counts of its secrets, taken before the read
    reads: int = 1
    methods: Counter[str] = field(default_factory=Counter)


class HeldCredentials:
    """The credentials one client connection holds, by service definition."""

    def __init__(self, reader: SecretReader, sandbox_id: str, connection: int):
        self._reader = reader
        self._where = f"egress {sandbox_id}: connection {connection}"
        self._held: dict[Service, _Held] = {}

    async def for_request(self, service: Service, method: str, host: object) -> Credential:
        """The service's credential for one request: read on the first, then held while
        none of its secrets changes.

        Raises `CredentialError` (names secrets, never values) when it cannot be built."""
        held = self._held.get(service)
        marks = self._marks(service)
        if held is None:
            purpose = f"{self._where}: service {service.name} (first request {method} {host})"
            held = _Held(await render(service, self._reader, purpose), purpose, marks)
            self._held[service] = held
        elif held.marks != marks:
            purpose = f"{self._where}: service {service.name} (secret changed, {method} {host})"
            fresh = await render(service, self._reader, purpose)
            old = held.credential.scrub_forms
            both = SecretForms(
                old.exact | fresh.scrub_forms.exact, old.folded | fresh.scrub_forms.folded
            )
            held.credential = dataclasses.replace(fresh, scrub_forms=both)
            held.marks = marks
            held.reads += 1
        held.methods[method] += 1
        return held.credential

    def _marks(self, service: Service) -> tuple[int, ...]:
        return tuple(self._reader.changes(name) for name in service.secret_names)

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
                "reads": use.reads,
            }
            await self._reader.record_use(service.name, purpose=use.purpose, details=details)
