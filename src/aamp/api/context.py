"""`ControlPlane`: everything the API's routes use, built once by `aamp.server` and passed in.

Routes reach it as `request.app.state.cp`; nothing is a module-level global.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aamp.agents.registry import AgentRegistry
from aamp.audit import AuditLog
from aamp.catalog import Catalog
from aamp.config import Settings
from aamp.fleet import FleetPlacer, FleetUpkeep, HostRegistry
from aamp.fleet.links import HostLinks
from aamp.identity import Directory, LoginThrottle
from aamp.policy import DataPolicy
from aamp.runs.service import RunService
from aamp.sandbox import ImageBuilds
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import SandboxManager
from aamp.store import Store
from aamp.vault import Vault

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# An exec request carries its stdin base64-encoded in JSON (16 MiB of stdin at most).
MAX_EXEC_BODY_BYTES = 24 * 1024 * 1024


@dataclass(frozen=True)
class SandboxOwner:
    username: str
    agent: str | None
    policy: str | None
    # The data rules of the policy it was made from (named or inline): what its files in and
    # out are checked against. None for an admin's sandbox made without a policy.
    data: DataPolicy | None = None


@dataclass
class ControlPlane:
    settings: Settings
    store: Store
    audit: AuditLog
    vault: Vault
    directory: Directory
    agents: AgentRegistry
    catalog: Catalog
    manager: SandboxManager
    images: ImageStore
    throttle: LoginThrottle
    # The fleet's hosts (shared by every replica) and this replica's fleet task.
    hosts: HostRegistry
    fleet: FleetUpkeep
    # This replica's links to sandbox hosts on other machines (`aamp host serve`).
    links: HostLinks
    # Who created each live sandbox, for which agent and policy: the facts authorisation
    # needs about a sandbox. Entries go when the manager no longer knows the sandbox.
    sandbox_owners: dict[str, SandboxOwner] = field(default_factory=dict)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Agent runs (the loop, steps, artifacts, approvals); built by `aamp.server`.
    runs: RunService | None = None
    # The image builds this process ran (the last of each image), for their followers.
    builds: ImageBuilds = field(default_factory=ImageBuilds)

    async def record_owner(self, sandbox_id: str, owner: SandboxOwner) -> None:
        """Who made a sandbox and for what: in memory here, and on its row for every
        other replica (a sandbox on another host is reached from any of them)."""
        self.sandbox_owners[sandbox_id] = owner
        placer = self.manager.placer
        if isinstance(placer, FleetPlacer):
            data = owner.data.to_json() if owner.data is not None else None
            await self.store.run(
                placer.record_owner, sandbox_id, owner.username, owner.agent, owner.policy, data
            )

    async def find_owner(self, sandbox_id: str) -> SandboxOwner | None:
        """The owner this replica knows, else the one recorded by the replica that made it."""
        known = self.sandbox_owners.get(sandbox_id)
        placer = self.manager.placer
        if known is not None or not isinstance(placer, FleetPlacer) or len(sandbox_id) > 64:
            return known
        recorded = await self.store.run(placer.owner_of, sandbox_id)
        if recorded is None:
            return None
        username, agent, policy, data = recorded
        rules = DataPolicy.from_json(data) if data is not None else None
        return SandboxOwner(username, agent, policy, rules)

    def forget_gone_sandboxes(self) -> None:
        """Drop ownership entries of sandboxes the manager no longer has (ttl, idle, crash)."""
        live = {s.id for s in self.manager.list()}
        for sandbox_id in [i for i in self.sandbox_owners if i not in live]:
            del self.sandbox_owners[sandbox_id]
