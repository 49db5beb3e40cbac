"""Validation of what the guest sends, and of the exec arguments sent to it, field by field.

The guest is hostile until proven otherwise: each control message is decoded and checked for
its JSON types and ranges here, and a guest's error answer becomes `GuestError` (or
`FileTooLargeError`) with its text cut to a bounded length.
"""

from __future__ import annotations

from typing import Any

from aamp.guest import wire
from aamp.sandbox.channel.errors import FileTooLargeError, GuestError, GuestProtocolError

_ERROR_MESSAGE_CHARS = 2000
_ERROR_CODE_RE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz_")


def control(ftype: int, payload: bytes, what: str) -> dict[str, Any]:
    if ftype != wire.CONTROL:
        raise GuestProtocolError(
            f"expected a control message {what}, got a {wire.type_name(ftype)} frame"
        )
    try:
        return wire.decode_control(payload)
    except wire.ProtocolError as exc:
        raise GuestProtocolError(f"{what}: {exc}") from None


def raise_if_error(message: dict[str, Any], what: str) -> None:
    if "error" not in message:
        return
    text, code = message.get("error"), message.get("code", "error")
    if not isinstance(text, str) or not isinstance(code, str):
        raise GuestProtocolError(f"malformed error message {what}")
    if not code or len(code) > 32 or not set(code) <= _ERROR_CODE_RE_CHARS:
        raise GuestProtocolError(f"malformed error code {what}")
    text = text[:_ERROR_MESSAGE_CHARS]
    if code == "too_large":
        raise FileTooLargeError(f"{what}: {text}")
    raise GuestError(f"{what}: {text}", code)


def field(message: dict[str, Any], key: str, kind: str, what: str) -> Any:
    """Fetch `key` and check its JSON type; `kind` is int, number, bool, str, or one of
    those with a trailing '?' for "may be null"."""
    value = message.get(key)
    optional = kind.endswith("?")
    base = kind.rstrip("?")
    if value is None and optional:
        return None
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "number": wire.is_finite_number(value),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }[base]
    if not ok:
        raise GuestProtocolError(f"{what}: field {key!r} must be {kind}, got {value!r:.60}")
    return value


def parse_hello(ftype: int, payload: bytes) -> dict[str, Any]:
    what = "in the guest's hello"
    hello = control(ftype, payload, what)
    if hello.get("hello") != "aamp-guest":
        raise GuestProtocolError("the first message is not an aamp guest hello")
    protocol = field(hello, "protocol", "int", what)
    if protocol != wire.PROTOCOL_VERSION:
        raise GuestProtocolError(
            f"guest speaks protocol {protocol}, the host speaks {wire.PROTOCOL_VERSION}"
        )
    version = field(hello, "version", "str", what)
    pid = field(hello, "pid", "int", what)
    if len(version) > 64 or not 0 < pid < 2**31:
        raise GuestProtocolError(f"{what}: version or pid out of range")
    return {"protocol": protocol, "version": version, "pid": pid}


def parse_health(message: dict[str, Any]) -> dict[str, Any]:
    what = "in the health answer"
    raise_if_error(message, "health")
    if message.get("ok") is not True:
        raise GuestProtocolError(f"{what}: 'ok' is not true")
    uptime = field(message, "uptime", "number", what)
    load = message.get("load")
    if load is not None and not (
        isinstance(load, list) and len(load) == 3 and all(wire.is_finite_number(x) for x in load)
    ):
        raise GuestProtocolError(f"{what}: 'load' must be three numbers or null")
    mem = field(message, "mem_available", "int?", what)
    if uptime < 0 or (mem is not None and mem < 0):
        raise GuestProtocolError(f"{what}: negative uptime or memory")
    return {"ok": True, "uptime": float(uptime), "load": load, "mem_available": mem}


def check_exec_args(
    argv: list[str], env: dict[str, str] | None, cwd: str | None, timeout: float | None
) -> None:
    if not isinstance(argv, (list, tuple)) or not argv:
        raise ValueError("argv must be a non-empty list of strings")
    for arg in argv:
        if not isinstance(arg, str) or "\x00" in arg:
            raise ValueError(f"argv items must be strings without NUL bytes, got {arg!r:.60}")
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not key or "=" in key or "\x00" in key:
            raise ValueError(f"bad environment variable name {key!r:.60}")
        if not isinstance(value, str) or "\x00" in value:
            raise ValueError(f"environment variable {key} must be a string without NUL bytes")
    if cwd is not None and (not isinstance(cwd, str) or not cwd or "\x00" in cwd):
        raise ValueError("cwd must be a non-empty string without NUL bytes")
    if timeout is not None and not (wire.is_finite_number(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
