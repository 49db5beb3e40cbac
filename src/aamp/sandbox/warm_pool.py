"""Which warm pools the sandbox manager keeps: pools keyed by what a sandbox is booted with.

A sandbox is booted with a driver, an image, resources and a packages layer (a policy's
`packages:`, the wheelhouse layer derived from the image; `boot_key`, the one place that says
what a sandbox is booted with). Everything else a
request brings — egress rules, services, lifetime, the egress approver — is applied when the
manager hands the sandbox out, so one pool serves every policy that boots the same way.

Two sources of targets, both bounded:
- configured: `AAMP_WARM_POOL="base=2"` keeps that many sandboxes of the image, booted by the
  default driver with default resources; and a stored policy's `warm: N` keeps N booted as
  its sandboxes are (`keep`; policies that boot alike share one pool, their counts added).
  What is configured in all is at most the installation's bound (AAMP_WARM_POOL_MAX), which
  `check_total` enforces where a policy is written and where the control plane starts;
- learned: with `AAMP_WARM_POOL_LEARN=N`, the boot keys of the N most recent requests that no
  configured pool serves (a run's policy with its own resources, say) keep one warm sandbox
  each; a key pushed out of the N is drained.

A pooled sandbox is never reachable before it is handed out (the manager lists only handed-out
ones), and a handed-out one is destroyed, never returned: nothing that ran for one policy or
user is ever seen by another.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from aamp.policy import Resources


@dataclass(frozen=True)
class BootKey:
    """What a sandbox is booted with; sandboxes of one key are interchangeable until used."""

    driver: str
    image: str
    resources: Resources
    packages: tuple[str, ...] = ()  # `name==version`, sorted: the derived layer's contents

    def label(self, default_driver: str) -> str:
        """A short name for status pages: the image alone for a configured-style pool."""
        if self.driver == default_driver and self.resources == Resources() and not self.packages:
            return self.image
        r = self.resources
        packages = f" packages={','.join(self.packages)}" if self.packages else ""
        return (
            f"{self.image} ({self.driver}; cpus={r.cpus} memory_bytes={r.memory_bytes} "
            f"pids={r.pids} disk_bytes={r.disk_bytes}{packages})"
        )


def boot_key(
    driver: str, image: str, resources: Resources, packages: tuple[str, ...] = ()
) -> BootKey:
    """The pool a sandbox of `driver`, `image`, `resources` and `packages` comes from (the
    packages' order does not change the layer, so it does not change the pool)."""
    return BootKey(driver, image, resources, tuple(sorted(set(packages))))


DEFAULT_MAX_WARM = 8  # AAMP_WARM_POOL_MAX: configured warm sandboxes in all, by default


class WarmTotalExceeded(ValueError):
    """What is configured to be kept warm is more than the installation's bound."""


def check_total(fixed: int, policies: dict[str, int], bound: int) -> None:
    """Refuse configured warm sandboxes beyond `bound`: `fixed` (AAMP_WARM_POOL's) and each
    policy's `warm`, named in the error so the admin knows what to lower."""
    asked = {name: n for name, n in sorted(policies.items()) if n > 0}
    total = fixed + sum(asked.values())
    if total <= bound:
        return
    parts = [f"AAMP_WARM_POOL {fixed}"] if fixed else []
    parts += [f"policy {name} {n}" for name, n in asked.items()]
    raise WarmTotalExceeded(
        f"{total} sandboxes would be kept warm ({', '.join(parts)}), over AAMP_WARM_POOL_MAX "
        f"({bound}); lower a policy's warm or raise AAMP_WARM_POOL_MAX"
    )


class PoolTargets:
    """How many warm sandboxes each boot key should have (configured, then learned)."""

    def __init__(
        self, configured: dict[BootKey, int], learn: int = 0, bound: int = DEFAULT_MAX_WARM
    ):
        if learn < 0:
            raise ValueError("the number of learned warm pools must be 0 or more")
        self._fixed = {k: n for k, n in configured.items() if n > 0}
        self.bound = bound
        check_total(self.fixed_total(), {}, bound)
        self._kept: dict[str, tuple[BootKey, int]] = {}  # by policy name
        self.configured = dict(self._fixed)
        self.learn = learn
        self._learned: OrderedDict[BootKey, None] = OrderedDict()

    def fixed_total(self) -> int:
        return sum(self._fixed.values())

    def check(self, policies: dict[str, int]) -> None:
        """Refuse (`WarmTotalExceeded`) policies' `warm` counts beyond the bound."""
        check_total(self.fixed_total(), policies, self.bound)

    def keep(self, owner: str, key: BootKey | None, count: int) -> list[BootKey]:
        """Keep `count` sandboxes of `key` warm for `owner` (a policy), replacing what it
        asked before (None or 0: nothing); returns the keys whose target changed."""
        before = dict(self.configured)
        if key is None or count <= 0:
            self._kept.pop(owner, None)
        else:
            self._kept[owner] = (key, count)
        configured = dict(self._fixed)
        for kept, n in self._kept.values():
            configured[kept] = configured.get(kept, 0) + n
        self.configured = configured
        for k in configured:  # a configured key is no longer one of the learned
            self._learned.pop(k, None)
        return [k for k in {*before, *configured} if before.get(k) != configured.get(k)]

    def target(self, key: BootKey) -> int:
        if key in self.configured:
            return self.configured[key]
        return 1 if key in self._learned else 0

    def requested(self, key: BootKey) -> list[BootKey]:
        """Note that `key` was asked for; returns the learned keys pushed out (to drain)."""
        if key in self.configured or not self.learn:
            return []
        self._learned[key] = None
        self._learned.move_to_end(key)
        dropped: list[BootKey] = []
        while len(self._learned) > self.learn:
            dropped.append(self._learned.popitem(last=False)[0])
        return dropped

    def wanted(self) -> list[BootKey]:
        return [*self.configured, *self._learned]
