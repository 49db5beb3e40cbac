"""Scrubbing secret forms out of what a service sends back to the guest.

A service may echo the credential it was given (a debug endpoint, an error page quoting the
request, a misconfigured upstream). Whatever comes back — status line, header names and
values, body — passes through a `Scrubber` that replaces every occurrence of every form in
its `SecretForms` (which `secret_forms.py` derives from the secret values and the header
values sent) with a run of one marker byte. `exact` forms match byte for byte (base64);
`folded` forms match whatever the ASCII case of their letters (raw, URL-encoded, JSON, hex).

Search: a header value, and a body up to `SHORT_BODY` bytes, are searched for each form
(folded ones in a lower-cased copy). A longer body — where throughput matters — is searched
once per piece by an Aho-Corasick automaton (`ahocorasick_rs`, over the Rust `aho-corasick`
crate's SIMD multi-literal search) for a few short anchors, one inside every form: an exact
form's anchor is its longest run of letters and digits (shared by its URL-encoded,
JSON-escaped and base64url variants); a folded form's is a window of it with few letters,
searched in every case of those letters (`36383733` once, `e9k2` four times), so the search
stays exact — no lower-cased copy of the body — yet finds the form in any case. Only around
an anchor that occurs are the forms themselves searched for. This keeps a clean body at 2-6
GB/s with dozens of forms (benchmarks/scrub.py); one `bytes.find` per form, or a search in a
lower-cased copy, was an order of magnitude slower than that.

Streaming: a body arrives in pieces, and a form may be split across two of them. The scrubber
keeps the last `longest - 1` bytes of each piece back until the next one arrives (or `flush`),
so every occurrence that starts before that tail is seen whole; everything before the tail
goes out at once, a clean piece as a view of the bytes it came in. Occurrences that overlap
are replaced together, by one marker; a run that reaches into the held-back tail is marked
at once and its rest dropped when the tail goes out (with anything that overlaps it). Bytes
are never rescanned after replacement, so the marker is a byte that occurs in no form (in
neither case): then no occurrence can span a marker, and none can be formed from the pieces
around one.

`BodyDecoder` undoes a gzip, deflate or br Content-Encoding first (a form inside compressed
bytes is invisible to a byte search), in pieces of at most `DECODED_PIECE` bytes however
much a piece of input inflates to; any other coding, or more than one, cannot be scrubbed
and is refused by the proxy. The proxy also asks service upstreams for
`Accept-Encoding: identity`, so decoding is needed only for upstreams that ignore it.
"""

from __future__ import annotations

import bisect
import re
import zlib
from collections.abc import Iterable, Iterator

import brotli
from ahocorasick_rs import BytesAhoCorasick, Implementation, MatchKind

# Bytes that may replace a form: letters and digits never (forms are matched regardless of
# case, and hex uses digits); these are all valid in header names and values.
_MARKER_CANDIDATES = b"*#~!^|_-.$&'`"
MARKER_LENGTH = 8
DECODED_PIECE = 1024 * 1024
MIN_ANCHOR = 6  # a shorter run of letters and digits is no anchor: the whole form is
MAX_ANCHOR = 16  # ...a longer one is cut: 16 base64 characters are specific enough
SHORT_BODY = 32 * 1024  # up to this much, each form is searched for (no finder is built)
_WINDOW_LETTERS = 3  # a folded form's window: at most this many letters (8 spellings)...
_WINDOW_SIZES = (8, 7, 6, 5, 4)  # ...in the longest window size that has one
_ALNUM_RUN = re.compile(rb"[a-z0-9]+")
# The aho-corasick crate picks a prefilter by heuristics tuned for English text: with a few
# patterns it may scan for one to three "rare" or first bytes, which in base64, hex or JSON
# bodies are not rare at all (measured: 50-120 MiB/s instead of 2-6 GB/s). Four patterns of
# four distinct bytes make both sets larger than three, so neither scan is used, which
# leaves its SIMD multi-literal search (Teddy, up to 64 patterns per automaton). The guards
# are bytes that never occur in UTF-8 text; a guard that occurs matches no form.
_GUARDS = tuple(bytes([byte]) * 4 for byte in (0xF8, 0xF9, 0xFA, 0xFB))
_PATTERNS_PER_FINDER = 60  # and the 4 guards: at most 64
_LETTERS = frozenset(b"abcdefghijklmnopqrstuvwxyz")
_LETTER_MASK = bytes(1 if 0x61 <= b <= 0x7A else 0 for b in range(256))


class UnsupportedEncoding(ValueError):
    """A Content-Encoding the scrubber cannot see through."""


