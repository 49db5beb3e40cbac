"""The forms of a secret the scrubber removes: each one a service plausibly echoes, written
here with the standard library (not with the code under test), in any case where case can
change, at any alignment inside a longer base64 string, split at any read boundary; and the
minimum lengths below which a derived form is left alone."""

from __future__ import annotations

import base64
import json
import random
import urllib.parse

import pytest
from secret_leaks import leaked

from aamp.egress import scrub
from aamp.egress.scrub import Scrubber, SecretForms
from aamp.egress.secret_forms import secret_forms

TOKEN = "tok-Zq8v3/Lr9+sNw2Kp7X"  # "/" and "+" make the URL, JSON and base64 forms differ
USER = "svc-7Hq2"
PASSWORD = "pw:Hk4m T9qW2z&R"
BEARER = f"Bearer {TOKEN}"
PAIR = f"{USER}:{PASSWORD}"
BASIC = "Basic " + base64.b64encode(PAIR.encode()).decode()


def b64_variants(data: bytes) -> list[bytes]:
    std = base64.b64encode(data)
    url = base64.urlsafe_b64encode(data)
    return [std, std.rstrip(b"="), url, url.rstrip(b"=")]


def echoes(value: str, sent: str) -> dict[str, bytes]:
    """Every way a careless service writes `value` (a secret) or `sent` (a header value)."""
    raw = value.encode()
    head = f"GET /x HTTP/1.1\r\nHost: svc.test\r\nAuthorization: {sent}\r\n\r\n".encode()
    out = {
        "raw": raw,
        "upper": raw.upper(),
        "lower": raw.lower(),
        "swapcase": raw.swapcase(),
        "url": urllib.parse.quote(value, safe="").encode(),
        "url-lower-hex": urllib.parse.quote(value, safe="").encode().replace(b"%2F", b"%2f"),
        "url-path": urllib.parse.quote(value).encode(),
        "url-plus": urllib.parse.quote_plus(value).encode(),
        "url-upper": urllib.parse.quote(value, safe="").upper().encode(),
        "json": json.dumps(value)[1:-1].encode(),
        "json-slash": json.dumps(value)[1:-1].replace("/", "\\/").encode(),
        "json-html": json.dumps(value)[1:-1].replace("&", "\\u0026").encode(),
        "hex": raw.hex().encode(),
        "HEX": raw.hex().upper().encode(),
        "hex-mixed": bytes(
            c ^ 0x20 if i % 3 == 0 and c > 0x60 else c for i, c in enumerate(raw.hex().encode())
        ),
        "sent-hex": sent.encode().hex().upper().encode(),
    }
    for name, text in (("value", raw), ("sent", sent.encode())):
        for i, form in enumerate(b64_variants(text)):
            out[f"b64-{name}-{i}"] = form
            out[f"b64-{name}-{i}-url-encoded"] = urllib.parse.quote(form, safe="").encode()
            out[f"b64-{name}-{i}-json"] = form.replace(b"/", b"\\/")
        for offset in range(3):  # inside a longer base64 string, at each alignment
            inside = b"p" * offset + text + b" and more"
            for i, form in enumerate(b64_variants(inside)):
                out[f"b64-{name}-inside-{offset}-{i}"] = form
    out["b64-request-head"] = base64.b64encode(head)
    out["b64url-request-head-url-encoded"] = urllib.parse.quote(
        base64.urlsafe_b64encode(head).decode(), safe=""
    ).encode()
    return out


CASES = [
    ([TOKEN], [BEARER]),
    (
        [PASSWORD],
        [f"agent:{PASSWORD}", "Basic " + base64.b64encode(b"agent:" + PASSWORD.encode()).decode()],
    ),
    ([USER, PASSWORD], [PAIR, BASIC]),
]


@pytest.mark.parametrize("finders", [False, True])
@pytest.mark.parametrize(("secrets", "sent"), CASES)
def test_every_echoed_form_of_every_secret_is_scrubbed(monkeypatch, secrets, sent, finders):
    # Without finders each form is searched for; with them (a long body), their anchors.
    monkeypatch.setattr(scrub, "SHORT_BODY", 0 if finders else 1 << 20)
    forms = secret_forms(secrets, sent)
    for secret in secrets:
        for header in sent:
            for name, echo in echoes(secret, header).items():
                scrubber = Scrubber(forms)
                body = b'{"debug": "' + echo + b'", "n": 1}'
                out = b"".join(scrubber.feed_pieces(body)) + scrubber.flush()
                assert leaked(out, secrets) is None, (name, out)
                assert scrubber.marker in out, name
                assert out.startswith(b'{"debug": "') and out.endswith(b'", "n": 1}')
                assert out == Scrubber(forms).scrub(body)


def test_echoed_header_value_keeps_its_scheme():
    # Raw forms are those of the secret: an echoed header still says what it was.
    scrubber = Scrubber(secret_forms([TOKEN], [BEARER]))
    assert scrubber.scrub(BEARER.encode()) == b"Bearer " + scrubber.marker
    scrubber = Scrubber(secret_forms([PASSWORD], [f"agent:{PASSWORD}"]))
    assert scrubber.scrub(f"agent:{PASSWORD}".encode()) == b"agent:" + scrubber.marker


