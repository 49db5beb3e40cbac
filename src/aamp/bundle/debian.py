"""The bundle's Debian part: the packages a host install and every guest image need, with their
dependency closure, as a local apt repository (`debian/`) that apt and debootstrap read by
`file://` on a machine with no network.

Two indexes over one pool, because the two consumers resolve differently:
- `dists/host` — what `scripts/install` installs on the host (its package list, from this
  host's apt sources: the release with its updates and security suites);
- `dists/bookworm` — what guest images are built from: debootstrap's minbase (every
  `Priority: required` package and apt), each recipe's packages, and the Firecracker guest
  kernel and busybox, from the one mirror image builds use (`mirror_url`), suite bookworm.

Each closure is computed by apt itself against an empty dpkg status (so nothing this host
happens to have installed is left out), in a private apt state under the download cache:
the host's own apt lists, cache and locks are never touched. Every .deb is checked against
the SHA-256 its signed index gives before it enters the pool, a reused one as well.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

from aamp.bundle.manifest import sha256_file
from aamp.sandbox import stanza_fields

Progress = Callable[[str], None]

GUEST_SUITE = "bookworm"
HOST_SUITE = "host"
COMPONENT = "main"


class DebianError(RuntimeError):
    """apt could not resolve or fetch a package; the message has apt's own words."""


@dataclass(frozen=True)
class Package:
    """One binary package as a signed index lists it: the pool file is checked against this
    `sha256` and `size` before it enters the bundle."""

    name: str
    version: str
    arch: str
    sha256: str
    size: int
    filename: str  # the pool file name: basename of the index's Filename field
    # The archive's own Priority and Section (its override, not the .deb's control file:
    # debootstrap takes every `required` package, and zlib1g, say, is only that here).
    priority: str = "optional"
    section: str = "misc"


APT_TIMEOUT_S = 1800.0


def _run(argv: list[str], what: str, *, cwd: Path | None = None) -> str:
    env = dict(os.environ, LC_ALL="C.UTF-8", DEBIAN_FRONTEND="noninteractive")
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            cwd=cwd,
            env=env,
            timeout=APT_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise DebianError(
            f"{argv[0]} is not installed; making a bundle needs a Debian host"
        ) from None
    if done.returncode != 0:
        tail = " / ".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise DebianError(f"{what} failed: {tail}")
    return done.stdout