class SecretForms:
    """What a `Scrubber` replaces: `exact` byte strings, and `folded` ones (kept lower-case)
    that match whatever the ASCII case of their letters. Never shows a form in its repr."""

    __slots__ = ("_plan", "exact", "folded")

    def __init__(self, exact: Iterable[bytes] = (), folded: Iterable[bytes] = ()):
        self.exact = frozenset(form for form in exact if form)
        self.folded = frozenset(form.lower() for form in folded if form)
        self._plan: _Plan | None = None

    def plan(self) -> _Plan:
        """How these forms are searched, made on first use and shared by every `Scrubber` of
        them (a service credential's forms serve every response on its connection)."""
        if self._plan is None:
            self._plan = _Plan(self)
        return self._plan

    def __contains__(self, form: object) -> bool:
        """Whether `form`, as written, is scrubbed."""
        if not isinstance(form, bytes):
            return False
        return form in self.exact or form.lower() in self.folded

    def __len__(self) -> int:
        return len(self.exact) + len(self.folded)

    def __repr__(self) -> str:
        return f"SecretForms({len(self.exact)} exact, {len(self.folded)} folded)"


class _Plan:
    """The search for one `SecretForms`: its needles (shortest first: a short piece of data,
    a header, is searched only for those that fit in it), the marker, and the anchor finders
    (built on the first long body). Fixed once made; it holds no stream state."""

    __slots__ = ("_finders", "keep", "lengths", "marker", "needles", "reach")

    def __init__(self, forms: SecretForms):
        needles = [(form, False) for form in forms.exact] + [(form, True) for form in forms.folded]
        needles.sort(key=lambda needle: len(needle[0]))
        self.needles = needles
        self.lengths = [len(needle) for needle, _ in needles]
        self.keep = max(self.lengths, default=1) - 1
        every = b"\n".join(needle for needle, _ in needles)
        every += b"\n" + every.upper()
        unused = [b for b in _MARKER_CANDIDATES if bytes([b]) not in every]
        if not unused:  # forms with every candidate: any other byte none of them has
            unused = [b for b in range(256) if not chr(b).isalnum() and bytes([b]) not in every]
        self.marker = bytes(unused[:1]) * MARKER_LENGTH
        self.reach = 0  # how far from an anchor a needle can reach
        self._finders: list[tuple[int, BytesAhoCorasick]] | None = None

    def finders(self) -> list[tuple[int, BytesAhoCorasick]]:
        if self._finders is None:
            patterns = _anchor_patterns(self.needles)
            self.reach = max(len(p) for p in patterns) + self.keep
            finders = []
            for base in range(0, len(patterns), _PATTERNS_PER_FINDER):
                chunk = patterns[base : base + _PATTERNS_PER_FINDER]
                finder = BytesAhoCorasick(
                    [*chunk, *_GUARDS],
                    matchkind=MatchKind.LeftmostFirst,  # Teddy needs a leftmost kind
                    implementation=Implementation.NoncontiguousNFA,  # cheap to build
                )
                finders.append((len(chunk), finder))
            self._finders = finders
        return self._finders


