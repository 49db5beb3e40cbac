"""The Debian mirror comes from the host's apt sources (both formats) or AAMP_DEBIAN_MIRROR."""

from __future__ import annotations

from pathlib import Path

import pytest

from aamp.config import Settings
from aamp.sandbox.debian_mirror import (
    MirrorNotFound,
    mirror_url,
    parse_deb822,
    parse_one_line,
    read_apt_sources,
)


def _settings(tmp_path: Path, mirror: str | None = None) -> Settings:
    return Settings(
        home=tmp_path / "home",
        runtime_dir=tmp_path / "run",
        image_dir=tmp_path / "images",
        debian_mirror=mirror,
    )


def _apt_dir(tmp_path: Path, main: str | None = None, **parts: str) -> Path:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    if main is not None:
        (apt / "sources.list").write_text(main)
    for name, text in parts.items():
        (apt / "sources.list.d" / name.replace("__", ".")).write_text(text)
    return apt


DEB822_STOCK = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.test/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.test/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def test_deb822_picks_the_plain_suite_not_security_or_updates(tmp_path: Path) -> None:
    apt = _apt_dir(tmp_path, debian__sources=DEB822_STOCK)
    assert mirror_url(_settings(tmp_path), apt_dir=apt) == "http://mirror.test/debian"


def test_security_listed_first_is_still_skipped(tmp_path: Path) -> None:
    text = "\n".join(reversed(DEB822_STOCK.split("\n\n")))
    apt = _apt_dir(tmp_path, debian__sources=text)
    assert mirror_url(_settings(tmp_path), apt_dir=apt) == "http://mirror.test/debian"


def test_one_line_format_with_options_and_comments(tmp_path: Path) -> None:
    main = """\
# deb http://commented.test/debian bookworm main
deb-src http://src-only.test/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://sec.test/debian-security bookworm-security main
deb [ arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg ] http://one.test/debian/ bookworm main contrib  # trailing
deb http://two.test/debian bookworm main
"""  # noqa: E501
    apt = _apt_dir(tmp_path, main)
    assert mirror_url(_settings(tmp_path), apt_dir=apt) == "http://one.test/debian"
    sources = parse_one_line(main, "sources.list")
    assert [s.uri for s in sources if s.type == "deb"] == [
        "http://sec.test/debian-security",
        "http://one.test/debian/",
        "http://two.test/debian",
    ]
    assert sources[2].components == ("main", "contrib")
    assert sources[2].origin == "sources.list:4"


def test_suite_without_main_is_not_chosen(tmp_path: Path) -> None:
    apt = _apt_dir(
        tmp_path,
        "deb http://contrib-only.test/debian bookworm contrib non-free\n"
        "deb http://full.test/debian bookworm main\n",
    )
    assert mirror_url(_settings(tmp_path), apt_dir=apt) == "http://full.test/debian"


def test_deb822_inline_key_disabled_stanza_and_multiple_uris() -> None:
    text = """\
# a comment before the stanza
Types: deb
URIs: http://disabled.test/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb deb-src
URIs: http://a.test/debian http://b.test/debian
Suites: bookworm
Components: main non-free-firmware
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBGPL0BUBEADmW5NdOOHwPIJlgPu6JDcKw/NZJPpeXbvcbzbbyh8=
 -----END PGP PUBLIC KEY BLOCK-----
"""
    sources = parse_deb822(text, "x.sources")
    assert [(s.type, s.uri) for s in sources] == [
        ("deb", "http://a.test/debian"),
        ("deb", "http://b.test/debian"),
        ("deb-src", "http://a.test/debian"),
        ("deb-src", "http://b.test/debian"),
    ]
    assert sources[0].components == ("main", "non-free-firmware")


def test_files_apt_ignores_are_ignored_and_order_is_apts(tmp_path: Path) -> None:
    apt = _apt_dir(
        tmp_path,
        None,
        a_old__list__disabled="deb http://disabled.test/debian bookworm main\n",
        b_node__sources__save=DEB822_STOCK.replace("mirror.test", "saved.test"),
        c_real__list="deb http://real.test/debian bookworm main\n",
        d_later__sources=DEB822_STOCK.replace("mirror.test", "later.test"),
    )
    uris = [s.uri for s in read_apt_sources(apt)]
    assert "http://disabled.test/debian" not in uris
    assert "http://saved.test/debian" not in uris
    assert uris[0] == "http://real.test/debian"
    assert mirror_url(_settings(tmp_path), apt_dir=apt) == "http://real.test/debian"


def test_setting_overrides_the_host(tmp_path: Path) -> None:
    apt = _apt_dir(tmp_path, debian__sources=DEB822_STOCK)
    settings = _settings(tmp_path, mirror="http://override.test/debian/")
    assert mirror_url(settings, apt_dir=apt) == "http://override.test/debian"


def test_no_source_is_a_clear_error(tmp_path: Path) -> None:
    apt = _apt_dir(
        tmp_path, "deb http://old.test/debian bullseye main\n", x__sources="Types: deb\n"
    )
    with pytest.raises(MirrorNotFound) as err:
        mirror_url(_settings(tmp_path), apt_dir=apt)
    message = str(err.value)
    assert "bookworm" in message
    assert "AAMP_DEBIAN_MIRROR" in message
    assert "http://old.test/debian bullseye" in message


def test_missing_apt_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MirrorNotFound, match="AAMP_DEBIAN_MIRROR"):
        mirror_url(_settings(tmp_path), apt_dir=tmp_path / "nothing")
