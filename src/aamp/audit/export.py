"""`export(...)` writes the chain as JSON lines; `verify_export(path)` checks such a file offline.

File format (UTF-8, one JSON object per line, each with a `kind`):

- first line: `{"kind":"header","format":"aamp-audit-export/1","since_seq":N,
  "public_keys":{key_id: public key hex},"exported_at":time}` (`exported_at`: when the
  export began; every record committed before then is in it);
- one line per record, in seq order: `{"kind":"record","seq":..,"time":..,"actor":..,
  "action":..,"resource":..,"decision":..,"reason":..,"request_id":..,"details":{..},
  "prev_hash":..,"hash":..}` — the fields a SIEM wants, plus what re-hashing needs;
- after a record that has a signed checkpoint: `{"kind":"checkpoint","seq":..,"hash":..,
  "key_id":..,"signature":..}`;
- last line: `{"kind":"end","records":count,"last_seq":..,"last_hash":..}`, so a file cut short
  is detected.

An export that starts mid-chain (`since`) takes its first record's `prev_hash` on trust; every
record after it is checked. Checkpoint signatures are checked against the keys the caller
trusts, or else against the header's keys (and the report says so).

Given the witness (`witness.WitnessReader`), `verify_export` also checks each witnessed head
inside the file's range against its record, and fails naming the missing range when the file
ends before a head that was witnessed before the export began (so the database was already
cut when it was exported, or the file was cut since). Heads witnessed after `exported_at`
are not expected in the file.
"""

from __future__ import annotations

import json
import time as _time
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import func, select

from aamp.audit.canonical import GENESIS_HASH, canonical_json
from aamp.audit.chain import ChainChecker, Checkpoint, Problem, VerifyReport
from aamp.audit.record import RECORD_COLUMNS
from aamp.audit.signing import public_key_from_hex, public_key_hex
from aamp.audit.verify import read_pages
from aamp.audit.witness import WitnessReader
from aamp.store import Store
from aamp.store.tables import AuditRecordRow
from aamp.store.timestamps import format_time, is_time, now

FORMAT = "aamp-audit-export/1"
_r = AuditRecordRow.__table__.c


class ExportFormatError(ValueError):
    """The file is not an aamp audit export; the message names the line."""


def _start_seq(store: Store, since: datetime | int | None) -> int | None:
    if since is None:
        return 1
    if isinstance(since, int):
        if since < 1:
            raise ValueError("since must be a seq >= 1 or an aware datetime")
        return since
    bound = format_time(since)
    # By seq from the first record at or after the time, so the export has no holes even if
    # two writers' clocks disagree slightly.
    with store.engine.connect() as conn:
        first = conn.execute(select(func.min(_r.seq)).where(_r.time >= bound)).scalar()
    return None if first is None else int(first)