class Scrubber:
    """Replace every form in a stream of bytes. `hits` counts replacements."""

    def __init__(self, forms: SecretForms):
        plan = forms.plan()
        self._plan = plan
        self._needles = plan.needles
        self._lengths = plan.lengths
        self._keep = plan.keep
        self.marker = plan.marker
        self._finders: list[tuple[int, BytesAhoCorasick]] = []  # once a body is long
        self._reach = 0  # how far from an anchor a needle can reach
        self._searched = 0
        self._carry = b""
        self._pending = 0  # bytes at the tail's start that belong to a run already marked
        self.hits = 0

    def __repr__(self) -> str:  # never show the needles
        return f"Scrubber({len(self._needles)} needles, {self.hits} hits)"

    def __bool__(self) -> bool:
        return bool(self._needles)

    def _build_finders(self) -> None:
        self._finders = self._plan.finders()
        self._reach = self._plan.reach

    def _clean(self, data: bytes) -> bool:
        if not self._finders:
            # `needle in memoryview` is always False: a view (the tap's reused receive buffer)
            # is searched as bytes. Short bodies only, so the copy is small.
            raw = bytes(data)
            folded = raw.lower()
            fitting = self._needles[: bisect.bisect_right(self._lengths, len(raw))]
            return not any(n in (folded if f else raw) for n, f in fitting)
        return not any(finder.find_matches_as_indexes(data) for _, finder in self._finders)

    def _occurrences(self, buf: bytes) -> list[tuple[int, int]]:
        """(start, end) of every occurrence of every needle in `buf`, overlapping ones too.

        Without finders (a short body, a header), each needle is searched for. With them,
        only around the anchors they report: they report leftmost matches only, skipping
        any that overlaps one reported, so every anchor lies within the longest pattern of
        a reported match, and every needle within its own length of its anchor."""
        if not self._finders:
            return self._search(buf, 0)
        windows: list[tuple[int, int]] = []
        for size, finder in self._finders:
            for pattern, start, end in finder.find_matches_as_indexes(buf):
                if pattern < size:  # not a guard
                    windows.append((max(0, start - self._reach), end + self._reach))
        windows.sort()
        merged: list[list[int]] = []
        for start, end in windows:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        found: list[tuple[int, int]] = []
        for start, end in merged:
            found += self._search(buf[start:end], start)
        return found

    def _search(self, buf: bytes, base: int) -> list[tuple[int, int]]:
        folded = buf.lower()
        found = []
        for needle, is_folded in self._needles[: bisect.bisect_right(self._lengths, len(buf))]:
            hay = folded if is_folded else buf
            at = hay.find(needle)
            while at >= 0:
                found.append((base + at, base + at + len(needle)))
                at = hay.find(needle, at + 1)
        return found

    def _replace(self, buf: bytes, limit: int, pending: int = 0) -> tuple[bytes, int]:
        """Replace the occurrences that start before `limit`; return (output, pending).

        Occurrences that overlap are replaced together, by one marker. A run that reaches
        past `limit` is marked now and its bytes past `limit` (`pending`, returned) stay in
        the held-back tail, to be dropped next time along with any occurrence that overlaps
        them (one not yet seen whole when this run was marked)."""
        if limit == 0:
            return b"", pending
        found = self._occurrences(buf)
        if pending:
            found.append((0, pending))
        runs = sorted(found)
        out: list[bytes] = []
        pos = i = 0
        while i < len(runs) and runs[i][0] < limit:
            start, end = runs[i]
            i += 1
            while i < len(runs) and runs[i][0] < end:  # overlapping: one run
                end = max(end, runs[i][1])
                i += 1
            out.append(buf[pos:start])
            if not (pending and start == 0):  # a continued run was marked already
                out.append(self.marker)
                self.hits += 1
            pos = end
        if pos > limit:
            return b"".join(out), pos - limit
        out.append(buf[pos:limit])
        return b"".join(out), 0

    def feed(self, data: bytes) -> bytes | memoryview:
        """Scrubbed bytes that are safe to send now (a short tail is held back)."""
        pieces = self.feed_pieces(data)
        if len(pieces) == 1:
            return pieces[0]
        return b"".join(pieces)

    def feed_pieces(self, data: bytes) -> tuple[bytes | memoryview, ...]:
        """`feed`, as pieces to send in order: without a hit, the held-back tail and a view
        of the input, so a clean body (the common case) is searched once and never copied.

        Only an occurrence that starts in the held-back tail can span the seam; it ends within
        `keep` bytes of the new data, so the seam search looks at `tail + data[:keep]` only."""
        if not self._needles:
            return (data,)
        self._searched += len(data)
        if not self._finders and self._searched > SHORT_BODY:
            self._build_finders()
        keep, carry = self._keep, self._carry
        if len(data) > keep and not self._pending and self._clean(data):
            if carry and not self._clean(carry + data[:keep]):
                return (self._feed_copy(data),)
            limit = len(data) - keep
            self._carry = bytes(data[limit:])  # `data` may be a view of a reused buffer
            view = memoryview(data)[:limit]
            return (carry, view) if carry else (view,)
        return (self._feed_copy(data),)

    def _feed_copy(self, data: bytes) -> bytes:
        """The general path: search the tail and the new data as one buffer."""
        buf = self._carry + data
        limit = max(0, len(buf) - self._keep)
        out, self._pending = self._replace(buf, limit, self._pending)
        self._carry = buf[limit:]
        return out

    def flush(self) -> bytes:
        """The held-back tail, scrubbed; the stream is over."""
        buf, pending = self._carry, self._pending
        self._carry, self._pending = b"", 0
        if not buf:
            return b""
        out, _ = self._replace(buf, len(buf), pending)
        return out

    def finds(self, data: bytes) -> bool:
        """Whether some form occurs in `data` (one whole value; the stream state is untouched)."""
        return bool(self._needles) and not self._clean(data)

    def scrub(self, data: bytes) -> bytes:
        """Scrub one whole value (a header), independent of the stream state."""
        if not self._needles or self._clean(data):
            return data
        out, _ = self._replace(data, len(data))
        return out


