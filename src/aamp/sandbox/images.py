"""Guest images: built from Debian packages plus the guest agent, cached by content hash.

An image is a directory tree (gVisor mounts it read-only as the guest's root) and the same tree
as an ext4 file (Firecracker's root drive). Both are built by `ImageStore.build` and never
modified afterwards. The layout under `settings.image_dir`::

    NAME/
      .lock                      fcntl lock: one build of NAME at a time
      .build-HASH-XXXX/          a build in progress (removed if it dies; never "complete")
      HASH/rootfs/  HASH/rootfs.ext4  HASH/image.json
      current -> HASH            the image `get(NAME)` returns

HASH covers everything that decides the content: the recipe (package lists, pip pins), the guest
agent files copied in, the CA certificate baked in, and `BUILDER_FORMAT`. A build with nothing
changed is a cache hit that only reads a few files. A build writes into a temporary directory
and renames it into place last, so a crash never leaves a half image that looks complete.

Usage::

    store = ImageStore(settings)
    image = store.build("base", progress=print)     # minutes cold, milliseconds cached
    store.get("base").root                          # Path to the read-only tree
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aamp
from aamp.config import Settings
from aamp.sandbox.image_recipes import (
    BUILDER_FORMAT,
    HEARTBEAT_SECONDS,
    ImageBuildError,
    MissingTool,
    Progress,
    ResolvedRecipe,
    TreeBuilder,
    preflight,
    recipe_names,
    resolve,
    tree_usage,
)

__all__ = [
    "BuiltImage",
    "ImageBuildError",
    "ImageNotBuilt",
    "ImageStore",
    "MissingTool",
    "UnknownImage",
]

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_HASH_RE = re.compile(r"^[0-9a-f]{64}$")


class UnknownImage(ValueError):
    """No recipe and no built image has this name."""


class ImageNotBuilt(LookupError):
    """The image has a recipe but was never built here."""


@dataclass(frozen=True)
class BuiltImage:
    name: str
    content_hash: str
    root: Path  # the tree, for gVisor, used read-only
    ext4: Path  # the same tree as an ext4 file, for Firecracker
    size_bytes: int  # tree size on disk
    ext4_bytes: int
    built_at: datetime  # UTC
    build_seconds: float


# --------------------------------------------------------------------------- small helpers


@contextlib.contextmanager
def _locked(lock_path: Path, progress: Progress, name: str) -> Iterator[None]:
    """Hold an exclusive fcntl lock; say so while waiting for another build to finish."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            started = time.monotonic()
            progress(f"[{name}] waiting for another build of '{name}' to finish ({lock_path})")
            last_note = started
            while True:
                time.sleep(0.2)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as again:
                    if again.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                now = time.monotonic()
                if now - last_note >= HEARTBEAT_SECONDS:
                    progress(f"[{name}] still waiting for the other build ({now - started:.0f}s)")
                    last_note = now
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _mounts_below(path: Path) -> list[str]:
    """Mount points at or under `path` in this mount namespace, deepest first."""
    prefix = str(path)
    found: list[str] = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as info:
        for entry in info:
            point = entry.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def _remove_tree(path: Path) -> None:
    """Delete a build directory, first unmounting anything left mounted inside it."""
    for point in _mounts_below(path):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    if _mounts_below(path):
        raise ImageBuildError(f"cannot remove {path}: something is still mounted inside it")
    shutil.rmtree(path, ignore_errors=True)


def _package_dir() -> Path:
    return Path(aamp.__file__).resolve().parent


def _guest_files(guest_dir: Path) -> dict[str, bytes]:
    """The guest agent's files by their path under /opt/aamp/lib/aamp/guest."""
    if not guest_dir.is_dir():
        raise ImageBuildError(f"guest agent directory {guest_dir} does not exist")
    files: dict[str, bytes] = {}
    for path in sorted(guest_dir.rglob("*.py")):
        rel = path.relative_to(guest_dir)
        if "__pycache__" in rel.parts:
            continue
        files[rel.as_posix()] = path.read_bytes()
    return files