class PrivateApt:
    """apt with its own sources list, lists, cache and an empty dpkg status under `state`."""

    def __init__(self, state: Path, sources: str, arch: str):
        self.state = state
        for sub in ("lists/partial", "cache/archives/partial", "parts", "prefs"):
            (state / sub).mkdir(parents=True, exist_ok=True)
        (state / "sources.list").write_text(sources)
        (state / "status").touch()
        self.options = [
            f"-oDir::Etc::SourceList={state / 'sources.list'}",
            f"-oDir::Etc::SourceParts={state / 'parts'}",
            f"-oDir::Etc::Preferences={state / 'preferences'}",
            f"-oDir::Etc::PreferencesParts={state / 'prefs'}",
            f"-oDir::State={state}",
            f"-oDir::State::Lists={state / 'lists'}",
            f"-oDir::State::status={state / 'status'}",
            f"-oDir::Cache={state / 'cache'}",
            f"-oAPT::Architecture={arch}",
            f"-oAPT::Architectures={arch}",
            "-oAPT::Sandbox::User=root",
            "-oAcquire::Languages=none",
            "-oDebug::NoLocking=1",
            "-oAPT::Install-Recommends=0",
        ]

    def update(self) -> None:
        _run(["apt-get", *self.options, "-q", "update"], "apt-get update")

    def closure(self, packages: Iterable[str]) -> list[tuple[str, str, str]]:
        """(name, version, arch) of everything installing `packages` on an empty system takes."""
        wanted = sorted(set(packages))
        out = _run(
            ["apt-get", *self.options, "-s", "-q", "install", *wanted],
            f"apt-get install (simulated) {' '.join(wanted)}",
        )
        found = []
        for line in out.splitlines():
            m = re.match(r"^Inst (\S+) (?:\[\S+\] )?\((\S+) .*\[(\S+)\]\)", line)
            if m:
                found.append((m.group(1), m.group(2), m.group(3)))
        if not found:
            raise DebianError(f"apt resolved nothing for {' '.join(wanted)}")
        return found

    def details(self, items: list[tuple[str, str, str]]) -> list[Package]:
        """Each package's SHA-256, size and pool file name, from the signed index."""
        out = _run(
            ["apt-cache", *self.options, "show", *(f"{n}:{a}={v}" for n, v, a in items)],
            "apt-cache show",
        )
        by_key: dict[tuple[str, str], Package] = {}
        for stanza in out.split("\n\n"):
            fields = stanza_fields(stanza)
            if {"Package", "Version", "SHA256", "Size", "Filename"} <= fields.keys():
                key = (fields["Package"], fields["Version"])
                by_key.setdefault(
                    key,
                    Package(
                        fields["Package"],
                        fields["Version"],
                        fields.get("Architecture", ""),
                        fields["SHA256"],
                        int(fields["Size"]),
                        fields["Filename"].rsplit("/", 1)[-1],
                        fields.get("Priority", "optional"),
                        fields.get("Section", "misc"),
                    ),
                )
        missing = [f"{n}={v}" for n, v, _a in items if (n, v) not in by_key]
        if missing:
            raise DebianError(f"apt-cache shows no index entry for {', '.join(missing)}")
        return [by_key[(n, v)] for n, v, _a in items]

    def required(self) -> list[str]:
        """Every `Priority: required` package of the lists (debootstrap's minbase takes them)."""
        names: set[str] = set()
        for lst in (self.state / "lists").glob("*_Packages*"):
            # apt keeps lists compressed; its helper reads any of its formats.
            text = _run(["/usr/lib/apt/apt-helper", "cat-file", str(lst)], f"reading {lst.name}")
            for stanza in text.split("\n\n"):
                fields = stanza_fields(stanza)
                if fields.get("Priority") == "required" and "Package" in fields:
                    names.add(fields["Package"])
        if not names:
            raise DebianError("the package lists name no required package")
        return sorted(names)

    def download(self, packages: list[Package], dest: Path) -> None:
        """`apt-get download` each package into `dest` under its pool file name."""
        if not packages:
            return
        with tempfile.TemporaryDirectory(dir=dest, prefix=".incoming-") as tmp:
            _run(
                [
                    "apt-get",
                    *self.options,
                    "-q",
                    "download",
                    *(f"{p.name}:{p.arch}={p.version}" for p in packages),
                ],
                f"apt-get download ({len(packages)} packages)",
                cwd=Path(tmp),
            )
            fetched = {path.name: path for path in Path(tmp).glob("*.deb")}
            for pkg in packages:
                epochless = pkg.version.split(":", 1)[-1]
                candidates = [
                    pkg.filename,
                    f"{pkg.name}_{pkg.version.replace(':', '%3a')}_{pkg.arch}.deb",
                    f"{pkg.name}_{epochless}_{pkg.arch}.deb",
                ]
                path = next((fetched[c] for c in candidates if c in fetched), None)
                if path is None:
                    raise DebianError(f"apt-get download {pkg.name}={pkg.version} left no .deb")
                path.replace(dest / pkg.filename)


def debootstrap_packages(
    suite: str, variant: str, include: Iterable[str], mirror: str
) -> list[str]:
    """What debootstrap itself would install (`--print-debs`): its own resolver picks some
    packages apt's would not (usr-is-merged, the first of each alternative)."""
    with tempfile.TemporaryDirectory(prefix="aamp-bundle-debootstrap-") as tmp:
        out = _run(
            ["debootstrap", "--print-debs", f"--variant={variant}",
             f"--include={','.join(include)}", "--components=main", suite, f"{tmp}/t", mirror],
            "debootstrap --print-debs",
        )  # fmt: skip
    names = out.split()
    if not names:
        raise DebianError("debootstrap --print-debs named no package")
    return names


def _link_or_copy(src: Path, dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".partial")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    tmp.replace(dest)


