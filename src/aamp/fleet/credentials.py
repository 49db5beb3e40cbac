"""`HostCredentials`: the one decision on a sandbox host's ask for a service credential, made
by a replica for the host whose link it dialled (so the host is proven by its certificate).

An ask names a sandbox, a service and one secret of it. It is granted only if the sandbox is
recorded live on exactly that host, in the host's current life, not past its expiry (the one
rule for every ask and report of a host: `sandboxes.refusal`), the service is among those
its create was granted (`sandboxes.services`, recorded with its placement), and the secret is
one the service's current definition uses. Granted, the value is read through the vault's one
reader (`Vault.reveal`, which audits `secret.reveal` with the host, sandbox and service in its
purpose before it returns the value); refused, `secret.refused` is recorded (deny) with the
rule, and the host is told the rule only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aamp.audit import AuditSink
from aamp.errors import NotFound
from aamp.fleet.sandboxes import granted_services, refusal
from aamp.store import Store
from aamp.store.timestamps import now
from aamp.vault import Vault

MAX_NAME = 64


def granted_refusal(store: Store, host_id: str, sandbox_id: str, service: str) -> str | None:
    """(Blocking.) Why `host_id` may not act for `service` of `sandbox_id` (not placed on
    that host, not live in its current life, the service not granted to its create); None if
    it may. The check every ask of a host begins with (credentials, leaf certificates)."""
    with store.session() as s:
        why = refusal(s, host_id, sandbox_id, now())
        if why is not None:
            return why
        granted = granted_services(s, sandbox_id)
    if service not in granted:
        return f"service {service} is not granted to sandbox {sandbox_id}"
    return None


def ask_names(ask: dict[str, Any], keys: tuple[str, ...]) -> list[str] | None:
    """The names an ask carries under `keys`, or None unless each is a printable string of
    at most `MAX_NAME` characters (a name with a control character could not be recorded:
    the audit refuses it, and every refusal must be)."""
    names = [ask.get(k) for k in keys]
    if all(isinstance(n, str) and 0 < len(n) <= MAX_NAME and n.isprintable() for n in names):
        return names  # type: ignore[return-value]
    return None


class HostCredentials:
    def __init__(
        self,
        store: Store,
        service_secrets: Callable[[str], tuple[str, ...]],
        vault: Vault,
        audit: AuditSink,
    ) -> None:
        """`service_secrets(name)` (blocking): the secret names a service's current
        definition uses, `NotFound` if there is no such service (the catalog's)."""
        self.store, self.service_secrets, self.vault, self.audit = (
            store,
            service_secrets,
            vault,
            audit,
        )

    def refusal(self, host_id: str, sandbox_id: str, service: str, secret: str) -> str | None:
        """(Blocking.) Why `host_id` may not have `secret` of `service` for `sandbox_id`;
        None if it may."""
        why = granted_refusal(self.store, host_id, sandbox_id, service)
        if why is not None:
            return why
        try:
            used = self.service_secrets(service)
        except NotFound:
            return f"service {service} no longer exists"
        if secret not in used:
            return f"service {service} does not use secret {secret}"
        return None

    async def decide(self, host_id: str, ask: dict[str, Any]) -> dict[str, str]:
        """The answer to one ask of `host_id`: `{"value": ...}` or `{"refused": rule}`."""
        names = ask_names(ask, ("sandbox", "service", "secret"))
        if names is None:
            why: str | None = "a credential ask names a sandbox, a service and a secret"
            sandbox_id = service = secret = "?"
        else:
            sandbox_id, service, secret = names  # type: ignore[assignment]
            why = await self.store.run(self.refusal, host_id, sandbox_id, service, secret)
        if why is not None:
            await self.audit.record(
                actor=f"host:{host_id}",
                action="secret.refused",
                resource=f"service:{service}",
                decision="deny",
                reason=why,
                details={"sandbox": sandbox_id, "secret": secret, "host": host_id},
            )
            return {"refused": why}
        purpose = f"host {host_id}: sandbox {sandbox_id}: service {service} (egress credential)"
        value = await self.vault.reveal(secret, purpose=purpose, actor=f"host:{host_id}")
        return {"value": value.expose()}
