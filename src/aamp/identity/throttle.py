"""Login throttling: too many failed logins for one username, or from one client address,
within a window lock further attempts out until the window has passed.

Counts live in the process (one object per app, passed explicitly). With several control-plane
replicas each throttles on its own, which still bounds guessing to replicas × the limit.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from aamp.identity.errors import Throttled

DEFAULT_WINDOW_SECONDS = 300.0
DEFAULT_PER_USER = 5
DEFAULT_PER_ADDRESS = 20
MAX_TRACKED_KEYS = 100_000


@dataclass
class LoginThrottle:
    window: float = DEFAULT_WINDOW_SECONDS
    per_user: int = DEFAULT_PER_USER
    per_address: int = DEFAULT_PER_ADDRESS
    clock: Callable[[], float] = time.monotonic
    _failures: dict[str, deque[float]] = field(default_factory=dict, repr=False)

    def _recent(self, key: str) -> deque[float]:
        q = self._failures.get(key)
        if q is None:
            return deque()
        cutoff = self.clock() - self.window
        while q and q[0] <= cutoff:
            q.popleft()
        if not q:
            del self._failures[key]
        return q

    def check(self, username: str, address: str) -> None:
        """Raise `Throttled` (nothing else happens) if either key is locked out."""
        for key, limit, what in (
            (f"user:{username}", self.per_user, f"user {username!r}"),
            (f"addr:{address}", self.per_address, f"client address {address}"),
        ):
            q = self._recent(key)
            if len(q) >= limit:
                wait = int(q[0] + self.window - self.clock()) + 1
                raise Throttled(f"too many failed logins for {what}; try again in {wait} seconds")

    def failed(self, username: str, address: str) -> None:
        if len(self._failures) > MAX_TRACKED_KEYS:
            for key in list(self._failures):
                self._recent(key)
        now = self.clock()
        for key in (f"user:{username}", f"addr:{address}"):
            self._failures.setdefault(key, deque()).append(now)

    def succeeded(self, username: str) -> None:
        self._failures.pop(f"user:{username}", None)