def _anchor_patterns(needles: list[tuple[bytes, bool]]) -> list[bytes]:
    """The patterns the finders search for: every needle contains one of them, in the case
    it is written in.

    An exact needle's anchor is its longest run of letters and digits (at most
    `MAX_ANCHOR` of it; the needle itself when that run is shorter than `MIN_ANCHOR`),
    unless it contains one already chosen; a folded needle's is a window with at most
    `_WINDOW_LETTERS` letters, searched in all their cases (a window without letters, or an
    exact anchor without letters, is the same in every case). Shortest needles first, so
    the variants of one form reuse the anchor of the plainest."""
    any_case: list[bytes] = []  # lower-case
    exact: list[bytes] = []
    for needle, folded in sorted(needles, key=lambda n: len(n[0])):
        low = needle.lower()
        if any(key in low for key in any_case) or (
            not folded and any(anchor in needle for anchor in exact)
        ):
            continue
        if folded:
            any_case.append(_window(low))
            continue
        core = max(_ALNUM_RUN.findall(low), key=len, default=b"")
        if len(core) < MIN_ANCHOR:
            anchor = needle
        else:
            at = low.find(core)
            anchor = needle[at : at + min(len(core), MAX_ANCHOR)]
        if anchor.lower() == anchor.upper():  # no letters: the same in every case
            any_case.append(anchor)
        else:
            exact.append(anchor)
    return exact + [spelling for key in any_case for spelling in _spellings(key)]


def _window(low: bytes) -> bytes:
    """The window of a lower-case needle to search in every case: the longest (up to 8)
    with at most `_WINDOW_LETTERS` letters, inside a run of letters and digits if one is
    long enough (so URL- and JSON-escaped variants of the form contain it too)."""
    runs = [run for run in _ALNUM_RUN.findall(low) if len(run) >= _WINDOW_SIZES[-1]] or [low]
    masks = [run.translate(_LETTER_MASK) for run in runs]  # b"\x01" per letter
    best = low[: _WINDOW_SIZES[-1]]
    for size in _WINDOW_SIZES:
        fewest = None
        for run, mask in zip(runs, masks, strict=True):
            for i in range(len(run) - size + 1):
                letters = mask.count(1, i, i + size)
                if fewest is None or letters < fewest[0]:
                    fewest = (letters, run[i : i + size])
        if fewest is None:
            continue
        if fewest[0] <= _WINDOW_LETTERS:
            return fewest[1]
        best = fewest[1]
    return best


def _spellings(key: bytes) -> list[bytes]:
    """`key` with its letters in every combination of cases."""
    out = [b""]
    for byte in key:
        if byte in _LETTERS:
            out = [prefix + bytes([c]) for prefix in out for c in (byte, byte - 32)]
        else:
            out = [prefix + bytes([byte]) for prefix in out]
    return out


class BodyDecoder:
    """Undo a response's Content-Encoding (identity, gzip, x-gzip, deflate, br) piece by
    piece, in decoded pieces of at most `DECODED_PIECE` bytes."""

    def __init__(self, encoding: str | None):
        codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip()]
        codings = [c for c in codings if c != "identity"]
        self._z: zlib._Decompress | None = None
        self._br: brotli.Decompressor | None = None
        if not codings:
            pass
        elif len(codings) == 1 and codings[0] in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif len(codings) == 1 and codings[0] == "deflate":
            self._z = zlib.decompressobj(zlib.MAX_WBITS)
        elif len(codings) == 1 and codings[0] == "br":
            self._br = brotli.Decompressor()
        else:
            raise UnsupportedEncoding(
                f"cannot scrub a response in Content-Encoding {', '.join(codings)!r}"
            )

    @property
    def decoding(self) -> bool:
        return self._z is not None or self._br is not None

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Decoded pieces of at most `DECODED_PIECE` bytes each (a compression bomb stays
        bounded in memory: the caller sends each piece before the next is inflated)."""
        if self._br is not None:
            yield from self._feed_brotli(data)
        elif self._z is not None:
            try:
                while data:
                    yield self._z.decompress(data, DECODED_PIECE)
                    data = self._z.unconsumed_tail
            except zlib.error as exc:
                raise UnsupportedEncoding(f"the compressed response is corrupt: {exc}") from None
        else:
            yield data

    def _feed_brotli(self, data: bytes) -> Iterator[bytes]:
        # brotli stops growing its output once it reaches the limit, so one output can be
        # up to about twice the limit (it is cut); what it held back comes from later calls
        # without input, until one returns nothing.
        assert self._br is not None
        try:
            out = self._br.process(data, output_buffer_limit=DECODED_PIECE)
            while out:
                for at in range(0, len(out), DECODED_PIECE):
                    yield out[at : at + DECODED_PIECE]
                out = self._br.process(b"", output_buffer_limit=DECODED_PIECE)
        except brotli.error as exc:
            raise UnsupportedEncoding(f"the compressed response is corrupt: {exc}") from None

    def flush(self) -> bytes:
        return self._z.flush() if self._z is not None else b""