def export(
    store: Store,
    out: IO[str],
    *,
    since: datetime | int | None = None,
    public_keys: Mapping[str, Ed25519PublicKey] | None = None,
) -> int:
    """Write records from `since` (a seq, or the first record at/after a time); returns count."""
    exported_at = now()  # before anything is read: all committed by then is in the file
    start = _start_seq(store, since)
    keys = {kid: public_key_hex(k) for kid, k in (public_keys or {}).items()}
    out.write(
        _line(
            {
                "kind": "header",
                "format": FORMAT,
                "since_seq": start,
                "public_keys": keys,
                "exported_at": exported_at,
            }
        )
    )
    count = 0
    last_seq: int | None = None
    last_hash: str | None = None
    pages = () if start is None else read_pages(store, after=start - 1)
    for rows, checkpoints in pages:
        for row in rows:
            record = dict(zip(RECORD_COLUMNS, row, strict=True))
            record["details"] = json.loads(record["details"])
            out.write(_line({"kind": "record", **record}))
            seq = record["seq"]
            cp = checkpoints.get(seq)
            if cp is not None:
                out.write(
                    _line(
                        {
                            "kind": "checkpoint",
                            "seq": cp.seq,
                            "hash": cp.hash,
                            "key_id": cp.key_id,
                            "signature": cp.signature,
                        }
                    )
                )
            count += 1
            last_seq, last_hash = seq, record["hash"]
    out.write(
        _line({"kind": "end", "records": count, "last_seq": last_seq, "last_hash": last_hash})
    )
    return count


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def _read(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open("r", encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise ExportFormatError(f"{path}: line {number} is not JSON") from None
            if not isinstance(obj, dict) or "kind" not in obj:
                raise ExportFormatError(f"{path}: line {number} has no 'kind'")
            yield number, obj


def verify_export(
    path: str | Path,
    trusted_keys: Mapping[str, Ed25519PublicKey] | None = None,
    *,
    witness: WitnessReader | None = None,
) -> VerifyReport:
    """Verify an export file offline, streaming; the first problem names its record."""
    started = _time.perf_counter()
    path = Path(path)
    lines = _read(path)
    try:
        _, header = next(lines)
    except StopIteration:
        raise ExportFormatError(f"{path} is empty") from None
    if header.get("kind") != "header" or header.get("format") != FORMAT:
        raise ExportFormatError(f"{path}: line 1 is not an {FORMAT} header")
    note = None
    if trusted_keys is None:
        trusted_keys = {k: public_key_from_hex(v) for k, v in header["public_keys"].items()}
        note = "checkpoint signatures checked against the keys named in the file itself"
    start_seq = int(header.get("since_seq") or 1)
    exported_at = header.get("exported_at")
    if witness is not None and not is_time(exported_at):
        # An export from before `exported_at` existed: its own heads are still checked.
        exported_at = ""
        note = (note + "; " if note else "") + (
            "the file does not say when it was exported, so the witness checked only the "
            "records it holds"
        )
    checkpoints: dict[int, Checkpoint] = {}
    checker = ChainChecker(
        checkpoints,
        trusted_keys,
        start_seq=start_seq,
        start_prev_hash=GENESIS_HASH if start_seq == 1 else None,
        witness=() if witness is None else witness,
    )
    problem: Problem | None = None
    pending: Any = None  # a record waiting for a possible checkpoint line
    end: dict[str, Any] | None = None

    def flush() -> Problem | None:
        nonlocal pending
        if pending is None:
            return None
        row = pending
        pending = None
        return checker.feed(row)

    for number, obj in lines:
        kind = obj["kind"]
        if end is not None:
            raise ExportFormatError(f"{path}: line {number} follows the end line")
        if kind == "checkpoint":
            try:
                cp = Checkpoint(int(obj["seq"]), obj["hash"], obj["key_id"], obj["signature"])
            except (KeyError, TypeError, ValueError):
                raise ExportFormatError(
                    f"{path}: line {number} is a malformed checkpoint"
                ) from None
            checkpoints[cp.seq] = cp
            continue
        problem = flush()
        if problem is not None:
            break
        if kind == "record":
            try:
                row = tuple(obj[f] for f in RECORD_COLUMNS)
                row = (int(row[0]), *row[1:8], canonical_json(row[8]), row[9], row[10])
            except (KeyError, TypeError, ValueError):
                raise ExportFormatError(f"{path}: line {number} is a malformed record") from None
            pending = row
        elif kind == "end":
            end = obj
        else:
            raise ExportFormatError(f"{path}: line {number} has unknown kind {kind!r}")
    if problem is None:
        problem = flush()
    if problem is None:
        if end is None:
            problem = Problem(
                checker.next_seq,
                "removed",
                f"the file ends without its end line after record {checker.next_seq - 1}: "
                "records were cut off",
            )
        else:
            problem = checker.finish(
                expected_last_seq=end.get("last_seq"),
                witnessed_before=None if witness is None else exported_at,
            )
            if problem is None and end.get("records") != checker.records:
                problem = Problem(
                    checker.next_seq,
                    "removed",
                    f"the end line counts {end.get('records')} records, the file has "
                    f"{checker.records}",
                )
    if witness is not None:
        witness_problem = witness.problem(chain_has_records=checker.records > 0)
        if problem is None:
            problem = witness_problem
        elif witness_problem is not None:
            note = (note + "; " if note else "") + f"also: {witness_problem.message}"
    return checker.report(problem, started=started, note=note, witnessed=witness is not None)