def test_innocent_text_is_left_alone():
    scrubber = Scrubber(secret_forms([TOKEN, PASSWORD], [BEARER, BASIC]))
    rng = random.Random(5)
    text = bytes(rng.choice(b'abcdefABCDEF0123456789+/=-_ %\\"{}:,') for _ in range(200_000))
    assert scrubber.scrub(text) == text
    assert scrubber.hits == 0


def test_minimum_lengths_of_derived_forms():
    # 3 bytes: raw only (in any case); its 6 hex digits and 4 base64 characters are too
    # short to be told from innocent hex or base64.
    three = Scrubber(secret_forms(["q7Z"]))
    assert three.scrub(b"Q7z") == three.marker
    assert three.scrub(b"q7Z".hex().encode()) == b"q7Z".hex().encode()
    assert three.scrub(base64.b64encode(b"q7Z")) == base64.b64encode(b"q7Z")
    # 4 bytes: also hex (8 digits) and whole base64, not the shorter middles.
    four = secret_forms(["q7Zw"])
    assert b"q7Zw".hex().encode() in four and base64.b64encode(b"q7Zw") in four
    inside = base64.b64encode(b"pq7Zw and more")  # the value at offset 1
    assert Scrubber(four).scrub(inside) == inside
    # 5 bytes on: every alignment.
    five = Scrubber(secret_forms(["q7Zw9"]))
    for offset in range(3):
        inside = base64.b64encode(b"p" * offset + b"q7Zw9 and more")
        assert leaked(five.scrub(inside), ["q7Zw9"]) is None, offset


def test_case_is_folded_only_where_case_can_change():
    forms = secret_forms([TOKEN], [BEARER])
    assert TOKEN.swapcase().encode() in forms
    encoded = base64.b64encode(TOKEN.encode())
    assert encoded in forms and encoded.swapcase() not in forms  # base64 is case-sensitive
    scrubber = Scrubber(forms)
    assert scrubber.scrub(encoded.swapcase()) == encoded.swapcase()


def test_marker_is_in_no_form_in_either_case():
    # A secret made of most candidate marker bytes still gets a marker none of its forms has.
    forms = secret_forms(["*#~!^|_-.$&'`x"], [])
    scrubber = Scrubber(forms)
    marker = scrubber.marker[:1]
    assert not marker.isalnum()
    every = b"".join(forms.exact | forms.folded)
    assert marker not in every and marker not in every.upper()
    assert "~" not in repr(forms) and "~" not in repr(scrubber)


@pytest.mark.parametrize("finders", [False, True])
def test_forms_split_at_every_read_boundary(monkeypatch, finders):
    if finders:
        monkeypatch.setattr(scrub, "SHORT_BODY", 0)
    forms = secret_forms([TOKEN, PASSWORD], [BEARER, BASIC])
    echoed = echoes(TOKEN, BEARER)
    text = b"<" + b"> <".join(echoed[k] for k in ("raw", "url", "b64-sent-0", "hex-mixed")) + b">"
    whole = Scrubber(forms).scrub(text)
    assert leaked(whole, [TOKEN]) is None
    for cut in range(len(text) + 1):
        scrubber = Scrubber(forms)
        out = b"".join(b"".join(scrubber.feed_pieces(p)) for p in (text[:cut], text[cut:]))
        assert out + scrubber.flush() == whole, cut
    scrubber = Scrubber(forms)
    out = b"".join(b"".join(scrubber.feed_pieces(text[i : i + 1])) for i in range(len(text)))
    assert out + scrubber.flush() == whole


@pytest.mark.parametrize("finders", [False, True])
def test_overlapping_forms_are_one_run_even_across_the_held_back_tail(monkeypatch, finders):
    # Two forms that share bytes: replacing the first must not leave the rest of the second,
    # also when the second is not yet whole when the first is replaced.
    if finders:
        monkeypatch.setattr(scrub, "SHORT_BODY", 0)
    forms = SecretForms([b"aaaaaaXbbbbbb", b"bbbbbbYcccccccccccccccccccc"])
    text = b"start aaaaaaXbbbbbbYcccccccccccccccccccc end"
    for size in range(1, len(text) + 1):
        scrubber = Scrubber(forms)
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        out = b"".join(b"".join(scrubber.feed_pieces(p)) for p in pieces) + scrubber.flush()
        assert out == b"start " + scrubber.marker + b" end", size


@pytest.mark.parametrize("seed", range(6))
def test_random_streams_agree_with_one_whole_scrub(monkeypatch, seed):
    rng = random.Random(seed)
    monkeypatch.setattr(scrub, "SHORT_BODY", rng.choice([0, 1 << 20]))
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~+/"
    secret = "".join(rng.choice(alphabet) for _ in range(rng.randrange(5, 40)))
    sent = f"Bearer {secret}"
    forms = secret_forms([secret], [sent])
    echoed = list(echoes(secret, sent).values())
    filler = [b"0123456789abcdef", b"QUJDREVGR0hJSktM", b'{"k": "v"} ', b"lorem ipsum "]
    text = b"".join(
        rng.choice(echoed) if rng.random() < 0.2 else rng.choice(filler) * rng.randrange(1, 40)
        for _ in range(300)
    )
    scrubber = Scrubber(forms)
    out, at = [], 0
    while at < len(text):
        size = rng.choice([1, 3, 17, 100, 4096, 70_000])
        out.append(b"".join(scrubber.feed_pieces(text[at : at + size])))
        at += size
    streamed = b"".join(out) + scrubber.flush()
    assert streamed == Scrubber(forms).scrub(text)
    assert leaked(streamed, [secret]) is None
