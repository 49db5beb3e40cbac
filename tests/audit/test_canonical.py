"""The canonical encoding is the spec: pinned byte for byte, and equal to its JSON definition."""

from __future__ import annotations

import hashlib
import json

import pytest

from aamp.audit.canonical import GENESIS_HASH, canonical_json, encode, record_hash


def _definition(seq, time, actor, action, resource, decision, reason, rid, details, prev):  # type: ignore[no-untyped-def]
    obj = {
        "seq": seq,
        "time": time,
        "actor": actor,
        "action": action,
        "resource": resource,
        "decision": decision,
        "reason": reason,
        "request_id": rid,
        "details": details,
        "prev_hash": prev,
    }
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def test_bytes_are_exactly_the_documented_form() -> None:
    got = encode(
        1,
        "2025-01-02T03:04:05.000006Z",
        "user:alice",
        "login",
        "user:alice",
        "allow",
        None,
        "req-1",
        canonical_json({"b": 1, "a": [True, None, "é"]}),
        GENESIS_HASH,
    )
    expected = (
        b'{"action":"login","actor":"user:alice","decision":"allow",'
        b'"details":{"a":[true,null,"\xc3\xa9"],"b":1},"prev_hash":"' + b"0" * 64 + b'",'
        b'"reason":null,"request_id":"req-1","resource":"user:alice","seq":1,'
        b'"time":"2025-01-02T03:04:05.000006Z"}'
    )
    assert got == expected
    assert (
        record_hash(
            1,
            "2025-01-02T03:04:05.000006Z",
            "user:alice",
            "login",
            "user:alice",
            "allow",
            None,
            "req-1",
            canonical_json({"b": 1, "a": [True, None, "é"]}),
            GENESIS_HASH,
        )
        == hashlib.sha256(expected).hexdigest()
    )


@pytest.mark.parametrize(
    "details",
    [
        {},
        {"z": 1, "a": {"y": [1.5, -0.0, 1e300], "b": 'quote " backslash \\ tab \t nl \n'}},
        {"unicode": "日本語 ✓ \u2028", "ctrl": "\x01\x1f", "big": 2**70},
    ],
)
def test_concatenation_equals_the_json_definition(details: dict[str, object]) -> None:
    args = (
        42,
        "2025-06-30T23:59:59.999999Z",
        'actor "x"',
        "sandbox.exec",
        "sandbox:sb-1",
        "deny",
        "reason with ünïcode",
        None,
        details,
        "ab" * 32,
    )
    assert encode(*args[:8], canonical_json(details), args[9]) == _definition(*args)


def test_nan_is_not_canonical() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})
