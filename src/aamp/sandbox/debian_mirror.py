"""Find the Debian mirror that image builds download packages from.

aamp never names a mirror host itself: an air-gapped installation points its apt at an internal
mirror, and image builds must use the same one. So the mirror is read from this host's apt
sources (`/etc/apt/sources.list`, `/etc/apt/sources.list.d/*.list` in the one-line format and
`*.sources` in the deb822 format), and the `AAMP_DEBIAN_MIRROR` setting overrides it. An
offline installation (`AAMP_BUNDLE`) uses the bundle's own repository, `file://BUNDLE/debian`:
its index is unsigned, since the bundle's manifest (size and SHA-256 of every file, signed
when made with `--sign`) is what `scripts/install --bundle` checked, so apt and debootstrap
are told to trust that one local repository (`bundle_repository`) and nothing else.
`stanza_fields` reads one stanza of what apt and dpkg print (a package's fields), for the
bundle maker and the guest kernel's fetch alike.

Usage::

    mirror = mirror_url(settings)          # "http://deb.debian.org/debian" on a stock host
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aamp.config import Settings

DEFAULT_APT_DIR = Path("/etc/apt")
DEFAULT_SUITE = "bookworm"


class MirrorNotFound(RuntimeError):
    """No apt source serves the suite's main component and no override is set."""


@dataclass(frozen=True)
class AptSource:
    """One (type, URI, suite) triple with its components, as apt would use it."""

    type: str  # "deb" or "deb-src"
    uri: str
    suite: str
    components: tuple[str, ...]
    origin: str  # "FILE:LINE", so errors can point at the entry


def parse_one_line(text: str, origin: str) -> list[AptSource]:
    """Parse the classic `deb [opts] URI SUITE COMP...` format (sources.list, *.list)."""
    found: list[AptSource] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        rest = rest.strip()
        if kind not in ("deb", "deb-src"):
            continue
        if rest.startswith("["):  # options such as [arch=amd64 signed-by=/usr/share/...]
            end = rest.find("]")
            if end < 0:
                continue
            rest = rest[end + 1 :].strip()
        fields = rest.split()
        if len(fields) < 2:
            continue
        uri, suite, *components = fields
        found.append(AptSource(kind, uri, suite, tuple(components), f"{origin}:{lineno}"))
    return found


def stanza_fields(stanza: str) -> dict[str, str]:
    """`Key: value` of one stanza as apt-cache and dpkg-scanpackages print it; the first of a
    repeated key wins and continuation lines are passed over."""
    fields: dict[str, str] = {}
    for line in stanza.splitlines():
        key, sep, value = line.partition(": ")
        if sep and not line.startswith(" ") and key not in fields:
            fields[key] = value.strip()
    return fields


def _deb822_paragraphs(text: str) -> list[tuple[int, dict[str, str]]]:
    """Split deb822 text into (first line number, {field: value}) paragraphs.

    Continuation lines (starting with whitespace) extend the previous field, which is how
    multi-line values such as an inline `Signed-By:` key block are written.
    """
    paragraphs: list[tuple[int, dict[str, str]]] = []
    current: dict[str, str] = {}
    start = 0
    last_key: str | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if current:
                paragraphs.append((start, current))
            current, last_key = {}, None
            continue
        if raw[0] in " \t":
            if last_key is not None:
                current[last_key] += "\n" + raw.strip()
            continue
        key, sep, value = raw.partition(":")
        if not sep:
            continue
        if not current:
            start = lineno
        last_key = key.strip().lower()
        current[last_key] = value.strip()
    if current:
        paragraphs.append((start, current))
    return paragraphs


def parse_deb822(text: str, origin: str) -> list[AptSource]:
    """Parse the deb822 `.sources` format (Types/URIs/Suites/Components stanzas)."""
    found: list[AptSource] = []
    for lineno, para in _deb822_paragraphs(text):
        if para.get("enabled", "yes").strip().lower() == "no":
            continue
        types = para.get("types", "").split()
        uris = para.get("uris", "").split()
        suites = para.get("suites", "").split()
        components = tuple(para.get("components", "").split())
        for kind in types:
            for uri in uris:
                for suite in suites:
                    found.append(AptSource(kind, uri, suite, components, f"{origin}:{lineno}"))
    return found


def read_apt_sources(apt_dir: Path = DEFAULT_APT_DIR) -> list[AptSource]:
    """Every source apt on this host would read, in apt's own file order.

    Like apt, only `sources.list`, `sources.list.d/*.list` and `sources.list.d/*.sources` are
    read; other names (`*.disabled`, `*.save`) are ignored.
    """
    sources: list[AptSource] = []
    main_list = apt_dir / "sources.list"
    if main_list.is_file():
        sources += parse_one_line(main_list.read_text(errors="replace"), str(main_list))
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        for path in sorted(parts.iterdir()):
            if not path.is_file():
                continue
            if path.suffix == ".list":
                sources += parse_one_line(path.read_text(errors="replace"), str(path))
            elif path.suffix == ".sources":
                sources += parse_deb822(path.read_text(errors="replace"), str(path))
    return sources


def pick_mirror(sources: list[AptSource], suite: str = DEFAULT_SUITE) -> str | None:
    """The first binary source serving exactly `suite` (not -security/-updates) with `main`."""
    for src in sources:
        if src.type == "deb" and src.suite == suite and "main" in src.components:
            return src.uri.rstrip("/")
    return None


def mirror_url(
    settings: Settings, *, apt_dir: Path = DEFAULT_APT_DIR, suite: str = DEFAULT_SUITE
) -> str:
    """The mirror URL to bootstrap `suite` from: the bundle's repository in an offline
    installation, else the setting if given, else the host's apt."""
    local = bundle_repository(settings)
    if local is not None:
        return local.as_uri()
    if settings.debian_mirror:
        return settings.debian_mirror.rstrip("/")
    sources = read_apt_sources(apt_dir)
    uri = pick_mirror(sources, suite)
    if uri is None:
        seen = ", ".join(f"{s.uri} {s.suite} ({s.origin})" for s in sources) or "none"
        raise MirrorNotFound(
            f"no apt source for Debian '{suite}' main found in {apt_dir}/sources.list or "
            f"{apt_dir}/sources.list.d/ (sources seen: {seen}); set AAMP_DEBIAN_MIRROR to the "
            f"URL of a Debian mirror serving '{suite}'"
        )
    return uri


def bundle_repository(settings: Settings) -> Path | None:
    """The offline bundle's Debian repository (trusted without an index signature), if any."""
    return settings.bundle / "debian" if settings.bundle is not None else None
