"""Login throttling: too many failed logins for one username, or from one client address,
within a window lock further attempts out until the window has passed.

The failures are rows of the store (`login_failures`: one per key and failure, with the wall
clock's time), so every control-plane replica on one database counts the same ones: a
guesser gets the limit once, not once per replica. Rows older than the window are deleted as
new failures arrive, so the table holds at most one window's failures. The methods block (run
them with `Store.run`); replicas' clocks must agree to within seconds, as for token expiry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import delete, func, select

from aamp.identity.errors import Throttled
from aamp.store import Store, parse_time, time_at
from aamp.store.tables import LoginFailureRow

DEFAULT_WINDOW_SECONDS = 300.0
DEFAULT_PER_USER = 5
DEFAULT_PER_ADDRESS = 20


@dataclass
class LoginThrottle:
    store: Store
    window: float = DEFAULT_WINDOW_SECONDS
    per_user: int = DEFAULT_PER_USER
    per_address: int = DEFAULT_PER_ADDRESS
    clock: Callable[[], float] = time.time  # wall clock: shared by every replica

    def check(self, username: str, address: str) -> None:
        """Raise `Throttled` (nothing else happens) if either key is locked out."""
        now = self.clock()
        cutoff = time_at(now - self.window)
        with self.store.session() as s:
            for key, limit, what in (
                (f"user:{username}", self.per_user, f"user {username!r}"),
                (f"addr:{address}", self.per_address, f"client address {address}"),
            ):
                count, oldest = s.execute(
                    select(func.count(), func.min(LoginFailureRow.at)).where(
                        LoginFailureRow.key == key, LoginFailureRow.at > cutoff
                    )
                ).one()
                if count >= limit:
                    wait = int(parse_time(oldest).timestamp() + self.window - now) + 1
                    raise Throttled(
                        f"too many failed logins for {what}; try again in {wait} seconds"
                    )

    def failed(self, username: str, address: str) -> None:
        now = self.clock()
        with self.store.write_session() as s:
            s.execute(
                delete(LoginFailureRow).where(LoginFailureRow.at <= time_at(now - self.window))
            )
            at = time_at(now)
            s.add_all(
                LoginFailureRow(key=k, at=at) for k in (f"user:{username}", f"addr:{address}")
            )

    def succeeded(self, username: str) -> None:
        with self.store.write_session() as s:
            s.execute(delete(LoginFailureRow).where(LoginFailureRow.key == f"user:{username}"))
