"""The spellings of a secret that a service could send back: what the scrubber looks for.

A service echoes a credential in whatever form its code happens to hold it: a debug endpoint
quoting the request (raw, or JSON-escaped), a redirect or log line (URL-encoded), a token
introspection answer (base64 of the header it got), a dump of bytes (hex). `secret_forms`
takes the secret values used for one request and the texts actually sent with them (the
whole header value — `Bearer <tok>`, `Basic <base64>`, a custom header's value — and the
basic-auth `user:password` pair) and derives:

- of every secret value: the value, its URL encodings (percent-encoding as the common
  encoders write it: RFC 3986, path-safe, JavaScript's `encodeURIComponent`, form encoding
  with `+` for space, PHP's `urlencode`, everything escaped) and its JSON escapes (plain,
  with `\\/`, with `\\u003c`-style HTML-safe escapes) — matched ASCII-case-insensitively,
  so an upper- or lower-cased (or any mixed-case) echo and either case of a percent-escape's
  hex are caught. A sent text contains its secrets as they are, so these forms of it
  contain theirs (and an echoed `Bearer ********` still says what it was);
- of every secret value and every sent text: hex, matched case-insensitively; base64 and
  base64url, padded and unpadded, of the whole text, and the stable middle of its encoding
  at each of the three alignments a text can have inside a longer base64 string (starting
  at byte offset 0, 1 or 2 mod 3: the characters that depend on the text's bits only) —
  matched exactly (base64 is case-sensitive), and also URL-encoded (either hex case) and
  with `\\/` JSON escapes. The middles make any base64 string that contains the secret
  anywhere (a whole request head, a JSON document) lose it.

Minimum length: a secret value itself — raw, URL-encoded or JSON-escaped — is always
scrubbed, however short (a five-letter secret costs every such word in every response, in
any case: that is the admin's choice of secret, and leaking it is worse). A derived form
(hex, base64 or a base64 middle) is scrubbed only if it pins at least `MIN_DERIVED_BITS`
(32) bits: 8 hex characters, 6 base64 characters. A shorter one would match innocent hex or
base64 text often (a 4-character middle, 24 bits, once in every 16 MB of random base64);
one of 32 bits matches random text once in 4 GiB at most, and such a false hit costs the
guest a few replaced bytes, never a leak. So a 1-3 byte secret is scrubbed raw only (its
header's encodings still whole), a 4-byte one also as hex and as whole base64, and from 5
bytes on in every form above, at every alignment.

Not covered (not plausible echoes of a header value, or not recoverable by a byte search):
other encodings (base32, double URL-encoding, quoted-printable, `\\xNN` escapes), base64
wrapped across lines, a secret split by the upstream into pieces. An upstream that wants
to leak the secret it was given can always encode it some other way: scrubbing stops
accidental echoes; the upstream is trusted with the value.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Iterable

from aamp.egress.scrub import SecretForms

MIN_DERIVED_BITS = 32
_B64_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_ALNUM = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
# (characters left unescaped besides letters and digits, whether a space is "+"), after
# the encoders services use: RFC 3986 / Python's quote, path-safe quote, JavaScript's
# encodeURIComponent, WHATWG/HTML form encoding, PHP's urlencode, and "everything escaped".
_URL_ENCODERS = (
    (frozenset(b"-._~"), False),
    (frozenset(b"-._~"), True),
    (frozenset(b"-._~/"), False),
    (frozenset(b"-._~!'()*"), False),
    (frozenset(b"-._*"), True),
    (frozenset(b"-._"), True),
    (frozenset(b"-._"), False),
    (frozenset(), False),
)
_JSON_SPECIAL = re.compile(r"[\x00-\x1f\"\\/<>&']")  # what some JSON encoder escapes
_JSON_HTML = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", ord("'"): "\\u0027"}


def secret_forms(secrets: Iterable[str], sent: Iterable[str] = ()) -> SecretForms:
    """Every form above of every secret value, and the hex and base64 forms of every text
    sent with them.

    `secrets` are the values themselves; `sent` the header values (and the basic-auth pair)
    that carried them upstream. A sent text contains its secrets as they are, so its raw,
    URL and JSON forms contain theirs (and an echoed `Bearer ********` still says what it
    was); its hex and base64 are scrubbed whole."""
    secrets = list(dict.fromkeys(secrets))
    exact: set[bytes] = set()
    folded: set[bytes] = set()
    for text in secrets:
        data = text.encode("utf-8")
        folded.add(data)
        folded.update(_url_encoded(data, cases=(b"%%%02X",)))
        if _JSON_SPECIAL.search(text):
            folded.update(_json_escaped(text))
    for text in dict.fromkeys((*secrets, *sent)):
        data = text.encode("utf-8")
        if len(data) * 8 >= MIN_DERIVED_BITS:
            folded.add(data.hex().encode("ascii"))
        for encoded in _base64_forms(data):
            exact.add(encoded)
            if b"/" in encoded:
                exact.add(encoded.replace(b"/", b"\\/"))
            exact.update(_url_encoded(encoded, cases=(b"%%%02X", b"%%%02x")))
    return SecretForms(exact, folded)


def _url_encoded(data: bytes, *, cases: tuple[bytes, ...]) -> set[bytes]:
    """`data` percent-encoded as each encoder in `_URL_ENCODERS` writes it, with the hex
    digits in each of `cases` (a format: upper or lower case), where that differs."""
    specials = data.translate(None, _ALNUM)
    if not specials:
        return set()
    out: set[bytes] = set()
    for escaped, plus in _url_plans(frozenset(specials)):
        for case in cases:
            text = data
            for byte in escaped:
                text = text.replace(bytes([byte]), case % byte)
            out.add(text.replace(b" ", b"+") if plus else text)
    return out


@functools.cache
def _url_plans(specials: frozenset[int]) -> tuple[tuple[tuple[int, ...], bool], ...]:
    """For a set of characters other than letters and digits, the distinct ways the
    encoders treat them: (characters escaped, "%" first; whether spaces become "+").
    Cached by character set only: it holds no part of any value."""
    plans: dict[tuple[tuple[int, ...], bool], None] = {}
    for keep, plus in _URL_ENCODERS:
        escaped = specials - keep - ({0x20} if plus else set())
        space_plus = plus and 0x20 in specials
        if escaped or space_plus:
            plans[(tuple(sorted(escaped, key=lambda b: (b != 0x25, b))), space_plus)] = None
    return tuple(plans)


def _json_escaped(text: str) -> set[bytes]:
    """`text` inside a JSON string: as `json.dumps` writes it, with `\\/` for "/" (PHP),
    and with `\\u003c`-style escapes for <, >, & and ' (Go, PHP's JSON_HEX_*)."""
    plain = json.dumps(text)[1:-1]
    return {
        plain.encode("ascii"),
        plain.replace("/", "\\/").encode("ascii"),
        plain.translate(_JSON_HTML).encode("ascii"),
    }


def _base64_forms(data: bytes) -> set[bytes]:
    """Base64 and base64url of `data`: whole (padded and unpadded) and the stable middle of
    its encoding at offsets 0, 1 and 2 mod 3 inside a longer string; only forms that pin
    at least `MIN_DERIVED_BITS`."""
    forms: set[bytes] = set()
    whole = base64.b64encode(data)
    candidates = [whole, whole.rstrip(b"=")]
    for align in range(3):
        # With `align` bytes before it, character i of the encoding covers bits
        # [6i, 6i + 6) of the stream; those wholly inside the value's bits are stable.
        encoded = base64.b64encode(bytes(align) + data)
        start = -(-8 * align // 6)
        end = 8 * (align + len(data)) // 6
        candidates.append(encoded[start:end])
    for form in candidates:
        if 6 * len(form.rstrip(b"=")) >= MIN_DERIVED_BITS:
            forms.add(form)
            forms.add(form.translate(_B64_TO_URLSAFE))
    return forms
