"""The egress rules of one sandbox and the one function that applies them: `decide`.

Hosts and rules are in their canonical spelling first (`aamp.policy.hosts`). Order of
judgement: deny rules (first match; a `*.suffix` deny covers the suffix itself too), then
allow rules (first match), then — for an IP literal no rule named — refusal, then `default`.
Deny beats allow. `default: ask` refuses like `block` but marks the decision `ask`: the proxy
may then put the destination to a person (see `EgressProxy`'s approver); an approved
destination is still only a public address.

After resolution (`check_address`), an address that is loopback, private, CGNAT, ULA,
link-local, multicast, reserved or metadata is refused unless the deciding rule names the exact
host (an exact-name or exact-IP allow rule); wildcard and `default: allow` never reach them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aamp.policy.addresses import IPAddress, classify
from aamp.policy.hosts import DEFAULTS, Default, Host, HostError, HostPattern, normalize_host
from aamp.policy.model import EgressPolicy


@dataclass(frozen=True)
class Decision:
    """What `decide` concluded: `rule` names exactly what decided (e.g. `deny[0] *.pastebin.com`,
    `default: block`), `reason` says it in words. `exact` is true when an allow rule names this
    exact host or IP, which is what lets it reach non-public addresses. `ask` is true when the
    refusal came from `default: ask`: a person may still approve this destination. `denied`
    is true when a deny rule refused it: nothing else (an approval, a granted service) may
    then let it through."""

    allowed: bool
    rule: str
    reason: str
    exact: bool = False
    ask: bool = False
    denied: bool = False


@dataclass(frozen=True)
class EgressRules:
    """An immutable rule set; replace the whole set to change rules (`EgressProxy.update_rules`)."""

    default: Default = "block"
    allow: tuple[HostPattern, ...] = ()
    deny: tuple[HostPattern, ...] = ()
    max_bytes_out: int | None = None

    @classmethod
    def from_lists(
        cls,
        default: Default = "block",
        allow: Iterable[str] = (),
        deny: Iterable[str] = (),
        max_bytes_out: int | None = None,
    ) -> EgressRules:
        """Build from rule text; raises `HostError` naming the list and index that is wrong."""
        if default not in DEFAULTS:
            raise HostError(f"default must be one of {', '.join(DEFAULTS)}; got {default!r}")
        parsed: dict[str, list[HostPattern]] = {"allow": [], "deny": []}
        for list_name, items in (("allow", allow), ("deny", deny)):
            for index, text in enumerate(items):
                try:
                    parsed[list_name].append(HostPattern.parse(text))
                except HostError as exc:
                    raise HostError(f"{list_name}[{index}]: {exc}") from None
        if max_bytes_out is not None and max_bytes_out < 0:
            raise HostError("max_bytes_out cannot be negative")
        return cls(default, tuple(parsed["allow"]), tuple(parsed["deny"]), max_bytes_out)

    @classmethod
    def from_policy(cls, egress: EgressPolicy) -> EgressRules:
        return cls.from_lists(egress.default, egress.allow, egress.deny, egress.max_bytes_out)

    def to_dict(self) -> dict[str, Any]:
        """The rule text, as `from_dict` (and a policy's `egress:`) takes it."""
        return {
            "default": self.default,
            "allow": [p.text for p in self.allow],
            "deny": [p.text for p in self.deny],
            "max_bytes_out": self.max_bytes_out,
        }

    @classmethod
    def from_dict(cls, data: Any) -> EgressRules:
        """Rules from `to_dict`'s form, checked as rule text is (`HostError` if wrong)."""
        if not isinstance(data, dict) or set(data) - {"default", "allow", "deny", "max_bytes_out"}:
            raise HostError("egress rules must be an object of default, allow, deny, max_bytes_out")
        cap = data.get("max_bytes_out")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int)):
            raise HostError("max_bytes_out must be a whole number of bytes")
        lists = [data.get(k, []) for k in ("allow", "deny")]
        if not all(isinstance(x, list) for x in lists):
            raise HostError("allow and deny must be lists of rules")
        return cls.from_lists(data.get("default", "block"), *lists, max_bytes_out=cap)

    def decide(self, host: str | Host, port: int) -> Decision:
        """Judge one destination. Never raises: a host that cannot be judged is refused."""
        try:
            target = host if isinstance(host, Host) else normalize_host(host)
        except HostError as exc:
            return Decision(False, "invalid host", str(exc))
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            return Decision(False, "invalid port", f"port {port!r} is not in 1..65535")
        where = f"{target}:{port}"
        for index, pattern in enumerate(self.deny):
            if pattern.matches(target, port, include_apex=True):
                rule = f"deny[{index}] {pattern.canonical}"
                return Decision(False, rule, f"{where} is denied by {rule}", denied=True)
        for index, pattern in enumerate(self.allow):
            if pattern.matches(target, port):
                rule = f"allow[{index}] {pattern.canonical}"
                return Decision(True, rule, f"{where} is allowed by {rule}", not pattern.wildcard)
        if target.ip is not None:
            return Decision(
                False, "ip-literal", f"{where} is an IP literal and no rule names that address"
            )
        if self.default == "allow":
            return Decision(True, "default: allow", f"{where} matches no rule; default is allow")
        if self.default == "ask":
            return Decision(
                False, "default: ask", f"{where} matches no rule; default is ask", ask=True
            )
        return Decision(False, "default: block", f"{where} matches no rule; default is block")

    def check_address(self, decision: Decision, host: str, address: IPAddress) -> Decision:
        """Judge the address a name resolved to, after `decide` allowed the name."""
        if not decision.allowed:
            return decision
        verdict = classify(address)
        if verdict.public or decision.exact:
            return decision
        return Decision(
            False,
            f"address: {verdict.kind.value}",
            f"{host} resolved to {address}: {verdict.describe()}; only a rule naming this "
            f"exact host may reach it (allowed by {decision.rule})",
        )
