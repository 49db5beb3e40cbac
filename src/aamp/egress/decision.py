"""The one decision every way out goes through: `Decider.decide(host, port) -> Verdict`.

CONNECT tunnels, plain-HTTP forwarding and service calls (plain or inside an intercepted
tunnel) all ask here, and connect only to an address the verdict carries. In order:

1. the sandbox's byte budget: once `max_bytes_out` is spent, everything is refused;
2. the rules (`EgressRules.decide`: deny, then allow, then IP literal, then default);
3. a granted service: if the rules did not allow (host, port) and no deny rule refused it, but
   it is exactly the origin of a service granted to this sandbox (granted to its agent and
   listed in its policy), the grant allows it — only ever through the credential-injecting
   path, since the proxy intercepts every connection to a service origin. The upstream is
   named exactly by the admin's service definition, so it counts as an exact rule;
4. `default: ask`: a person may approve (`approvals.py`);
5. resolution, once, on the host (an IP literal is its own address);
6. every resolved address: `EgressRules.check_address` (loopback/private/link-local/metadata
   only for an exact rule), then the installation's own listeners (`installation.py`), which
   no rule — nor a service grant — can open. The addresses that pass, in resolver order, are
   the verdict's.

A refusal of a host that names this machine (`localhost`, 127.0.0.1, ...) says that inside a
sandbox loopback is the sandbox itself: a guest program reaches it directly, never through the
proxy, and no policy can name it.

A kept-alive upstream connection is reused for a later request only if its address still
passes step 6 under the (possibly changed) rules (`decide(..., connected=address)`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from aamp.egress.approvals import EgressApprovals
from aamp.egress.installation import InstallationListeners
from aamp.egress.resolver import ResolveError, Resolver
from aamp.egress.rules import Decision, EgressRules
from aamp.egress.services import Service, ServiceSet
from aamp.policy.addresses import IPAddress
from aamp.policy.hosts import LOOPBACK_IS_THE_SANDBOX, Host, this_machine

MAX_BYTES_RULE = "egress.max_bytes_out"
OWN_LISTENER_RULE = "installation: own listener"


@dataclass(frozen=True)
class Verdict:
    """What `decide` concluded. Allowed: `addresses` are the checked ones to connect to (in
    order). Refused: `status` is the HTTP answer (403 policy, 502/504 resolution), and
    `address` the first refused address, if one was. `service` is the granted service whose
    origin this is, either way."""

    decision: Decision
    addresses: tuple[IPAddress, ...] = ()
    status: int = 403
    address: IPAddress | None = None
    service: Service | None = None

    @property
    def allowed(self) -> bool:
        return self.decision.allowed


def service_decision(service: Service, host: Host, port: int) -> Decision:
    rule = f"service: {service.name}"
    reason = f"{host}:{port} is the upstream of service {service.name}, granted to this sandbox"
    return Decision(True, rule, reason, exact=True)


@dataclass(eq=False)
class Decider:
    """One sandbox's decision. `rules` and `services` are replaced whole when they change;
    `spent()` says whether the byte budget is used up (the cap, or None)."""

    rules: EgressRules
    services: ServiceSet
    resolver: Resolver
    listeners: InstallationListeners
    approvals: EgressApprovals
    spent: Callable[[], int | None]

    async def decide(self, host: Host, port: int, *, connected: IPAddress | None = None) -> Verdict:
        """Judge (host, port) and find the addresses it may be connected to. `connected` is
        the address of a kept-alive upstream connection to this place: if it still passes it
        is the verdict's one address (no second lookup); if not, the name is resolved anew."""
        verdict = await self._decide(host, port, connected)
        if not verdict.allowed and (what := this_machine(host.name, host.ip)) is not None:
            reason = f"{verdict.decision.reason}; {what}: {LOOPBACK_IS_THE_SANDBOX}"
            verdict = replace(verdict, decision=replace(verdict.decision, reason=reason))
        return verdict

    async def _decide(self, host: Host, port: int, connected: IPAddress | None) -> Verdict:
        service = self.services.for_destination(host, port)
        decision = await self._judge(host, port, service)
        if not decision.allowed:
            return Verdict(decision, service=service)
        if connected is not None and self.recheck(decision, host, port, connected).allowed:
            return Verdict(decision, (connected,), service=service)
        if host.ip is not None:
            found: list[IPAddress] = [host.ip]
        else:
            try:
                found = await self.resolver.resolve(host.name)
            except ResolveError as exc:
                status = 504 if exc.timeout else 502
                return Verdict(Decision(False, "resolve", str(exc)), status=status, service=service)
        passed: list[IPAddress] = []
        first_refusal: Verdict | None = None
        for address in found:
            verdict = self.recheck(decision, host, port, address)
            if verdict.allowed:
                passed.append(address)
            elif first_refusal is None:
                first_refusal = Verdict(verdict, address=address, service=service)
        if not passed:
            assert first_refusal is not None
            return first_refusal
        return Verdict(decision, tuple(passed), service=service)

    async def _judge(self, host: Host, port: int, service: Service | None) -> Decision:
        cap = self.spent()
        if cap is not None:
            return Decision(False, MAX_BYTES_RULE, f"this sandbox has sent its {cap} bytes allowed")
        decision = self.rules.decide(host, port)
        if not decision.allowed and service is not None and not decision.denied:
            return service_decision(service, host, port)
        return await self.approvals.judge(decision, host, port)

    def recheck(self, decision: Decision, host: Host, port: int, address: IPAddress) -> Decision:
        """Judge one address `host` resolved to, under `decision` (which allowed the name)."""
        verdict = self.rules.check_address(decision, str(host), address)
        if not verdict.allowed:
            return verdict
        listener = self.listeners.serving(address, port)
        if listener is not None:
            return Decision(
                False,
                OWN_LISTENER_RULE,
                f"{host} port {port} resolved to {address}, which is this host, where port "
                f"{port} is {listener.describe()}; the proxy never connects to what the "
                "installation itself serves, whatever the rules say",
            )
        return verdict
