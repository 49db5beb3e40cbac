"""Reading scrubbed output the way a guest would, to find any part of a secret left in it.

`readings(data)` decodes `data` every way a guest could try, independently of the scrubber's
own form list: as it is and case-folded; URL-decoded (`%XX` and `+`); JSON-unescaped (`\\/`,
`\\uXXXX`); and every run of hex or base64/base64url characters in any of those, decoded
from each of its possible starting offsets. `leaked(data, secrets)` names the first secret
of which some piece of `FRAGMENT` bytes (or the whole, if shorter) is in any reading.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
import urllib.parse
from collections.abc import Iterable

FRAGMENT = 6  # a scrubbed base64 middle leaves at most a few bits of its ends readable
_HEX_RUN = re.compile(rb"[0-9A-Fa-f]{8,}")
_B64_RUN = re.compile(rb"[A-Za-z0-9+/]{6,}")
_B64URL_RUN = re.compile(rb"[A-Za-z0-9_-]{6,}")
_JSON_U = re.compile(r"\\u([0-9a-fA-F]{4})")


def _unescaped(data: bytes) -> list[bytes]:
    text = data.decode("latin-1")
    json_text = _JSON_U.sub(lambda m: chr(int(m.group(1), 16)), text)
    json_text = json_text.replace("\\/", "/").replace('\\"', '"').replace("\\\\", "\\")
    return [
        data,
        urllib.parse.unquote_plus(text).encode("latin-1"),
        urllib.parse.unquote(text).encode("latin-1"),
        json_text.encode("latin-1", "replace"),
    ]


def _decoded_runs(data: bytes) -> list[bytes]:
    out: list[bytes] = []
    for run in _HEX_RUN.findall(data):
        for start in (0, 1):
            even = run[start:][: (len(run) - start) // 2 * 2]
            out.append(binascii.unhexlify(even))
    for pattern, alphabet in ((_B64_RUN, None), (_B64URL_RUN, b"-_")):
        for run in pattern.findall(data):
            for start in range(4):
                piece = run[start:]
                piece = piece[: len(piece) // 4 * 4 + (4 if len(piece) % 4 > 1 else 0)]
                piece = piece + b"=" * (-len(piece) % 4)
                with contextlib.suppress(binascii.Error):
                    out.append(base64.b64decode(piece, altchars=alphabet))
    return out


def readings(data: bytes) -> list[bytes]:
    texts = _unescaped(data)
    out = list(texts)
    for text in texts:
        out.extend(_decoded_runs(text))
    return [reading.lower() for reading in out]


def leaked(data: bytes, secrets: Iterable[str]) -> str | None:
    """The first secret some piece of which can be read in `data`, or None."""
    seen = readings(data)
    for secret in secrets:
        value = secret.encode().lower()
        size = min(len(value), FRAGMENT)
        pieces = {value[i : i + size] for i in range(len(value) - size + 1)}
        if any(piece in reading for piece in pieces for reading in seen):
            return secret
    return None
