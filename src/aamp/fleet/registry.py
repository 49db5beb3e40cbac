"""`HostRegistry`: the sandbox hosts of an installation, as rows every replica shares.

An admin adds a host (`add`: the host's token, shown once, stored as its SHA-256). The host
then registers with that token (`register`: a new epoch, its drivers, capacity and images;
`active`, or still `draining` if an admin drained it), and is given that life's heartbeat
secret (random, shown only then, stored as its SHA-256). It heartbeats (`heartbeat`) naming
the epoch and carrying the secret: the token alone never speaks for a life, so a stolen token
can neither keep a dead host looking alive nor settle what it runs. A wrong token, or a host
nobody added, or a heartbeat without a secret, is refused with `HostRefused`: nothing changes.
A heartbeat that is not of the current life (an old epoch, or a secret that does not match),
or one after the host was marked lost, is refused with `StaleEpoch` — without naming the
current epoch — and changes nothing: the host must register again (and destroy what it still
runs) before it takes work. `mark_lost` marks every host whose last heartbeat is older than
`lost_after` seconds, and their sandboxes (`sandboxes` rows) lost with them in the same
transaction; any replica may run it, the transaction decides each host once.

Times are the wall clock (`clock`), shared by every replica; their clocks must agree to
within seconds (NTP).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from aamp.errors import AampError, Conflict, InvalidInput, NotFound, matching
from aamp.store import Store, existing, time_at, value_of
from aamp.store.tables import HostRow, SandboxRow

HOST_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}\Z")
TOKEN_PREFIX = "aamph_"
HEARTBEAT_SECRET_PREFIX = "aamphb_"
MAX_IMAGES = 256
DEFAULT_LOST_SECONDS = 15
DEFAULT_HEARTBEAT_SECONDS = 3


class HostRefused(AampError, code="host_refused", status=401):
    """A host's credential is not valid (wrong token, or no such host was added)."""


class StaleEpoch(AampError, code="stale_epoch", status=409):
    """A host speaks for an earlier registration, or was marked lost: it must register again."""


@dataclass(frozen=True)
class HostFacts:
    """What a host says about itself when it registers."""

    drivers: tuple[str, ...]
    cpus: int
    memory_mb: int
    sandboxes: int
    images: tuple[str, ...]

    def __post_init__(self) -> None:
        for name in ("cpus", "memory_mb", "sandboxes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**20:
                raise InvalidInput(f"{name} must be a positive whole number, got {value!r}")
        if not self.drivers or len(self.drivers) > 8:
            raise InvalidInput("drivers must name between 1 and 8 isolation drivers")
        for d in self.drivers:
            matching(d, re.compile(r"^[a-z][a-z0-9-]{0,31}\Z"), f"driver name {d!r} is not valid")
        check_images(self.images)


# An image a host has built, or a packages layer over one (`ImageStore.layers`).
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}(\+[0-9a-f]{16})?@[0-9a-f]{8,64}\Z")


def check_images(images: tuple[str, ...]) -> None:
    """What a host reports it has built (its registration and each heartbeat): at most
    `MAX_IMAGES` of `NAME@CONTENT_HASH`, or `NAME+PACKAGES_KEY@CONTENT_HASH` for a packages
    layer; InvalidInput if not."""
    if len(images) > MAX_IMAGES:
        raise InvalidInput(f"a host may report at most {MAX_IMAGES} images")
    for i in images:
        matching(i, IMAGE_RE, f"image {str(i)[:100]!r} must be NAME@CONTENT_HASH or NAME+KEY@HASH")


@dataclass(frozen=True)
class HostInfo:
    id: str
    epoch: int
    state: str
    drivers: tuple[str, ...]
    images: tuple[str, ...]
    cpus: float
    memory_mb: int
    sandboxes: int
    used_cpus: float
    used_memory_mb: int
    used_sandboxes: int
    heartbeat_at: str | None
    created_at: str
    created_by: str
    link_address: str | None = None