def _read_ca(ca_cert: Path | None) -> bytes | None:
    if ca_cert is None:
        return None
    try:
        data = Path(ca_cert).read_bytes()
    except OSError as exc:
        raise ImageBuildError(f"cannot read CA certificate {ca_cert}: {exc.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise ImageBuildError(f"CA certificate {ca_cert} is not a PEM certificate")
    return data


# --------------------------------------------------------------------------- the store


class ImageStore:
    """Builds, caches and finds guest images under `settings.image_dir`.

    `guest_dir` is where the guest agent's source is read from; the installed package's
    `aamp/guest/` unless a test points it elsewhere.
    """

    def __init__(self, settings: Settings, *, guest_dir: Path | None = None) -> None:
        self._settings = settings
        self._root = settings.image_dir
        self._guest_dir = guest_dir if guest_dir is not None else _package_dir() / "guest"
        self._package_init = _package_dir() / "__init__.py"

    # ---- queries

    def names(self) -> list[str]:
        """The images this installation knows how to build."""
        return recipe_names()

    def get(self, name: str) -> BuiltImage:
        """The current built image called `name`."""
        self._check_name(name)
        image = self._current(name)
        if image is not None:
            return image
        if resolve(name) is None:
            raise self._unknown(name)
        raise ImageNotBuilt(f"image '{name}' has not been built yet; run: aamp image build {name}")

    def list(self) -> list[BuiltImage]:
        """Every image with a completed build, by name."""
        if not self._root.is_dir():
            return []
        found = []
        for child in sorted(self._root.iterdir()):
            if child.is_dir() and _NAME_RE.match(child.name):
                image = self._current(child.name)
                if image is not None:
                    found.append(image)
        return found

    def content_hash(self, name: str, *, ca_cert: Path | None = None) -> str:
        """The hash a build of `name` would have now (to tell whether the current is stale)."""
        self._check_name(name)
        recipe = resolve(name)
        if recipe is None:
            raise self._unknown(name)
        package_init = self._package_init.read_bytes()
        return self._hash(recipe, package_init, _guest_files(self._guest_dir), _read_ca(ca_cert))

    # ---- building

    def build(
        self,
        name: str,
        *,
        progress: Progress,
        force: bool = False,
        ca_cert: Path | None = None,
    ) -> BuiltImage:
        """Build `name` unless an identical build is cached; make it the current image."""
        self._check_name(name)
        recipe = resolve(name)
        if recipe is None:
            raise self._unknown(name)
        guest = _guest_files(self._guest_dir)
        if "launcher.py" not in guest:
            raise ImageBuildError(
                f"the guest agent launcher {self._guest_dir / 'launcher.py'} is missing"
            )
        ca = _read_ca(ca_cert)
        package_init = self._package_init.read_bytes()
        content_hash = self._hash(recipe, package_init, guest, ca)
        name_dir = self._root / name
        if not force:
            cached = self._load(name, content_hash)
            if cached is not None:
                self._point_current(name, content_hash)
                progress(f"[{name}] up to date ({content_hash[:12]})")
                return cached
        preflight(self._settings, recipe)
        name_dir.mkdir(parents=True, exist_ok=True)
        with _locked(name_dir / ".lock", progress, name):
            for stale in name_dir.glob(".build-*"):  # left by a build that died
                progress(f"[{name}] removing unfinished build {stale.name}")
                _remove_tree(stale)
            for stale_link in name_dir.glob(".current-*"):
                stale_link.unlink()
            if not force:
                cached = self._load(name, content_hash)  # another process built it meanwhile
                if cached is not None:
                    self._point_current(name, content_hash)
                    progress(f"[{name}] up to date ({content_hash[:12]})")
                    return cached
            tmp = name_dir / f".build-{content_hash[:12]}-{secrets.token_hex(4)}"
            tmp.mkdir()
            try:
                started = time.monotonic()
                TreeBuilder(
                    self._settings,
                    recipe,
                    content_hash,
                    package_init=package_init,
                    guest=guest,
                    ca=ca,
                    directory=tmp,
                    progress=progress,
                ).run()
                self._write_metadata(tmp, recipe, content_hash, time.monotonic() - started)
                final = name_dir / content_hash
                if final.exists():  # force: swap the new build in for the old one
                    old = name_dir / f".build-old-{secrets.token_hex(4)}"
                    final.rename(old)
                    tmp.rename(final)
                    _remove_tree(old)
                else:
                    tmp.rename(final)
                self._point_current(name, content_hash)
            finally:
                if tmp.exists():
                    _remove_tree(tmp)
        image = self._load(name, content_hash)
        assert image is not None
        progress(
            f"[{name}] built {content_hash[:12]} in {image.build_seconds:.1f}s: tree "
            f"{image.size_bytes / 2**20:.0f} MiB, ext4 {image.ext4_bytes / 2**20:.0f} MiB"
        )
        return image

    # ---- internals

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise self._unknown(name)

    def _unknown(self, name: object) -> UnknownImage:
        known = sorted(set(self.names()) | {i.name for i in self.list()})
        return UnknownImage(f"unknown image {name!r}; known images: {', '.join(known)}")

    @staticmethod
    def _hash(
        recipe: ResolvedRecipe, package_init: bytes, guest: dict[str, bytes], ca: bytes | None
    ) -> str:
        doc = {
            "builder_format": BUILDER_FORMAT,
            "recipe": recipe.fingerprint(),
            "package_init": hashlib.sha256(package_init).hexdigest(),
            "guest": {rel: hashlib.sha256(data).hexdigest() for rel, data in guest.items()},
            "ca": hashlib.sha256(ca).hexdigest() if ca is not None else None,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def _load(self, name: str, content_hash: str) -> BuiltImage | None:
        directory = self._root / name / content_hash
        try:
            meta = json.loads((directory / "image.json").read_text())
        except (OSError, ValueError):
            return None
        root, ext4 = directory / "rootfs", directory / "rootfs.ext4"
        if not root.is_dir() or not ext4.is_file():
            return None
        try:
            return BuiltImage(
                name=name,
                content_hash=content_hash,
                root=root,
                ext4=ext4,
                size_bytes=int(meta["size_bytes"]),
                ext4_bytes=int(meta["ext4_bytes"]),
                built_at=datetime.fromisoformat(meta["built_at"]),
                build_seconds=float(meta["build_seconds"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def _current(self, name: str) -> BuiltImage | None:
        try:
            target = os.readlink(self._root / name / "current")
        except OSError:
            return None
        if not _HASH_RE.match(target):
            return None
        return self._load(name, target)

    def _point_current(self, name: str, content_hash: str) -> None:
        link = self._root / name / "current"
        with contextlib.suppress(OSError):
            if os.readlink(link) == content_hash:
                return
        tmp = link.with_name(f".current-{secrets.token_hex(4)}")
        os.symlink(content_hash, tmp)
        os.replace(tmp, link)  # atomic: readers see the old or the new image, never neither

    def _write_metadata(
        self, tmp: Path, recipe: ResolvedRecipe, content_hash: str, seconds: float
    ) -> None:
        size, _ = tree_usage(tmp / "rootfs")
        packages = json.loads((tmp / "packages.json").read_text())
        (tmp / "packages.json").unlink()
        meta = {
            "name": recipe.name,
            "description": recipe.description,
            "content_hash": content_hash,
            "builder_format": BUILDER_FORMAT,
            "recipe": recipe.fingerprint(),
            "size_bytes": size,
            "ext4_bytes": (tmp / "rootfs.ext4").stat().st_size,
            "built_at": datetime.now(UTC).isoformat(),
            "build_seconds": round(seconds, 3),
            "debian_packages": packages,
        }
        path = tmp / "image.json"
        path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        with open(path, "rb") as f:
            os.fsync(f.fileno())
