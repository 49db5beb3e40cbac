"""Runs: one task of one agent version in a fresh sandbox — its state, steps, artifacts,
approvals (`RunService`, `service.py`), kept durably by `RunStore` (`store.py`), driven by one
replica at a time under a lease (`RunLeases`, `leases.py`).

Names load on first use (`aamp.surface`).
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    leases: DEFAULT_LEASE_SECONDS Fence LeaseLost RunLeases
    service: RunRequest RunService
    store: RunEvent RunInfo RunStore
    """,
)
