"""Guest images: built from Debian packages plus the guest agent, cached by content hash.

An image is a directory tree (gVisor mounts it read-only as the guest's root) and the same tree
as an ext4 file (Firecracker's root drive). Both are built by `ImageStore.build` and never
modified afterwards. The layout under `settings.image_dir`::

    NAME/
      .lock                      fcntl lock: one build (or prune) of NAME at a time
      .build-HASH-XXXX/          a build in progress (removed if it dies; never "complete")
      .retired-HASH-XXXX/        an image `build --force` replaced while a sandbox still used it
      .prune-HASH-XXXX/          an image being deleted by `prune`
      HASH/rootfs/  HASH/rootfs.ext4  HASH/image.json
      HASH/use.lock              shared fcntl lock held by every live sandbox using HASH
      current -> HASH            the image `get(NAME)` returns

HASH covers everything that decides the content: the recipe (package lists, pip pins), the guest
agent files copied in, the CA certificate baked in, and `BUILDER_FORMAT`. A build with nothing
changed is a cache hit that only reads a few files. A build writes into a temporary directory
and renames it into place last, so a crash never leaves a half image that looks complete.

Usage::

    store = ImageStore(settings)
    image = store.build("base", progress=print)     # minutes cold, milliseconds cached
    store.get("base").root                          # Path to the read-only tree
    store.prune(dry_run=False, progress=print)      # delete every image but the current ones

Images in use: a driver calls `hold_image(directory)` when it creates a sandbox and releases it
when the sandbox is destroyed (see `hold_image` for why a lock and not a scan for mounts).
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from typing import NamedTuple

import aamp
from aamp.config import Settings
from aamp.sandbox import custom_images
from aamp.sandbox.image_recipes import (
    BUILDER_FORMAT,
    HEARTBEAT_SECONDS,
    ImageBuildError,
    MissingTool,
    Progress,
    ResolvedRecipe,
    TreeBuilder,
    derive_tree,
    preflight,
    python_distributions,
    recipe_names,
    resolve,
    tree_usage,
)
from aamp.sandbox.wheelhouse import Wheelhouse

__all__ = [
    "BuiltImage",
    "ImageBuildError",
    "ImageNotBuilt",
    "ImageStore",
    "ImageUnavailable",
    "ImageUse",
    "MissingTool",
    "Pruned",
    "UnknownImage",
    "hold_image",
]

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_HASH_RE = re.compile(r"^[0-9a-f]{64}$")
USE_LOCK = "use.lock"  # in each image directory; see hold_image
DERIVED_FORMAT = 1  # bump when `with_packages` changes what it puts into a derived image
HOLD_TIMEOUT_SECONDS = 10.0  # prune and build hold a use lock exclusively only for a rename


class UnknownImage(ValueError):
    """No recipe and no built image has this name."""


class ImageNotBuilt(LookupError):
    """The image has a recipe but was never built here."""


class ImageUnavailable(RuntimeError):
    """A sandbox could not take hold of an image directory (pruned or replaced meanwhile)."""


class Pruned(NamedTuple):
    """One directory `ImageStore.prune` removed (or, in a dry run, would remove).

    `content_hash` is the image's hash; for a leftover (an unfinished build, a copy replaced
    by `build --force`, an interrupted prune) it is that directory's name, which starts with
    a dot."""

    name: str
    content_hash: str
    size_bytes: int


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


class ImageUse:
    """A shared lock on one image directory, held while a sandbox runs from that image."""

    def __init__(self, fd: int, directory: Path) -> None:
        self._fd: int | None = fd
        self.directory = directory

    def release(self) -> None:
        """Let go of the image (idempotent); `prune` may then remove it."""
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None


def hold_image(directory: Path) -> ImageUse:
    """Mark the image in `directory` (an image's HASH directory) as in use until `release`.

    Why a lock and not a scan for who uses the files: gVisor's gofer reaches the tree through
    a bind mount in its own mount namespace and Firecracker under the jailer through a hard
    link, so neither this host's mount table nor /proc/*/fd reliably names the image
    directory; an fcntl lock is exact, needs no shared registry, and vanishes with the
    process that held it. Each sandbox takes its own shared lock (its own open file, so two
    sandboxes in one process are two holders); `prune` and `build --force` try the lock
    exclusively without waiting and keep the image if that fails. The lock lives in the aamp
    process that owns the sandbox (the descriptor is close-on-exec, never inherited by the
    guest's processes): if that process crashes, its orphaned guests are killed by the
    driver's `reap` at the next start, so the image they used is free then anyway.

    After locking, the path must still name the locked file: prune renames an image away
    (and build --force swaps it) while holding the lock exclusively, and a sandbox that
    opened the old file must not believe it holds the directory now at that path.
    """
    path = directory / USE_LOCK
    deadline = time.monotonic() + HOLD_TIMEOUT_SECONDS
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            raise ImageUnavailable(
                f"image directory {directory} no longer exists (pruned or rebuilt meanwhile)"
            ) from None
        except OSError as exc:
            raise ImageUnavailable(f"cannot lock image {directory}: {exc.strerror}") from None
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ImageUnavailable(
                            f"image {directory} is being removed or replaced; try again"
                        ) from None
                    time.sleep(0.01)
            held, now = os.fstat(fd), _stat_or_none(path)
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return ImageUse(fd, directory)
        os.close(fd)  # renamed away while we waited: look again at what the path names now


def _stat_or_none(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


@contextlib.contextmanager
def _exclusive_if_unused(directory: Path, *, create: bool) -> Iterator[bool]:
    """True (holding the image's use lock exclusively for the block) if no sandbox uses the
    image in `directory`; False if one does. Never waits. Without `create` (a dry run) a
    missing lock file means nobody ever held it, and nothing is written."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(directory / USE_LOCK, flags, 0o644)
    except FileNotFoundError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free = True
        except BlockingIOError:
            free = False
        yield free
    finally:
        os.close(fd)


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


def _disk_usage(root: Path) -> int:
    """Bytes allocated under `root`, hard links once, never crossing into a mount (a dead
    build can leave /proc mounted in its chroot) and ignoring entries that vanish."""
    try:
        top = os.lstat(root)
    except OSError:
        return 0
    seen: set[int] = set()
    device, total = top.st_dev, top.st_blocks * 512
    pending = [str(root)]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_dev != device or st.st_ino in seen:
                continue
            seen.add(st.st_ino)
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
    return total


def _quiet(line: str) -> None:
    del line


def _package_dir() -> Path:
    return Path(aamp.__file__).resolve().parent


def _guest_files(guest_dir: Path) -> dict[str, bytes]:
    """The guest agent's files (its modules and the first stage's C source) by their path
    under /opt/aamp/lib/aamp/guest."""
    if not guest_dir.is_dir():
        raise ImageBuildError(f"guest agent directory {guest_dir} does not exist")
    files: dict[str, bytes] = {}
    # The C source too: the first stage is compiled from it into the image (`first_stage_build`).
    for path in sorted([*guest_dir.rglob("*.py"), *guest_dir.rglob("*.c")]):
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
        """The images this installation knows how to build (built-in, then custom)."""
        recipes = self._settings.home / "image-recipes"
        custom = sorted(custom_images.PREFIX + p.stem for p in recipes.glob("*.yaml"))
        return recipe_names() + [n for n in custom if _NAME_RE.match(n)]

    def _resolve(self, name: str) -> ResolvedRecipe | None:
        """A built-in recipe, or a custom image's from its recipe file with its wheelhouse
        packages pinned to their files and hashes (CustomRecipeError, WheelhouseError)."""
        custom = custom_images.load(self._settings, name)
        if custom is None:
            return resolve(name)
        recipe, packages = custom
        resolved = resolve(name, recipe)
        if resolved is None or not packages:
            return resolved
        wheels = Wheelhouse(self._settings).pinned(packages)
        return dataclasses.replace(resolved, wheels=tuple((w.filename, w.sha256) for w in wheels))

    def get(self, name: str) -> BuiltImage:
        """The current built image called `name`."""
        self._check_name(name)
        image = self._current(name)
        if image is not None:
            return image
        if self._resolve(name) is None:
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
        recipe = self._resolve(name)
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
        """Build `name` unless an identical build is cached; make it the current image.

        `force` rebuilds even a cached hash. The new tree is built aside and renamed in place
        of the old one (the swap is two renames); sandboxes running from the old directory
        keep running, because their runtimes hold it open (gVisor's bind mount, Firecracker's
        open drive), and new sandboxes get the new one. The old directory is deleted at once
        if no sandbox holds it, else kept as `.retired-HASH-XXXX` until a `prune` finds it
        unused. That beats refusing: a rebuild never has to wait for (or kill) sandboxes.
        """
        self._check_name(name)
        recipe = self._resolve(name)
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
                (tmp / USE_LOCK).touch()
                final = name_dir / content_hash
                if final.exists():
                    self._swap_in(name, tmp, final, progress)
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

    # ---- derived layers: an image plus a policy's packages

    def with_packages(
        self, image: BuiltImage, packages: tuple[str, ...], *, progress: Progress = _quiet
    ) -> BuiltImage:
        """`image` with exactly `packages` (`name==version`, from the wheelhouse) installed:
        a derived image, cached by the image's hash and the wheels' hashes, so every sandbox
        with the same set starts from the same tree. Built once, under the name's build
        lock; it sits next to the image's builds (`NAME/HASH/`), so `prune` removes it when
        no sandbox uses it and the next sandbox builds it again. Raises WheelhouseError
        naming what the wheelhouse lacks."""
        if not packages:
            return image
        wheelhouse = Wheelhouse(self._settings)
        wheels = wheelhouse.pinned(packages, python_distributions(image.root))
        doc = {
            "derived_format": DERIVED_FORMAT,
            "image": image.content_hash,
            "wheels": sorted(w.sha256 for w in wheels),
        }
        content_hash = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
        cached = self._load(image.name, content_hash)
        if cached is not None:
            return cached
        name_dir = self._root / image.name
        with _locked(name_dir / ".lock", progress, image.name):
            cached = self._load(image.name, content_hash)  # built meanwhile by another sandbox
            if cached is not None:
                return cached
            tmp = name_dir / f".build-{content_hash[:12]}-{secrets.token_hex(4)}"
            tmp.mkdir()
            try:
                started = time.monotonic()
                files = [(wheelhouse.path(w), w.sha256) for w in wheels]
                derive_tree(image.root, tmp, files, content_hash, progress)
                meta = {
                    "name": image.name,
                    "content_hash": content_hash,
                    "derived_from": image.content_hash,
                    "packages": sorted(packages),
                    "wheels": {w.filename: w.sha256 for w in wheels},
                    "size_bytes": tree_usage(tmp / "rootfs")[0],
                    "ext4_bytes": (tmp / "rootfs.ext4").stat().st_size,
                    "built_at": datetime.now(UTC).isoformat(),
                    "build_seconds": round(time.monotonic() - started, 3),
                }
                (tmp / "image.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
                (tmp / USE_LOCK).touch()
                tmp.rename(name_dir / content_hash)
            finally:
                if tmp.exists():
                    _remove_tree(tmp)
        built = self._load(image.name, content_hash)
        assert built is not None
        return built

    def check_packages(self, image_name: str, packages: tuple[str, ...]) -> None:
        """Raise WheelhouseError unless the wheelhouse has exactly these packages for the
        guest, with every dependency listed or already in the image (if it is built)."""
        if not packages:
            return
        try:
            provided = python_distributions(self.get(image_name).root)
        except (ValueError, LookupError):  # not built (yet), or a name no recipe has
            provided = set()
        Wheelhouse(self._settings).pinned(packages, provided)

    # ---- removing

    def prune(self, *, dry_run: bool, progress: Progress) -> list[Pruned]:
        """Delete every built image that is not the current one of its name, except those a
        live sandbox holds (see `hold_image`), plus what interrupted builds and prunes left.

        Each name is pruned under the same lock its builds take, so a prune never sees a
        build half-way (and `.build-*` directories found then are dead builds' leftovers).
        An image is first renamed to `.prune-*` while its use lock is held exclusively, so a
        sandbox starting at that instant fails cleanly instead of booting from a tree being
        deleted; a prune killed mid-way leaves only `.prune-*` leftovers, which the next one
        removes. A name without a valid `current` link keeps its images (nothing says which
        one is wanted). With `dry_run` nothing is changed and the same list is returned.
        """
        pruned: list[Pruned] = []
        if not self._root.is_dir():
            return pruned
        for name_dir in sorted(self._root.iterdir()):
            if name_dir.is_symlink() or not name_dir.is_dir() or not _NAME_RE.match(name_dir.name):
                continue
            with _locked(name_dir / ".lock", progress, name_dir.name):
                pruned += self._prune_name(name_dir, dry_run=dry_run, progress=progress)
        return pruned

    def _prune_name(self, name_dir: Path, *, dry_run: bool, progress: Progress) -> list[Pruned]:
        name = name_dir.name
        try:
            current: str | None = os.readlink(name_dir / "current")
        except OSError:
            current = None
        if current is not None and not _HASH_RE.match(current):
            current = None
        verb = "would remove" if dry_run else "removing"
        pruned: list[Pruned] = []
        for entry in sorted(name_dir.iterdir()):
            label = entry.name
            if entry.is_symlink():
                if label.startswith(".current-") and not dry_run:  # a half-made current link
                    entry.unlink(missing_ok=True)
                continue
            if not entry.is_dir():
                continue
            if _HASH_RE.match(label):
                if label == current:
                    continue
                if current is None:
                    progress(f"[{name}] no current image, so {label[:12]} is left alone")
                    continue
                what, check_use = "old image", True
            elif label.startswith(".retired-"):
                what, check_use = "replaced image", True
            elif label.startswith(".build-"):
                what, check_use = "unfinished build", False
            elif label.startswith(".prune-"):
                what, check_use = "interrupted prune", False
            else:
                continue
            shown = label[:12] if _HASH_RE.match(label) else label
            size = _disk_usage(entry)
            with contextlib.ExitStack() as stack:
                if check_use and not stack.enter_context(
                    _exclusive_if_unused(entry, create=not dry_run)
                ):
                    progress(f"[{name}] keeping {what} {shown}: a running sandbox uses it")
                    continue
                progress(f"[{name}] {verb} {what} {shown} ({size / 2**20:.0f} MiB)")
                if dry_run:
                    pruned.append(Pruned(name, label, size))
                    continue
                doomed = entry
                if not label.startswith(".prune-"):
                    doomed = name_dir / f".prune-{label.lstrip('.')[:40]}-{secrets.token_hex(4)}"
                    entry.rename(doomed)  # while holding the use lock: nobody can start on it
            _remove_tree(doomed)
            if doomed.exists():
                progress(f"[{name}] could not remove all of {doomed}; the next prune retries")
                continue
            pruned.append(Pruned(name, label, size))
        return pruned

    def _swap_in(self, name: str, tmp: Path, final: Path, progress: Progress) -> None:
        """Replace the image directory `final` by the finished build `tmp` (see `build`)."""
        retired = final.with_name(f".retired-{final.name}-{secrets.token_hex(4)}")
        with _exclusive_if_unused(final, create=True) as unused:
            final.rename(retired)
            tmp.rename(final)
        if unused:
            _remove_tree(retired)
        else:
            progress(
                f"[{name}] a running sandbox still uses the previous build of "
                f"{final.name[:12]}; it stays as {retired.name} until `aamp image prune` "
                "finds it unused"
            )

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
