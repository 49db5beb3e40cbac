"""The fleet: sandbox hosts registered with the control plane, shared by every replica
through the store (docs/deployment.md).

- `HostRegistry` (`registry.py`) — add, register (epochs), heartbeat, drain, remove, lost;
- `Placement` (`placement.py`) — the host a sandbox goes to, its capacity reserved in the
  same transaction;
- `FleetPlacer` (`sandboxes.py`) — the sandbox manager's placer: every sandbox placed,
  recorded on its host (`sandboxes` rows), its capacity given back when it goes;
- `FleetUpkeep`, `LocalHost` (`upkeep.py`) — each replica's heartbeat of its own host and
  its sweep for lost ones;
- `serve_host` (`host_serve.py`) — `aamp host serve`: a sandbox host on another machine;
  `LocalLink` (`local_link.py`) — the link of a replica's own host, for the other replicas;
- `LinkCA` (`link_ca.py`), `HostLinks` (`links.py`) — the mutual-TLS link between replicas
  and hosts: its CA and certificates, and each replica's clients to the hosts;
- `HostOutbox` (`host_outbox.py`) — a host's egress records, credential asks and leaf
  certificate requests, waiting for a replica; `HostCollectors` (`collector.py`) — each
  replica's collection of them, `HostCredentials` (`credentials.py`) — the one decision on a
  host's credential ask, and `HostLeaves` (`leaves.py`) — on its request for a leaf of the
  installation's egress CA.

Names load on first use (`aamp.surface`).
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    registry: DEFAULT_HEARTBEAT_SECONDS DEFAULT_LOST_SECONDS HostFacts HostInfo HostRefused
        HostRegistry StaleEpoch check_host_id
    placement: Need NoCapacity Placed Placement
    sandboxes: FleetPlacer
    upkeep: FleetUpkeep LocalHost machine_facts
    links: HostLinks LinkNotProven
    link_ca: LinkCA
    host_serve: serve_host
    host_outbox: HostOutbox LinkEgressSink LinkLeaves LinkSecrets
    credentials: HostCredentials
    leaves: HostLeaves
    collector: HostCollectors
    local_link: LocalLink
    link_egress: MAX_VIEW_ANSWER MAX_VIEW_EVENTS LinkEgressView
    """,
)
