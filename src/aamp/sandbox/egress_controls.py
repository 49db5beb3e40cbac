"""The manager's egress controls of a live sandbox: new rules and services, the view of its
egress events, and who answers its `default: ask` questions, here or on another host.

`EgressControls` is a part of `SandboxManager` (`manager.py`), moved here unchanged: its methods
use the manager's sandboxes, placer and audit record.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aamp.egress.approvals import Approver
from aamp.egress.recent import EgressView, RecentEgress
from aamp.egress.rules import EgressRules
from aamp.egress.services import ServiceSet
from aamp.sandbox.live import Sandbox
from aamp.sandbox.placer import Placer, SandboxElsewhere


class EgressControls:
    """Egress rules, events and approver of the manager's live sandboxes."""

    recent_egress: RecentEgress
    placer: Placer | None
    _elsewhere: set[str]
    _remote_approvers: dict[str, Approver]

    find: Callable[[str], Awaitable[Sandbox | SandboxElsewhere]]  # the manager's
    get: Callable[[str], Sandbox]
    _record: Callable[..., Awaitable[None]]

    async def update_egress(
        self,
        sandbox_id: str,
        rules: EgressRules,
        services: ServiceSet | None = None,
        *,
        actor: str = "system",
    ) -> None:
        """New rules (and services) for a live sandbox; they apply to its next connection or
        request. A sandbox on another host gets them over its link (its host's proxy enforces
        them; the services it may ask credentials for change with them). Recorded either way
        (`sandbox.update_egress`, with the rules and the host): "allow" once they apply,
        "error" if its host could not be told (nothing changed there)."""
        sandbox = await self.find(sandbox_id)
        details: dict[str, object] = {
            "egress": rules.to_dict(),
            "services": list(services.names) if services is not None else None,
        }
        if isinstance(sandbox, Sandbox):
            self.apply_egress(sandbox_id, rules, services)
        else:
            assert self.placer is not None  # only a placer finds a sandbox elsewhere
            details["host"] = sandbox.host
            try:
                await self.placer.update_egress_elsewhere(sandbox, rules, services, actor)
            except Exception as exc:
                why = f"its host {sandbox.host} was not told the new rules: {exc}"
                await self._record(
                    sandbox_id, "sandbox.update_egress", "error", why, actor, details
                )
                raise
        await self._record(
            sandbox_id, "sandbox.update_egress", "allow", "new egress rules", actor, details
        )

    def apply_egress(
        self, sandbox_id: str, rules: EgressRules, services: ServiceSet | None
    ) -> None:
        """New rules (and services, None: unchanged) for a sandbox on this host, unrecorded:
        `update_egress` records them, here or on the replica that asked over the link."""
        sandbox = self.get(sandbox_id)
        sandbox.egress.update_rules(rules)
        if services is not None:
            sandbox.egress.update_services(services)

    async def egress_view(self, sandbox_id: str) -> EgressView:
        """The sandbox's egress events from now on, as its proxy decided them; for one on
        another host, its host's own view, asked over the link and checked
        (`aamp.fleet.link_egress`)."""
        sandbox = await self.find(sandbox_id)
        if isinstance(sandbox, Sandbox):
            return self.recent_egress.view(sandbox_id)
        assert self.placer is not None
        return self.placer.egress_view_elsewhere(sandbox)

    async def set_egress_approver(
        self, sandbox_id: str, approver: Approver | None, *, timeout: float = 300.0
    ) -> None:
        """Who answers this sandbox's `egress.default: ask` destinations (a run puts them to
        a person, within `timeout` seconds); with none they are refused. For a sandbox on
        another host, its host is told over the link that this replica answers them, and its
        questions reach `remote_approver` (`aamp.fleet.collector`)."""
        if sandbox_id in self._elsewhere:
            assert self.placer is not None
            if approver is None:
                self._remote_approvers.pop(sandbox_id, None)
            else:
                self._remote_approvers[sandbox_id] = approver
            await self.placer.approver_elsewhere(sandbox_id, approver is not None, timeout)
            return
        self.get(sandbox_id).egress.approvals.approver = approver

    def remote_approver(self, sandbox_id: str) -> Approver | None:
        """Who answers the questions of `sandbox_id`, a sandbox this process made on another
        host (None: no run here drives it)."""
        return self._remote_approvers.get(sandbox_id)
