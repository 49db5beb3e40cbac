"""When the audit head gets signed on a time basis, and handing signed heads to the witness.

The writer (`log.py`) signs a checkpoint in the batch that reaches a multiple of
`checkpoint_every` records. That alone leaves the newest records unsigned for as long as it
takes to reach the next multiple; this task closes the gap: `seconds` after the first record
that no checkpoint covers yet, the head is signed in its own small transaction, on the
writer's database thread between two batches (so it never contends with them for the head
lock, and appends wait at most for that one transaction every `seconds`). Hence at most one
checkpoint per `seconds`, none while no record arrives, and no record unsigned for longer
than `seconds` plus one commit.

Every checkpoint committed, by either basis, is then appended to the witness (on the
witness's own thread). The writer only tells this task what it committed: one attribute test
per batch on the hot path.

`AAMP_AUDIT_CHECKPOINT_SECONDS` sets `seconds` (whole seconds, 1 to 3600; default 5).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

from aamp.audit.chain import Checkpoint
from aamp.config import ConfigError

SECONDS_ENV = "AAMP_AUDIT_CHECKPOINT_SECONDS"
DEFAULT_SECONDS = 5
MAX_SECONDS = 3600

log = logging.getLogger(__name__)


def seconds_from_env(env: Mapping[str, str]) -> int:
    raw = (env.get(SECONDS_ENV) or "").strip()
    if not raw:
        return DEFAULT_SECONDS
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_SECONDS:
        raise ConfigError(
            f"{SECONDS_ENV} must be a whole number of seconds from 1 to {MAX_SECONDS}, got {raw!r}"
        )
    return int(raw)


class Checkpointer:
    """The time basis: `records_committed` from the writer, a task that signs and witnesses.

    `sign_head()` signs the current head (or returns its existing checkpoint; None when the
    chain is empty); `witness(cp)` appends a committed checkpoint to the witness.
    """

    def __init__(
        self,
        sign_head: Callable[[], Awaitable[Checkpoint | None]],
        witness: Callable[[Checkpoint], Awaitable[None]],
        *,
        seconds: float,
    ) -> None:
        if seconds <= 0:
            raise ValueError("the checkpoint interval must be positive")
        self.sign_head = sign_head
        self.witness = witness
        self.seconds = seconds
        self._unsigned_since: float | None = None  # loop time of the first unsigned record
        self._committed: list[Checkpoint] = []  # signed in a batch, not yet witnessed
        self._wake = asyncio.Event()
        # Held while checkpoints go to the witness, so they reach it in the order of their
        # seq: the time basis and `sign_now` may sign a head newer than a count-based
        # checkpoint the writer committed a moment before, still waiting in `_committed`.
        self._witnessing = asyncio.Lock()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="aamp-audit-checkpointer")

    def records_committed(self, signed: list[Checkpoint]) -> None:
        """After each batch commit: records arrived; `signed` were checkpointed with them."""
        if signed:
            self._committed.extend(signed)
            self._wake.set()
        if self._unsigned_since is None:
            self._unsigned_since = asyncio.get_running_loop().time()
            self._wake.set()

    async def sign_now(self) -> Checkpoint | None:
        """Sign the head and witness it (start-up recovery, close, `AuditLog.checkpoint`)."""
        self._unsigned_since = None
        cp = await self.sign_head()
        await self._witness_pending(cp, logged=False)
        return cp

    async def stop(self) -> None:
        """Witness what is committed and stop (the caller signs the final head)."""
        if self._task is None:
            return
        self._stopping = True
        self._wake.set()
        await self._task
        self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = None if self._unsigned_since is None else self._unsigned_since + self.seconds
            if not self._wake.is_set() and (due is None or due > loop.time()):
                timeout = None if due is None else due - loop.time()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            await self._witness_pending(None, logged=True)
            if self._stopping:
                return
            due = None if self._unsigned_since is None else self._unsigned_since + self.seconds
            if due is not None and loop.time() >= due:
                await self._sign_logged()

    async def _sign_logged(self) -> None:
        self._unsigned_since = None
        try:
            cp = await self.sign_head()
        except Exception:
            # Try again one interval on (the database may be back by then); records that
            # arrive meanwhile are covered by that attempt.
            log.exception("audit checkpoint not signed; trying again in %s s", self.seconds)
            if self._unsigned_since is None:
                self._unsigned_since = asyncio.get_running_loop().time()
            return
        await self._witness_pending(cp, logged=True)

    async def _witness_pending(self, signed: Checkpoint | None, *, logged: bool) -> None:
        """Witness the committed checkpoints not yet witnessed, and `signed`, oldest first.

        Everything committed after the batch is taken has a higher seq than all of it, so
        batches taken under the lock reach the witness in increasing order. With `logged`, a
        failure is logged and the rest still go (the next checkpoint covers a missing one);
        without, it is raised to the caller of `sign_now`.
        """
        async with self._witnessing:
            batch, self._committed = self._committed, []
            if signed is not None:
                batch.append(signed)
            for cp in sorted(batch, key=lambda c: c.seq):
                if not logged:
                    await self.witness(cp)
                    continue
                try:
                    await self.witness(cp)
                except Exception:
                    # The checkpoint is committed; the next one witnessed covers it.
                    log.exception(
                        "audit checkpoint at record %d not written to the witness", cp.seq
                    )
