"""The witness: every signed head of the audit chain, also kept outside the database.

`$AAMP_HOME/audit-witness.jsonl` gets one line per checkpoint the host process commits,
appended and fsynced right after the commit (and forwarded, see `forward.py`). A line:

    {"seq":1234,"hash":"<64 hex>","key_id":"<32 hex>","signature":"<128 hex>","time":"<time>"}

`signature` is the checkpoint's Ed25519 signature over (seq, hash) (`signing.py`), `time` when
it was signed. Whoever can write the database but not this file cannot remove records up to
the newest line: `verify` finds the database ending before it, or another record at its seq.

What the writer keeps and the reader checks (anything else is damage):
- seq strictly increases from line to line: a checkpoint no newer than the last line is not
  written (a head signed again, or a database moved back: the file keeps the high-water mark);
- every line ends with a newline; a torn line (a crash of the machine mid-write) is left as it
  is, and the next line starts on a line of its own;
- every signature verifies with a key the reader trusts.

Processes sharing one `$AAMP_HOME` take an exclusive `flock` to append. A reader takes the
shared lock only to learn the file's size, then reads that many bytes: complete lines, all
written after their checkpoints committed, while appends go on.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aamp.audit.chain import Checkpoint, Problem
from aamp.audit.forward import WitnessForward, write_all
from aamp.audit.signing import verify_signature
from aamp.store.keyfiles import fsync_dir
from aamp.store.timestamps import is_time

WITNESS_FILENAME = "audit-witness.jsonl"
_KEYS = ("seq", "hash", "key_id", "signature", "time")
_HEX = {"hash": 64, "key_id": 32, "signature": 128}
_HEX_RE = re.compile(r"^[0-9a-f]+\Z")
_TAIL_BYTES = 4096  # more than one line: enough to find the last complete one
MAX_LINE_BYTES = 4096  # a line is about 300 bytes

log = logging.getLogger(__name__)


def witness_line(cp: Checkpoint) -> bytes:
    """The file's line for `cp` (ASCII, ends with a newline)."""
    if cp.time is None:
        raise ValueError("a witnessed checkpoint needs the time it was signed")
    body = {
        "seq": cp.seq,
        "hash": cp.hash,
        "key_id": cp.key_id,
        "signature": cp.signature,
        "time": cp.time,
    }
    return (json.dumps(body, separators=(",", ":")) + "\n").encode("ascii")


