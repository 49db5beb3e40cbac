"""The chain checker shared by `verify` (database) and `verify_export` (file).

Fed records in the order they claim (by seq), it finds the FIRST problem and says precisely
what it is:

- `removed`: a seq is missing (the chain jumps), or records at the end are gone although the
  head row or a signed checkpoint says they existed;
- `edited`: a record's contents no longer hash to its stored hash;
- `reordered`: a record sits at a seq it was not written at (its contents hash correctly only
  with another seq, found by searching nearby seqs);
- `relinked`: a record hashes correctly but does not follow its predecessor (one of the two
  was rewritten with its hash recomputed, or records were removed and renumbered);
- `checkpoint`: a signed checkpoint does not match the record at its seq, or its signature is
  invalid or by an unknown key (a rewrite with recomputed hashes shows up here);
- `witness_mismatch`: the record at a seq the witness file names (`witness.py`) does not have
  the hash the witness says was signed for it: the chain was rewritten up to there, or cut and
  new records took the removed numbers.

Records missing at the end are named as a range (`records 23..30 are missing`), ending at the
newest of what says they existed: the head row, a signed checkpoint, a witnessed head.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aamp.audit.canonical import GENESIS_HASH, encode
from aamp.audit.signing import verify_signature


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A signed statement "record `seq` has hash `hash`" (`time`: when it was signed)."""

    seq: int
    hash: str
    key_id: str
    signature: str
    time: str | None = None

    @classmethod
    def of(cls, row: Sequence[Any]) -> Checkpoint:
        """From a stored row: its `seq, hash, key_id, signature, time` columns, in that order."""
        return cls(int(row[0]), row[1], row[2], row[3], row[4])


@dataclass(frozen=True, slots=True)
class Problem:
    """The first bad record: its seq, what kind of damage, and a sentence for humans.

    `seq` is None when the damage is not in the chain (kind `witness_damaged`: the witness
    file itself is damaged, cut short or missing).
    """

    seq: int | None
    kind: str
    message: str


@dataclass(frozen=True)
class VerifyReport:
    ok: bool
    records: int
    checkpoints: int
    first_seq: int | None
    last_seq: int | None
    last_hash: str | None
    problem: Problem | None
    seconds: float = 0.0
    note: str | None = None
    witnessed_seq: int | None = None  # the newest witnessed head checked (None: no witness)

    def summary(self) -> str:
        if self.problem is not None:
            where = "" if self.problem.seq is None else f" at record {self.problem.seq}"
            text = f"FAILED{where} ({self.problem.kind}): {self.problem.message}"
            return text + (f" ({self.note})" if self.note else "")
        span = (
            "no records"
            if self.first_seq is None
            else (f"records {self.first_seq}..{self.last_seq}")
        )
        witness = (
            ""
            if self.witnessed_seq is None
            else f", the witnessed head at record {self.witnessed_seq} matches"
        )
        text = (
            f"OK: {self.records} {span}, {self.checkpoints} signed checkpoints verified"
            f"{witness} in {self.seconds:.2f}s"
        )
        return text + (f" ({self.note})" if self.note else "")


Row = tuple[int, str, str, str, str, str, "str | None", "str | None", str, str, str]
"""(seq, time, actor, action, resource, decision, reason, request_id, details_json,
prev_hash, hash) — the column order of every reader."""


REORDER_SEARCH_WINDOW = 10_000  # seqs searched either side for the one a record was written at
_NO_WITNESS = sys.maxsize  # the seq of the next witnessed head when there is none


