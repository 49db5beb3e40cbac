"""What one attempt did, and the byte meter every forwarded byte passes through.

An `Attempt` is one request or tunnel as it happens: where it went, what decided, the status
answered and the bytes each way; the proxy turns it into exactly one ledger event. The `Meter`
is the sandbox's: it counts every byte sent up (guest → world) or down against both the
attempt and the sandbox, and enforces `max_bytes_out` — a per-sandbox budget, since a
per-connection one would be bypassed by opening more connections. A write that would cross it
sends what still fits and raises `CapReached`; the proxy cuts that connection.

Bytes are counted when they are handed to the sink's transport (or, for splice(2), when the
kernel moved them to the destination socket): `bytes_up` is what left the proxy for the
upstream, never bytes the proxy read but held back or refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aamp.egress.rules import Decision
from aamp.egress.splice import CapReached

__all__ = ["Attempt", "CapReached", "Meter"]


@dataclass
class Attempt:
    """What the ledger needs to know about one request/tunnel as it happens."""

    kind: str
    started: float = field(default_factory=time.monotonic)
    wall: float = field(default_factory=time.time)
    host: str = ""
    port: int | None = None
    address: str | None = None
    decision: Decision | None = None
    status: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    cut: bool = False
    emitted: bool = False
    service: str | None = None
    secrets: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.decision is not None and self.decision.allowed

    @property
    def reason(self) -> str:
        return self.decision.reason if self.decision is not None else ""


def unlimited(wanted: int) -> int:
    """No byte budget (bytes down are not capped)."""
    return wanted


class Meter:
    """One sandbox's byte counts; `cap()` is its current `max_bytes_out` (None: no cap)."""

    def __init__(self, cap: Callable[[], int | None]):
        self._cap = cap
        self.bytes_up = 0
        self.bytes_down = 0
        self.attempts = 0
        self.refused = 0

    def spent(self) -> int | None:
        """The cap if this sandbox has sent all it may, else None."""
        cap = self._cap()
        return cap if cap is not None and self.bytes_up >= cap else None

    def room_up(self, wanted: int) -> int:
        """How many of `wanted` bytes may still go up."""
        cap = self._cap()
        if cap is None:
            return wanted
        return max(0, min(wanted, cap - self.bytes_up))

    def count(self, attempt: Attempt, n: int, *, up: bool) -> None:
        if up:
            attempt.bytes_up += n
            self.bytes_up += n
        else:
            attempt.bytes_down += n
            self.bytes_down += n

    def send_up(self, sink: asyncio.StreamWriter, data: bytes, attempt: Attempt) -> None:
        """Write guest bytes upstream, enforcing the per-sandbox `max_bytes_out` cap."""
        n = len(data)
        cap = self._cap()
        if cap is not None and self.bytes_up + n > cap:
            room = max(0, cap - self.bytes_up)
            if room:
                sink.write(data[:room])
                self.count(attempt, room, up=True)
            raise CapReached()
        sink.write(data)
        attempt.bytes_up += n
        self.bytes_up += n

    def send_down(
        self, sink: asyncio.StreamWriter, data: bytes | memoryview, attempt: Attempt
    ) -> None:
        sink.write(data)
        n = len(data)
        attempt.bytes_down += n
        self.bytes_down += n

    def sender(self, *, up: bool) -> Callable[[asyncio.StreamWriter, bytes, Attempt], None]:
        return self.send_up if up else self.send_down

    def room(self, *, up: bool) -> Callable[[int], int]:
        return self.room_up if up else unlimited
