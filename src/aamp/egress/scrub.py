"""Scrubbing secret values out of what a service sends back to the guest.

A service may echo the credential it was given (a debug endpoint, an error page quoting the
request, a misconfigured upstream). Whatever comes back passes through a `Scrubber` that
replaces every occurrence of every form of every secret value used for that request with a
run of one marker byte.

Streaming: a body arrives in pieces, and a value may be split across two of them. The scrubber
keeps the last `longest - 1` bytes of each piece back until the next one arrives (or `flush`),
so every occurrence is seen whole; everything before that tail goes out at once. Bytes are
never rescanned after replacement, so the marker is a byte that occurs in no needle: then no
occurrence can span a marker, and none can be formed from the pieces around one.

`BodyDecoder` undoes a gzip, deflate or br Content-Encoding first (a value inside compressed
bytes is invisible to a byte search), in pieces of at most `DECODED_PIECE` bytes however
much a piece of input inflates to; any other coding, or more than one, cannot be scrubbed
and is refused by the proxy. The proxy also asks service upstreams for
`Accept-Encoding: identity`, so decoding is needed only for upstreams that ignore it.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

import brotli

_MARKER_CANDIDATES = b"*#~!^|_-.\x00"
MARKER_LENGTH = 8
DECODED_PIECE = 1024 * 1024


class UnsupportedEncoding(ValueError):
    """A Content-Encoding the scrubber cannot see through."""


class Scrubber:
    """Replace every needle in a stream of bytes. `hits` counts replacements."""

    def __init__(self, needles: Iterable[bytes]):
        unique = {n for n in needles if n}
        self._needles = sorted(unique, key=len, reverse=True)  # longest wins at one position
        self._keep = max((len(n) for n in self._needles), default=1) - 1
        used = set().union(*(set(n) for n in self._needles)) if self._needles else set()
        marker = next((b for b in _MARKER_CANDIDATES if b not in used), None)
        if marker is None:  # pragma: no cover - needles use every candidate byte
            marker = next(b for b in range(256) if b not in used)
        self.marker = bytes([marker]) * MARKER_LENGTH
        self._carry = b""
        self.hits = 0

    def __repr__(self) -> str:  # never show the needles
        return f"Scrubber({len(self._needles)} needles, {self.hits} hits)"

    def __bool__(self) -> bool:
        return bool(self._needles)

    def _replace(self, buf: bytes, limit: int) -> tuple[bytes, int]:
        """Replace occurrences starting before `limit`; return (output, bytes consumed)."""
        out: list[bytes] = []
        pos = 0
        found = [buf.find(n) for n in self._needles]
        while True:
            start, index = -1, -1
            for i, at in enumerate(found):
                if at >= 0 and (start < 0 or at < start):
                    start, index = at, i
            if start < 0 or start >= limit:
                break
            out.append(buf[pos:start])
            out.append(self.marker)
            self.hits += 1
            pos = start + len(self._needles[index])
            for i, at in enumerate(found):
                if 0 <= at < pos:
                    found[i] = buf.find(self._needles[i], pos)
        end = max(pos, limit)
        out.append(buf[pos:end])
        return b"".join(out), end

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
        keep, carry = self._keep, self._carry
        if len(data) > keep and not any(n in data for n in self._needles):
            if carry:
                seam = carry + data[:keep]
                if any(n in seam for n in self._needles):
                    return (self._feed_copy(data),)
            limit = len(data) - keep
            self._carry = data[limit:]
            view = memoryview(data)[:limit]
            return (carry, view) if carry else (view,)
        return (self._feed_copy(data),)

    def _feed_copy(self, data: bytes) -> bytes | memoryview:
        """The general path: search the tail and the new data as one buffer."""
        buf = self._carry + data if self._carry else data
        limit = max(0, len(buf) - self._keep)
        if all(buf.find(n) < 0 for n in self._needles):
            self._carry = buf[limit:]
            return memoryview(buf)[:limit]
        out, used = self._replace(buf, limit)
        self._carry = buf[used:]
        return out

    def flush(self) -> bytes:
        """The held-back tail, scrubbed; the stream is over."""
        buf, self._carry = self._carry, b""
        if not buf:
            return b""
        out, _ = self._replace(buf, len(buf))
        return out

    def scrub(self, data: bytes) -> bytes:
        """Scrub one whole value (a header), independent of the stream state."""
        if not self._needles:
            return data
        out, _ = self._replace(data, len(data))
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
