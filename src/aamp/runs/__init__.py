"""Runs: one task of one agent version in a fresh sandbox — its state, steps, artifacts,
approvals (`RunService`, `service.py`), kept durably by `RunStore` (`store.py`).

Names load on first use (`aamp.surface`).
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    {
        "service": ("RunRequest", "RunService"),
        "store": ("RunEvent", "RunInfo", "RunStore"),
    },
)