def fetch_into_pool(
    apt: PrivateApt,
    packages: list[Package],
    pool: Path,
    store: Path,
    reuse: list[Path],
    say: Progress,
) -> int:
    """Put every package into `pool` (linked from `store`), each checked against its index
    SHA-256; reuse a matching file from `store` or the `reuse` directories, download the rest.
    Returns how many were downloaded."""
    pool.mkdir(parents=True, exist_ok=True)
    store.mkdir(parents=True, exist_ok=True)
    todo: list[Package] = []
    for pkg in packages:
        target = pool / pkg.filename
        if (
            target.is_file()
            and target.stat().st_size == pkg.size
            and sha256_file(target) == pkg.sha256
        ):
            continue
        found = None
        for directory in (store, *reuse):
            for name in {
                pkg.filename,
                f"{pkg.name}_{pkg.version.replace(':', '%3a')}_{pkg.arch}.deb",
            }:
                cand = directory / name
                if (
                    cand.is_file()
                    and cand.stat().st_size == pkg.size
                    and sha256_file(cand) == pkg.sha256
                ):
                    found = cand
                    break
            if found:
                break
        if found is not None:
            _link_or_copy(found, target)
        else:
            todo.append(pkg)
    if todo:
        total = sum(p.size for p in todo)
        say(f"  downloading {len(todo)} packages ({total / 2**20:.1f} MiB)")
        for start in range(0, len(todo), 50):
            batch = todo[start : start + 50]
            apt.download(batch, store)
            say(f"  downloaded {min(start + 50, len(todo))}/{len(todo)}")
        for pkg in todo:
            got = store / pkg.filename
            actual = sha256_file(got)
            if actual != pkg.sha256:
                got.unlink()
                raise DebianError(
                    f"{pkg.filename}: SHA-256 {actual} does not match the index ({pkg.sha256})"
                )
            _link_or_copy(got, pool / pkg.filename)
    return len(todo)


def write_indexes(repo: Path, suites: dict[str, list[Package]], arch: str, say: Progress) -> None:
    """`dists/SUITE/main/binary-ARCH/Packages{,.gz}` and `Release` for each suite, from one
    `dpkg-scanpackages` run over the pool (each suite keeps the stanzas of its own files),
    with the archive's priorities and sections as its override file."""
    overrides = {p.name: (p.priority, p.section) for ps in suites.values() for p in ps}
    with tempfile.NamedTemporaryFile("w", prefix="aamp-override-", suffix=".txt") as override:
        override.write("".join(f"{n} {pr} {sec}\n" for n, (pr, sec) in sorted(overrides.items())))
        override.flush()
        out = _run(
            ["dpkg-scanpackages", "--multiversion", "pool", override.name],
            "dpkg-scanpackages",
            cwd=repo,
        )
    by_file: dict[str, str] = {}
    for stanza in out.strip().split("\n\n"):
        fields = stanza_fields(stanza)
        if "Filename" in fields:
            by_file[fields["Filename"].rsplit("/", 1)[-1]] = stanza.strip() + "\n"
    for suite, packages in suites.items():
        names = sorted({p.filename for p in packages})
        missing = [n for n in names if n not in by_file]
        if missing:
            raise DebianError(f"dpkg-scanpackages did not index {', '.join(missing[:5])}")
        # Every stanza ends with a blank line, the last one too: debootstrap drops a last
        # stanza that does not (it reads a stanza as complete at its blank line).
        body = "".join(by_file[n] + "\n" for n in names).encode()
        base = repo / "dists" / suite
        binary = base / COMPONENT / f"binary-{arch}"
        binary.mkdir(parents=True, exist_ok=True)
        (binary / "Packages").write_bytes(body)
        (binary / "Packages.gz").write_bytes(gzip.compress(body, mtime=0))
        sums = []
        for name in ("Packages", "Packages.gz"):
            data = (binary / name).read_bytes()
            sums.append(
                f" {hashlib.sha256(data).hexdigest()} {len(data)} {COMPONENT}/binary-{arch}/{name}"
            )
        release = (
            "\n".join(
                [
                    "Origin: aamp-bundle",
                    "Label: aamp-bundle",
                    f"Suite: {suite}",
                    f"Codename: {suite}",
                    f"Date: {formatdate(time.time(), usegmt=True)}",
                    f"Architectures: {arch}",
                    f"Components: {COMPONENT}",
                    "SHA256:",
                    *sums,
                ]
            )
            + "\n"
        )
        (base / "Release").write_text(release)
        say(f"  index {suite}: {len(names)} packages")


def prune_pool(pool: Path, keep: set[str]) -> None:
    """Remove pool files no index names (an earlier create's), so the bundle holds no strays."""
    for path in pool.iterdir():
        if path.name not in keep:
            path.unlink()
