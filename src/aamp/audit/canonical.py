"""The canonical encoding of an audit record, and its hash. This module IS the spec.

A record's hash is `SHA-256(canonical_bytes(record))` as 64 lowercase hex digits, where
`canonical_bytes` is the UTF-8 encoding of this JSON object:

    {"action":A,"actor":A,"decision":D,"details":{...},"prev_hash":P,"reason":R,
     "request_id":Q,"resource":S,"seq":N,"time":T}

- keys sorted (as above), no whitespace anywhere (separators `,` and `:`), non-ASCII characters
  written as themselves (UTF-8), not `\\u` escapes; strings escaped as Python's `json` does
  (`"`, `\\`, control characters as `\\n`, `\\t`, ..., `\\u00XX`);
- `seq` a JSON integer (1, 2, ...); `time` RFC 3339 UTC with exactly six fractional digits and
  a `Z` (`2025-01-02T03:04:05.000006Z`); `reason` and `request_id` a string or `null`;
- `details` a JSON object encoded by the same rules, recursively (sorted keys, no whitespace;
  numbers as Python's `json` writes them; NaN and infinities are not allowed);
- `prev_hash` the previous record's hash; the first record's is 64 zeros (`GENESIS_HASH`).

Equivalently, in Python: `json.dumps(obj, sort_keys=True, separators=(",", ":"),
ensure_ascii=False, allow_nan=False).encode("utf-8")`. `encode()` below builds the same bytes
by concatenation around the stored canonical `details` text, which is much faster on the
verify path; the tests check that the two agree.
"""

from __future__ import annotations

import hashlib
import json
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

GENESIS_HASH = "0" * 64


def canonical_json(value: Any) -> str:
    """The canonical JSON text of a value (see module docstring)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def encode(
    seq: int,
    time: str,
    actor: str,
    action: str,
    resource: str,
    decision: str,
    reason: str | None,
    request_id: str | None,
    details_json: str,
    prev_hash: str,
) -> bytes:
    """Canonical bytes of a record whose details are already canonical JSON text.

    (One f-string: verify calls this once per record, and building the text by `+` made
    twenty intermediate strings per call.)
    """
    eb = encode_basestring
    return (
        f'{{"action":{eb(action)},"actor":{eb(actor)},"decision":{eb(decision)},'
        f'"details":{details_json},"prev_hash":{eb(prev_hash)},'
        f'"reason":{"null" if reason is None else eb(reason)},'
        f'"request_id":{"null" if request_id is None else eb(request_id)},'
        f'"resource":{eb(resource)},"seq":{int(seq)},"time":{eb(time)}}}'
    ).encode()


def record_hash(*fields: Any) -> str:
    """`SHA-256(encode(*fields))` in hex; arguments as for `encode`."""
    return hashlib.sha256(encode(*fields)).hexdigest()
