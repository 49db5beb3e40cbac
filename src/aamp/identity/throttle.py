"""Login throttling: too many failed logins for one username, or from one client address,
within a window lock further attempts out until the window has passed.

The failures are rows of the store (`login_failures`: one per key and failure, with the wall
clock's time), so every control-plane replica on one database counts the same ones: a
guesser gets the limit once, not once per replica. A login attempt is checked and counted
in one transaction (`attempt`, before the password is checked; a right password takes it
back), so attempts made at the same moment on several replicas meet the limit exactly. Rows
older than the window are deleted as new failures arrive, so the table holds at most one
window's failures. The methods block (run them with `Store.run`); replicas' clocks must
agree to within seconds, as for token expiry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

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
        with self.store.session() as s:
            self._refuse_if_locked(s, username, address, self.clock())

    def attempt(self, username: str, address: str) -> tuple[int, ...]:
        """A login attempt, counted before its password is checked: refused (`Throttled`,
        nothing recorded) if either key is locked out, else recorded as a failure in the same
        transaction — so attempts at once on several replicas cannot all pass one count.
        Returns the recorded rows, for `succeeded` or `forget`."""
        now = self.clock()
        with self.store.write_session() as s:
            keys = _keys(username, address)
            if s.get_bind().dialect.name == "postgresql":
                # SQLite's write lock serialises this already; PostgreSQL's READ COMMITTED
                # would let two transactions count the same rows, so lock the keys.
                for key in sorted(keys):
                    s.execute(select(func.pg_advisory_xact_lock(func.hashtext(key))))
            self._refuse_if_locked(s, username, address, now)
            return self._record(s, keys, now)

    def failed(self, username: str, address: str) -> None:
        with self.store.write_session() as s:
            self._record(s, _keys(username, address), self.clock())

    def succeeded(self, username: str, attempt: tuple[int, ...] = ()) -> None:
        """The password was right: the user's failures are forgotten, and so is this attempt
        (the client address keeps its earlier failures)."""
        with self.store.write_session() as s:
            s.execute(delete(LoginFailureRow).where(LoginFailureRow.key == f"user:{username}"))
            s.execute(delete(LoginFailureRow).where(LoginFailureRow.id.in_(attempt)))

    def forget(self, attempt: tuple[int, ...]) -> None:
        """The attempt ended otherwise than with a wrong password: it does not count."""
        with self.store.write_session() as s:
            s.execute(delete(LoginFailureRow).where(LoginFailureRow.id.in_(attempt)))

    def _refuse_if_locked(self, s: Session, username: str, address: str, now: float) -> None:
        cutoff = time_at(now - self.window)
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
                raise Throttled(f"too many failed logins for {what}; try again in {wait} seconds")

    def _record(self, s: Session, keys: tuple[str, str], now: float) -> tuple[int, ...]:
        """One failure for each key; rows older than the window go."""
        s.execute(delete(LoginFailureRow).where(LoginFailureRow.at <= time_at(now - self.window)))
        rows = [LoginFailureRow(key=k, at=time_at(now)) for k in keys]
        s.add_all(rows)
        s.flush()
        return tuple(r.id for r in rows)


def _keys(username: str, address: str) -> tuple[str, str]:
    return f"user:{username}", f"addr:{address}"