def _info(row: HostRow) -> HostInfo:
    return value_of(
        HostInfo,
        row,
        drivers=tuple(json.loads(row.drivers)),
        images=tuple(json.loads(row.images)),
        cpus=row.millicpus / 1000,
        used_cpus=row.used_millicpus / 1000,
    )


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_host_id(host_id: object) -> str:
    return matching(
        host_id,
        HOST_ID_RE,
        "a host id is 1-63 lower-case letters, digits, dots and dashes, starting with a"
        " letter or digit",
    )


@dataclass(eq=False)
class HostRegistry:
    store: Store
    _: KW_ONLY
    lost_after: float = DEFAULT_LOST_SECONDS
    clock: Callable[[], float] = time.time

    def _now(self, offset: float = 0.0) -> str:
        return time_at(self.clock() + offset)

    # -- an admin's ------------------------------------------------------------------------

    def add(self, host_id: str, *, by: str) -> tuple[HostInfo, str]:
        """A new host that may register with the returned token (shown only now)."""
        check_host_id(host_id)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.store.write_session() as s:
            if s.get(HostRow, host_id, with_for_update=True) is not None:
                raise Conflict(f"host {host_id!r} already exists")
            row = HostRow(
                id=host_id,
                token_hash=_digest(token),
                epoch=0,
                state="new",
                drivers="[]",
                images="[]",
                millicpus=0,
                memory_mb=0,
                sandboxes=0,
                used_millicpus=0,
                used_memory_mb=0,
                used_sandboxes=0,
                created_at=self._now(),
                created_by=by,
            )
            s.add(row)
            s.flush()
            return _info(row), token

    def new_token(self, host_id: str) -> str:
        """Replace a host's token (the old one stops working at once); the new one is shown
        only now."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.store.write_session() as s:
            self._row(s, host_id).token_hash = _digest(token)
        return token

    def list(self) -> list[HostInfo]:
        with self.store.session() as s:
            return [_info(r) for r in s.scalars(select(HostRow).order_by(HostRow.id))]

    def get(self, host_id: str) -> HostInfo:
        with self.store.session() as s:
            return _info(existing(s, HostRow, host_id, f"no host {host_id!r}"))

    def drain(self, host_id: str) -> HostInfo:
        """No new work goes to the host; what it runs may finish."""
        with self.store.write_session() as s:
            row = self._row(s, host_id)
            if row.state == "lost":
                raise Conflict(f"host {host_id!r} is lost; there is nothing to drain")
            row.state = "draining"
            s.flush()
            return _info(row)

    def remove(self, host_id: str) -> None:
        """Forget a host that takes no work (drained, lost or never registered) and holds no
        sandboxes."""
        with self.store.write_session() as s:
            row = self._row(s, host_id)
            if row.state == "active":
                raise Conflict(f"host {host_id!r} is active; drain it first (aamp host drain)")
            if row.used_sandboxes and row.state != "lost":
                raise Conflict(
                    f"host {host_id!r} still runs {row.used_sandboxes} sandboxes; "
                    "wait for them to finish"
                )
            s.delete(row)

    # -- a host's --------------------------------------------------------------------------

    def register(
        self, host_id: str, token: str, facts: HostFacts, link: str | None = None
    ) -> tuple[HostInfo, str]:
        """Begin a new life of the host: the next epoch, its facts, a fresh heartbeat, and
        where its link listens (`link`, HOST:PORT, already proven by the caller; None for a
        replica's own host). Returns the host and this life's heartbeat secret (shown only
        now)."""
        secret = HEARTBEAT_SECRET_PREFIX + secrets.token_urlsafe(32)
        with self.store.write_session() as s:
            row = self._authenticated(s, host_id, token)
            row.link_address = link
            row.epoch += 1
            row.heartbeat_hash = _digest(secret)
            row.state = "draining" if row.state == "draining" else "active"
            row.drivers = json.dumps(list(facts.drivers))
            row.images = json.dumps(sorted(facts.images))
            row.millicpus = facts.cpus * 1000
            row.memory_mb, row.sandboxes = facts.memory_mb, facts.sandboxes
            # A new life runs nothing yet: whatever an earlier one reserved is gone with it,
            # and so are the sandboxes it ran (destroyed or lost: the host reaps them).
            row.used_millicpus = row.used_memory_mb = row.used_sandboxes = 0
            s.execute(delete(SandboxRow).where(SandboxRow.host_id == host_id))
            row.heartbeat_at = self._now()
            s.flush()
            return _info(row), secret

    def authenticate(self, host_id: str, token: str) -> None:
        """`HostRefused` unless `token` is the host's (before anything is done for it)."""
        with self.store.session() as s:
            self._authenticated(s, host_id, token)

    def heartbeat(
        self,
        host_id: str,
        token: str,
        epoch: int,
        secret: str | None,
        images: tuple[str, ...] | None = None,
    ) -> HostInfo:
        """The host is alive under `epoch`, whose heartbeat secret is `secret`; `images` (if
        given) replaces what it has. Refused, with nothing changed, unless both are the
        current life's."""
        with self.store.write_session() as s:
            row = self._authenticated(s, host_id, token)
            if not isinstance(secret, str) or not secret:
                raise HostRefused(
                    f"host {host_id!r} refused: a heartbeat must carry the heartbeat secret its"
                    " registration returned"
                )
            current = (
                epoch == row.epoch
                and row.heartbeat_hash is not None
                and hmac.compare_digest(_digest(secret), row.heartbeat_hash)
            )
            if not current:
                # One answer for an old epoch and a wrong secret, naming neither the current
                # epoch nor which did not match: the caller learns nothing it did not send.
                raise StaleEpoch(
                    f"host {host_id!r} heartbeats for epoch {epoch}, which is not its current"
                    " registration (its epoch or heartbeat secret does not match); register"
                    " again"
                )
            if row.state == "lost":
                raise StaleEpoch(
                    f"host {host_id!r} was marked lost (no heartbeat for {self.lost_after:g} s);"
                    " destroy its sandboxes and register again"
                )
            if images is not None:
                check_images(images)
                row.images = json.dumps(sorted(images))
            row.heartbeat_at = self._now()
            s.flush()
            return _info(row)

    def linked(self) -> dict[str, str]:
        """Every host with a link, by id: its address (its state aside)."""
        with self.store.session() as s:
            rows = s.execute(
                select(HostRow.id, HostRow.link_address).where(HostRow.link_address.is_not(None))
            ).all()
        return {r.id: r.link_address for r in rows}

    # -- any replica's ---------------------------------------------------------------------

    def mark_lost(self) -> list[HostInfo]:
        """Mark lost every registered host whose last heartbeat is older than `lost_after`;
        returns them (each exactly once, whichever replica runs this first)."""
        cutoff = self._now(-self.lost_after)
        with self.store.write_session() as s:
            rows = s.scalars(
                select(HostRow)
                .where(
                    HostRow.state.in_(("active", "draining")),
                    HostRow.heartbeat_at < cutoff,
                )
                .with_for_update(skip_locked=True)
            ).all()
            for row in rows:
                row.state = "lost"
                # Its sandboxes are lost with it, in the same transaction as the mark.
                s.execute(
                    update(SandboxRow)
                    .where(SandboxRow.host_id == row.id, SandboxRow.state == "live")
                    .values(
                        state="lost",
                        lost_reason=(
                            f"host {row.id} was lost (no heartbeat since {row.heartbeat_at}, "
                            f"lost after {self.lost_after:g} s)"
                        ),
                    )
                )
            s.flush()
            return [_info(r) for r in rows]

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _row(s: Session, host_id: str) -> HostRow:
        row = s.get(HostRow, host_id, with_for_update=True)
        if row is None:
            raise NotFound(f"no host {host_id!r}")
        return row

    @staticmethod
    def _authenticated(s: Session, host_id: str, token: str) -> HostRow:
        """The host's row, locked, if `token` is its token; else `HostRefused` (the same
        answer whether the host exists or not)."""
        row = s.get(HostRow, host_id, with_for_update=True) if HOST_ID_RE.match(host_id) else None
        given = _digest(token) if isinstance(token, str) else ""
        if row is None or not hmac.compare_digest(given, row.token_hash):
            raise HostRefused(f"host {host_id[:64]!r} refused: its token is not valid")
        return row