class ChainChecker:
    """Walks records in seq order; `feed` returns the first Problem found (then stop).

    `checkpoints` are the signed checkpoints of the records about to be fed (a caller that
    reads in pages may replace it before each page). `witness` yields witnessed heads in
    increasing seq, already checked for damage and signatures (`witness.WitnessReader`).
    """

    def __init__(
        self,
        checkpoints: Mapping[int, Checkpoint],
        trusted_keys: Mapping[str, Ed25519PublicKey],
        *,
        start_seq: int = 1,
        start_prev_hash: str | None = GENESIS_HASH,
        witness: Iterable[Checkpoint] = (),
    ) -> None:
        self.checkpoints = checkpoints
        self._witness: Iterator[Checkpoint] = iter(witness)
        self._witnessed = next(self._witness, None)
        while self._witnessed is not None and self._witnessed.seq < start_seq:
            self._witnessed = next(self._witness, None)  # before this walk's first record
        self.witnessed_seq: int | None = None  # the newest witnessed head that matched
        self.trusted_keys = trusted_keys
        self.next_seq = start_seq
        # None: the first record's prev_hash is taken on trust (an export starting mid-chain).
        self.prev_hash = start_prev_hash
        self.records = 0
        self.checkpoints_ok = 0
        self.first_seq: int | None = None
        self.last_hash: str | None = None

    def feed(self, row: Row) -> Problem | None:
        seq, time, actor, action, resource, decision, reason, request_id, details, prev, h = row
        expected = self.next_seq
        if seq != expected:
            if seq > expected:
                return Problem(
                    expected,
                    "removed",
                    f"record {expected} is missing (removed, or moved elsewhere): the chain goes "
                    f"from record {expected - 1} to record {seq}",
                )
            return Problem(
                seq, "reordered", f"record {seq} appears again after record {expected - 1}"
            )
        computed = hashlib.sha256(
            encode(seq, time, actor, action, resource, decision, reason, request_id, details, prev)
        ).hexdigest()
        if computed != h:
            moved_from = self._original_seq(row)
            if moved_from is not None:
                return Problem(
                    seq,
                    "reordered",
                    f"record at seq {seq} was written as record {moved_from}: records were moved",
                )
            return Problem(
                seq,
                "edited",
                f"record {seq} was edited: its contents hash to {computed[:16]}..., but its "
                f"stored hash is {h[:16]}...",
            )
        if self.prev_hash is not None and prev != self.prev_hash:
            what = "the chain start" if seq == 1 else f"record {seq - 1}"
            return Problem(
                seq,
                "relinked",
                f"record {seq} does not follow {what}: its prev_hash is {prev[:16]}..., but "
                f"{what} hashes to {self.prev_hash[:16]}... (a record was rewritten with its "
                "hash recomputed, or records were removed and renumbered)",
            )
        cp = self.checkpoints.get(seq)
        if cp is not None:
            problem = self._check_checkpoint(cp, h)
            if problem is not None:
                return problem
            self.checkpoints_ok += 1
        witnessed = self._witnessed
        if witnessed is not None and witnessed.seq == seq:
            if witnessed.hash != h:
                return Problem(
                    seq,
                    "witness_mismatch",
                    f"record {seq} does not match the witness: the witness file says record "
                    f"{seq} was signed with hash {witnessed.hash[:16]}... at {witnessed.time}, "
                    f"but the record hashes to {h[:16]}... (the chain up to record {seq} was "
                    "rewritten, or its tail was cut and new records took the removed numbers)",
                )
            self.witnessed_seq = seq
            self._witnessed = next(self._witness, None)
        if self.first_seq is None:
            self.first_seq = seq
        self.records += 1
        self.next_seq = seq + 1
        self.prev_hash = h
        self.last_hash = h
        return None

    def feed_many(self, rows: Iterable[Row]) -> Problem | None:
        """`feed` for each row, stopping at the first Problem; the same result, faster.

        The common case — the right seq, the right link, a matching hash, no checkpoint —
        is checked here with everything in local variables; any other row goes through
        `feed`, which says precisely what is wrong (or checks its checkpoint).
        """
        sha256, enc = hashlib.sha256, encode
        checkpoints = self.checkpoints
        expected, prev_hash = self.next_seq, self.prev_hash
        witnessed = self._next_witnessed_seq()
        fast = 0  # rows accepted here since the state was last written back
        for row in rows:
            seq, time, actor, action, resource, decision, reason, request_id, details, prev, h = row
            if (
                seq == expected
                and prev == prev_hash
                and seq < witnessed
                and seq not in checkpoints
                and sha256(
                    enc(
                        seq,
                        time,
                        actor,
                        action,
                        resource,
                        decision,
                        reason,
                        request_id,
                        details,
                        prev,
                    )
                ).hexdigest()
                == h
            ):
                expected += 1
                prev_hash = h
                fast += 1
                continue
            self._accepted(fast, expected, prev_hash)
            fast = 0
            problem = self.feed(row)
            if problem is not None:
                return problem
            expected, prev_hash = self.next_seq, self.prev_hash
            witnessed = self._next_witnessed_seq()
        self._accepted(fast, expected, prev_hash)
        return None

    def _next_witnessed_seq(self) -> int:
        return _NO_WITNESS if self._witnessed is None else self._witnessed.seq

    def _accepted(self, count: int, next_seq: int, last_hash: str | None) -> None:
        """Write back `count` rows accepted by `feed_many`'s fast path."""
        if count == 0:
            return
        if self.first_seq is None:
            self.first_seq = next_seq - count
        self.records += count
        self.next_seq = next_seq
        self.prev_hash = self.last_hash = last_hash

    def _check_checkpoint(self, cp: Checkpoint, record_hash: str) -> Problem | None:
        key = self.trusted_keys.get(cp.key_id)
        if key is None:
            return Problem(
                cp.seq,
                "checkpoint",
                f"checkpoint at record {cp.seq} is signed by unknown key {cp.key_id}",
            )
        if not verify_signature(key, cp.seq, cp.hash, cp.signature):
            return Problem(
                cp.seq, "checkpoint", f"checkpoint at record {cp.seq} has an invalid signature"
            )
        if cp.hash != record_hash:
            return Problem(
                cp.seq,
                "checkpoint",
                f"record {cp.seq} does not match its signed checkpoint: the chain up to record "
                f"{cp.seq} was rewritten after it was signed",
            )
        return None

    def finish(
        self,
        *,
        expected_last_seq: int | None = None,
        beyond: Iterable[Checkpoint] | None = None,
        witnessed_before: str | None = None,
    ) -> Problem | None:
        """After the last record: are records missing at the end?

        Evidence that later records existed: the head row (`expected_last_seq`), signed
        checkpoints past the end (`beyond`; by default those in `self.checkpoints`), and
        witnessed heads past the end (only those signed before `witnessed_before`, when given:
        an export cannot hold what was written after it was taken). The problem names the
        whole missing range, up to the newest evidence.
        """
        last = self.next_seq - 1
        found: list[tuple[int, Problem]] = []
        if expected_last_seq is not None and expected_last_seq > last:
            found.append(
                (
                    expected_last_seq,
                    Problem(
                        last + 1,
                        "removed",
                        f"records {last + 1}..{expected_last_seq} are missing: the chain ends at "
                        f"record {last} but its head says {expected_last_seq}",
                    ),
                )
            )
        signed_beyond = self._signed_beyond(last, beyond)
        if signed_beyond is not None:
            found.append(signed_beyond)
        witnessed = self._witnessed_beyond(witnessed_before)
        if witnessed is not None:
            found.append(
                (
                    witnessed.seq,
                    Problem(
                        last + 1,
                        "removed",
                        f"records {last + 1}..{witnessed.seq} are missing: the witness file "
                        f"says record {witnessed.seq} was signed at {witnessed.time}, but the "
                        f"chain ends at record {last}",
                    ),
                )
            )
        if not found:
            return None
        return max(found, key=lambda item: item[0])[1]  # the first of the widest ranges

    def _signed_beyond(
        self, last: int, beyond: Iterable[Checkpoint] | None
    ) -> tuple[int, Problem] | None:
        """The newest validly signed checkpoint past `last` (else the first badly signed)."""
        if beyond is None:
            beyond = (cp for seq, cp in self.checkpoints.items() if seq > last)
        good: Checkpoint | None = None
        bad: Checkpoint | None = None
        for cp in beyond:
            key = self.trusted_keys.get(cp.key_id)
            if key is not None and verify_signature(key, cp.seq, cp.hash, cp.signature):
                good = cp if good is None or cp.seq > good.seq else good
            elif bad is None or cp.seq < bad.seq:
                bad = cp
        if good is not None:
            return good.seq, Problem(
                last + 1,
                "removed",
                f"records {last + 1}..{good.seq} are missing: a validly signed checkpoint "
                f"covers record {good.seq}",
            )
        if bad is not None:
            return bad.seq, Problem(
                last + 1,
                "checkpoint",
                f"records after {last} are missing: a badly signed checkpoint covers record "
                f"{bad.seq}",
            )
        return None

    def _witnessed_beyond(self, before: str | None) -> Checkpoint | None:
        """The newest witnessed head not yet reached (all left are past the end)."""
        newest: Checkpoint | None = None
        while self._witnessed is not None:
            w = self._witnessed
            if before is None or (w.time is not None and w.time < before):
                newest = w
            self._witnessed = next(self._witness, None)
        return newest

    def _original_seq(self, row: Row) -> int | None:
        seq = row[0]
        rest = row[1:10]
        for distance in range(1, REORDER_SEARCH_WINDOW + 1):
            for candidate in (seq - distance, seq + distance):
                if candidate < 1:
                    continue
                if hashlib.sha256(encode(candidate, *rest)).hexdigest() == row[10]:
                    return candidate
        return None

    def report(
        self, problem: Problem | None, *, started: float, note: str | None, witnessed: bool
    ) -> VerifyReport:
        """What the walk found: `problem` the first fault (None: none), `started` the walk's
        `time.perf_counter()` at its start, `witnessed` whether a witness was checked too."""
        return VerifyReport(
            ok=problem is None,
            records=self.records,
            checkpoints=self.checkpoints_ok,
            first_seq=self.first_seq,
            last_seq=self.next_seq - 1 if self.records else None,
            last_hash=self.last_hash,
            problem=problem,
            seconds=time.perf_counter() - started,
            note=note,
            witnessed_seq=self.witnessed_seq if witnessed else None,
        )
