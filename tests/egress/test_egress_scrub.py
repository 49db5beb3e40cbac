"""The streaming scrubber: every split of the stream, overlapping needles, the marker, gzip."""

from __future__ import annotations

import base64
import gzip
import zlib

import brotli
import pytest

from aamp.egress.scrub import (
    DECODED_PIECE,
    BodyDecoder,
    Scrubber,
    SecretForms,
    UnsupportedEncoding,
)
from aamp.egress.secret_forms import secret_forms

SECRET = b"s3cr3t-VALUE-42"
OTHER = b"dG9rZW4="


def run(scrubber: Scrubber, pieces: list[bytes]) -> bytes:
    return b"".join(scrubber.feed(p) for p in pieces) + scrubber.flush()


def test_every_split_point_of_two_pieces():
    text = b"head " + SECRET + b" mid " + OTHER + SECRET + b" tail"
    for cut in range(len(text) + 1):
        scrubber = Scrubber(SecretForms([SECRET, OTHER]))
        out = run(scrubber, [text[:cut], text[cut:]])
        m = scrubber.marker
        assert out == b"head " + m + b" mid " + m + m + b" tail", cut
        assert scrubber.hits == 3


def test_one_byte_at_a_time_and_empty_pieces():
    text = (b"x" + SECRET) * 5
    scrubber = Scrubber(SecretForms([SECRET]))
    out = run(scrubber, [b""] + [text[i : i + 1] for i in range(len(text))] + [b""])
    assert out == (b"x" + scrubber.marker) * 5
    assert SECRET not in out


def test_longest_needle_wins_and_marker_is_not_in_any_needle():
    scrubber = Scrubber(SecretForms([b"abc", b"abcdef", b"*"]))
    assert b"*" not in scrubber.marker
    out = run(scrubber, [b"xxabcdefyy abc"])
    assert out == b"xx" + scrubber.marker + b"yy " + scrubber.marker
    assert "abc" not in repr(scrubber)


def test_no_needle_reappears_around_a_marker():
    # An upstream that knows the secret cannot rebuild it from the pieces around a marker.
    needle = b"ab"
    scrubber = Scrubber(SecretForms([needle]))
    out = run(scrubber, [b"aab", b"b", b"a", b"abb"])
    assert needle not in out


def test_nothing_to_scrub_passes_bytes_through():
    scrubber = Scrubber(SecretForms([]))
    assert not scrubber
    assert scrubber.feed(b"abc") == b"abc" and scrubber.flush() == b""


def test_header_scrub_is_independent_of_the_stream():
    scrubber = Scrubber(SecretForms([SECRET]))
    held = len(SECRET) - 1  # the longest needle minus one byte is kept back
    assert scrubber.feed(b"x" * 20 + SECRET[:4]) == b"x" * (24 - held)
    assert scrubber.scrub(b"Bearer " + SECRET) == b"Bearer " + scrubber.marker
    assert scrubber.flush() == b"x" * (held - 4) + SECRET[:4]


def test_finds_a_form_in_a_whole_value_without_touching_the_stream():
    scrubber = Scrubber(SecretForms([OTHER], folded=[SECRET]))
    head = b"HTTP/1.1 200 OK\r\nX-Echo: Bearer " + SECRET.upper() + b"\r\n\r\n"
    assert scrubber.finds(head)  # a folded form, in another case
    assert scrubber.finds(b"X-" + OTHER + b": 1")  # an exact one, in a header name
    assert not scrubber.finds(b"X-" + OTHER.lower() + b": 1")  # exact means exact
    assert not scrubber.finds(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
    assert not Scrubber(SecretForms([])).finds(head)
    assert scrubber.hits == 0 and scrubber.flush() == b""


def test_gzip_deflate_and_br_are_decoded_in_bounded_pieces():
    body = b"A" * (3 * DECODED_PIECE) + SECRET
    for encoding, data in (
        ("gzip", gzip.compress(body)),
        ("deflate", zlib.compress(body)),
        ("br", brotli.compress(body)),
    ):
        decoder = BodyDecoder(encoding)
        pieces = [*decoder.feed(data), decoder.flush()]
        assert max(len(p) for p in pieces) <= DECODED_PIECE
        assert b"".join(pieces) == body
    assert not BodyDecoder("identity").decoding
    with pytest.raises(UnsupportedEncoding, match="zstd"):
        BodyDecoder("zstd")
    with pytest.raises(UnsupportedEncoding):
        BodyDecoder("gzip, gzip")
    with pytest.raises(UnsupportedEncoding):
        BodyDecoder("gzip, br")
    with pytest.raises(UnsupportedEncoding, match="corrupt"):
        list(BodyDecoder("gzip").feed(b"not gzip at all"))
    with pytest.raises(UnsupportedEncoding, match="corrupt"):
        list(BodyDecoder("br").feed(b"not brotli at all"))


def test_br_split_into_tiny_pieces_decodes_whole():
    body = (b"x" * 5000 + SECRET) * 50
    data = brotli.compress(body)
    decoder = BodyDecoder("br")
    out = b"".join(b"".join(decoder.feed(data[i : i + 3])) for i in range(0, len(data), 3))
    assert out + decoder.flush() == body


def test_clean_fast_path_agrees_with_one_whole_scrub_for_every_seam():
    # Pieces longer than the held-back tail take the no-copy path; a needle may sit across
    # any seam, inside the tail, or wholly inside a piece. The stream must equal one scrub.
    body = (
        b"".join(
            b"." * gap + needle
            for gap, needle in zip(range(3, 90, 7), [SECRET, OTHER] * 7, strict=False)
        )
        + b"." * 40
    )
    for size in (len(SECRET), len(SECRET) + 1, 17, 23, 64):
        scrubber = Scrubber(SecretForms([SECRET, OTHER]))
        pieces = [body[i : i + size] for i in range(0, len(body), size)]
        streamed = b"".join(b"".join(scrubber.feed_pieces(p)) for p in pieces)
        streamed += scrubber.flush()
        whole = Scrubber(SecretForms([SECRET, OTHER]))
        assert streamed == whole.scrub(body), size
        assert scrubber.hits == whole.hits == body.count(SECRET) + body.count(OTHER)


def test_clean_pieces_are_passed_as_views_not_copies():
    scrubber = Scrubber(SecretForms([SECRET]))
    data = b"y" * 1000
    first = scrubber.feed_pieces(data)
    assert len(first) == 1 and isinstance(first[0], memoryview) and first[0].obj is data
    second = scrubber.feed_pieces(data)
    assert bytes(second[0]) == b"y" * (len(SECRET) - 1)  # the tail held back from before
    assert second[1].obj is data


def test_a_short_body_given_as_a_view_of_a_reused_buffer_is_scrubbed_in_every_form():
    """The TLS tap hands the scrubber views of its receive buffer: exact-case forms (base64 of
    a sent `user:password`) must be found in a view as in bytes, before and after the finders
    are built, and in a piece that follows another."""
    password = "hunter2-Correct-Horse"
    forms = secret_forms([password], sent=["svc:" + password])
    encoded = base64.b64encode(b"svc:" + password.encode())
    for sizes in ([600], [20000, 20000], [40000]):
        scrubber = Scrubber(forms)
        buffer = bytearray(64 * 1024)
        out = b""
        for size in sizes:
            buffer[:size] = (b'{"auth":"Basic ' + encoded + b'"}').ljust(size, b" ")
            out += b"".join(bytes(p) for p in scrubber.feed_pieces(memoryview(buffer)[:size]))
        out += scrubber.flush()
        assert encoded not in out, sizes
        assert password.encode() not in out
        assert scrubber.hits == len(sizes)