class WitnessFile:
    """The appending side (the host process): `append(cp)` after each checkpoint commits."""

    def __init__(self, path: Path, forward: WitnessForward | None = None) -> None:
        self.path = path
        self.forward = forward
        self._last_seq = 0  # the newest line this process wrote or found

    def create(self) -> None:
        """Create the empty file if missing, so that a missing witness means a removed one."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return
        os.close(fd)
        fsync_dir(self.path.parent)

    def append(self, cp: Checkpoint) -> bool:
        """Append `cp` if it is newer than the last line, fsynced, then forward it.

        Returns whether a line was written. Raises OSError if the file cannot be written; a
        failed forward is logged, not raised (the local line is written by then).
        """
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            file_seq, ends_with_newline = _tail(fd)
            self._last_seq = max(self._last_seq, file_seq)
            if cp.seq <= self._last_seq:
                if cp.seq < self._last_seq:
                    log.warning(
                        "audit head %d not witnessed: the witness already holds record %d "
                        "(another process wrote it, or records were removed from the "
                        "database: `aamp audit verify` tells which)",
                        cp.seq,
                        self._last_seq,
                    )
                return False
            line = witness_line(cp)
            write_all(fd, line if ends_with_newline else b"\n" + line)
            os.fsync(fd)
            self._last_seq = cp.seq
            if self.forward is not None:
                # Under the lock: the forwarded copy increases like the file does.
                self.forward.send(line)
        finally:
            os.close(fd)  # also releases the lock
        if created:
            fsync_dir(self.path.parent)
        return True


def _tail(fd: int) -> tuple[int, bool]:
    """(seq of the last complete line or 0, whether the file ends with a newline)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0, True
    start = max(0, size - _TAIL_BYTES)
    data = os.pread(fd, size - start, start)
    ends_with_newline = data.endswith(b"\n")
    # The last piece after splitting is empty, or a torn line; the newest complete line that
    # parses gives the seq (a damaged one is the reader's to report).
    for piece in reversed(data.split(b"\n")[:-1]):
        try:
            seq = json.loads(piece)["seq"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(seq, int):
            return seq, ends_with_newline
    return 0, ends_with_newline


class WitnessReader:
    """The checking side: the file's lines as Checkpoints, in order, each checked.

    Iterate once (`ChainChecker(witness=reader)`). A damaged line is skipped (the first is
    kept in `damage`) and reading goes on, so damage hides no later line; a line cut off at
    the end stops it. `problem(chain_has_records)` afterwards says what is wrong with the
    witness itself, if anything. The file's size is taken when the reader is made: make it
    before reading the chain's head.
    """

    def __init__(self, path: Path, trusted_keys: Mapping[str, Ed25519PublicKey]) -> None:
        self.path = path
        self.trusted_keys = trusted_keys
        self.damage: Problem | None = None
        self.lines = 0  # good lines read
        self.last: Checkpoint | None = None  # the newest good line
        self.exists, self._size = _locked_size(path)

    def __iter__(self) -> Iterator[Checkpoint]:
        if not self.exists or self._size == 0:
            return
        with self.path.open("rb") as fh:
            remaining = self._size
            number = 0
            while remaining > 0:
                raw = fh.readline(min(remaining, MAX_LINE_BYTES))
                if not raw:  # the file shrank while being read
                    self._damaged(number + 1, "the file became shorter while it was read")
                    return
                remaining -= len(raw)
                number += 1
                if not raw.endswith(b"\n") and remaining > 0:
                    self._damaged(number, f"the line is longer than {MAX_LINE_BYTES} bytes")
                    remaining -= _skip_line(fh, remaining)
                    continue
                cp = self._parse(number, raw)
                if cp is None:
                    continue
                self.lines += 1
                self.last = cp
                yield cp

    def _parse(self, number: int, raw: bytes) -> Checkpoint | None:
        if not raw.endswith(b"\n"):
            self._damaged(number, "the line is cut off (no line end): the file was truncated")
            return None
        try:
            obj = json.loads(raw)
        except ValueError:
            self._damaged(number, "the line is not JSON")
            return None
        why = _malformed(obj)
        if why is not None:
            self._damaged(number, why)
            return None
        cp = Checkpoint(obj["seq"], obj["hash"], obj["key_id"], obj["signature"], obj["time"])
        if self.last is not None and cp.seq <= self.last.seq:
            self._damaged(
                number, f"record {cp.seq} follows record {self.last.seq} (lines must increase)"
            )
            return None
        key = self.trusted_keys.get(cp.key_id)
        if key is None:
            self._damaged(number, f"record {cp.seq} is signed by unknown key {cp.key_id}")
            return None
        if not verify_signature(key, cp.seq, cp.hash, cp.signature):
            self._damaged(number, f"the signature for record {cp.seq} is invalid")
            return None
        return cp

    def _damaged(self, number: int, why: str) -> None:
        if self.damage is None:
            where = f"the witness file {self.path} is damaged at line {number}"
            self.damage = Problem(None, "witness_damaged", f"{where}: {why}")

    def problem(self, *, chain_has_records: bool) -> Problem | None:
        """What is wrong with the witness itself, once the chain has been walked."""
        if self.damage is not None:
            return self.damage
        if not self.exists and chain_has_records:
            return Problem(
                None,
                "witness_damaged",
                f"the witness file {self.path} does not exist, but the chain holds records: it "
                "was removed (the host process creates it when it starts)",
            )
        return None


def _skip_line(fh: BinaryIO, remaining: int) -> int:
    """Read to the end of the current line (at most `remaining` bytes); bytes read."""
    skipped = 0
    while skipped < remaining:
        chunk = fh.readline(min(remaining - skipped, MAX_LINE_BYTES))
        if not chunk:
            break
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _locked_size(path: Path) -> tuple[bool, int]:
    """(exists, size) read under the shared lock: no append is half-written at that size."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False, 0
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        return True, os.fstat(fd).st_size
    finally:
        os.close(fd)


def _malformed(obj: object) -> str | None:
    """Why `obj` is not a witness line, or None."""
    if not isinstance(obj, dict) or set(obj) != set(_KEYS):
        return f"the line is not an object with exactly {', '.join(_KEYS)}"
    seq = obj["seq"]
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return "seq is not a record number"
    for name, length in _HEX.items():
        value = obj[name]
        if not isinstance(value, str) or len(value) != length or not _HEX_RE.match(value):
            return f"{name} is not {length} lowercase hex digits"
    if not is_time(obj["time"]):
        return "time is not an aamp timestamp"
    return None
