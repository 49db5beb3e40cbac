"""`configured_manager`: the one `SandboxManager` built from settings, for every process that
runs one — `aamp up` (the API with its own host, or `--role api` with none) and `aamp host
serve` — so each reads the same settings the same way.

The settings it reads (docs/deployment.md, "Settings a host reads"): `AAMP_DRIVER` (the
default driver), `AAMP_WARM_POOL`, `AAMP_WARM_POOL_LEARN` and `AAMP_WARM_POOL_MAX` (the warm pools),
`AAMP_EGRESS_DNS` (the egress resolver), and through `Settings` the image and runtime
directories and the installation's listeners. What only a control plane has — its audit
log, vault and egress CA (or, on a host, who signs its leaves) — the caller passes in.

A manager with no drivers runs no sandbox itself (a replica with `--role api`: every sandbox
is placed on a registered host): a warm pool for it would be a setting accepted and ignored,
so it is refused.
"""

from __future__ import annotations

from collections.abc import Callable

from aamp.audit import AuditSink
from aamp.config import Settings
from aamp.egress.ca import InstallationCA, LeafSource
from aamp.egress.installation import InstallationListeners
from aamp.egress.ledger import EgressSink
from aamp.egress.proxy import EgressContext
from aamp.egress.resolver import egress_resolver
from aamp.egress.services import SecretReader
from aamp.sandbox.driver import Driver
from aamp.sandbox.drivers import choose_default_driver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import LogEgressSink, SandboxManager
from aamp.sandbox.warm_pool import DEFAULT_MAX_WARM

# The driver a replica with no host of its own asks hosts for when a request names none.
REMOTE_DEFAULT_DRIVER = "gvisor"


def parse_pool(spec: str) -> dict[str, int]:
    """`AAMP_WARM_POOL="base=2,browser=1"` -> {"base": 2, "browser": 1}."""
    pool: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, count = item.partition("=")
        if not sep or not count.isdigit() or not name:
            raise ValueError(f"AAMP_WARM_POOL item {item!r} must look like IMAGE=COUNT")
        pool[name] = int(count)
    return pool


def configured_manager(
    settings: Settings,
    drivers: dict[str, Driver],
    *,
    recorder: AuditSink | None = None,
    egress_sink: EgressSink | None = None,
    secrets: SecretReader | None = None,
    secrets_for: Callable[[str], SecretReader] | None = None,
    ca: InstallationCA | None = None,
    leaves_for: Callable[[str], LeafSource] | None = None,
) -> SandboxManager:
    """The sandbox manager of this process over `drivers` (none: it runs no sandbox)."""
    pool = parse_pool(settings.env.get("AAMP_WARM_POOL", ""))
    learn = settings.env.get("AAMP_WARM_POOL_LEARN", "0").strip() or "0"
    if not learn.isdigit():
        raise ValueError(f"AAMP_WARM_POOL_LEARN must be a number of pools, got {learn!r}")
    warm_max = settings.env.get("AAMP_WARM_POOL_MAX", "").strip() or str(DEFAULT_MAX_WARM)
    if not warm_max.isdigit():
        raise ValueError(f"AAMP_WARM_POOL_MAX must be a number of sandboxes, got {warm_max!r}")
    if drivers:
        default = choose_default_driver(settings, drivers)
    else:
        if pool or int(learn):
            raise ValueError(
                "AAMP_WARM_POOL and AAMP_WARM_POOL_LEARN are a sandbox host's settings; this"
                " process runs no sandboxes (`aamp up --role api`): set them on the hosts"
            )
        default = settings.env.get("AAMP_DRIVER", "").strip() or REMOTE_DEFAULT_DRIVER
    return SandboxManager(
        settings,
        ImageStore(settings),
        drivers,
        default,
        recorder=recorder,
        warm_pool=pool,
        learn_pools=int(learn),
        warm_max=int(warm_max),
        egress=EgressContext(
            egress_resolver(settings),
            egress_sink or LogEgressSink(),
            secrets=secrets,
            secrets_for=secrets_for,
            ca=ca,
            leaves_for=leaves_for,
            listeners=InstallationListeners.of(settings),
        ),
    )
