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

Images in use: a driver calls `hold_image(directory)` (from the event loop `hold_image_async`,
which waits in a thread only when the lock is busy) when it creates a sandbox and releases it
when the sandbox is destroyed (see `hold_image` for why a lock and not a scan for mounts).

This module is the store (finding, caching, swapping in); the rest has a module each: the
recipes (`image_recipes`), building a tree (`image_tree`, commands in `image_commands`, the ext4
file in `image_ext4`), derived layers (`image_derive`), the build and use locks
(`image_locks`), directory names and removal (`image_dirs`) and pruning (`image_prune`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aamp
from aamp.config import Settings
from aamp.digests import is_sha256
from aamp.sandbox import custom_images
from aamp.sandbox.image_commands import ImageBuildError, MissingTool, Progress
from aamp.sandbox.image_derive import derive_tree, packages_key, python_distributions
from aamp.sandbox.image_dirs import NAME_RE, remove_tree
from aamp.sandbox.image_ext4 import tree_usage
from aamp.sandbox.image_locks import (
    USE_LOCK,
    ImageUnavailable,
    ImageUse,
    build_lock,
    exclusive_if_unused,
    hold_image,
    hold_image_async,
)
from aamp.sandbox.image_prune import Pruned, prune
from aamp.sandbox.image_recipes import ResolvedRecipe, recipe_names, resolve
from aamp.sandbox.image_tree import BUILDER_FORMAT, TreeBuilder, preflight
from aamp.sandbox.wheelhouse import Wheelhouse, WheelhouseError, dependency_problems

# The image store's surface: what drivers, the CLI and the API take from the image code.
__all__ = [
    "USE_LOCK",
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
    "hold_image_async",
]

DERIVED_FORMAT = 1  # bump when `with_packages` changes what it puts into a derived image


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
        # Built images read from their manifests, by directory, with the manifest's identity.
        self._loaded: dict[Path, tuple[tuple[int, int, int, int], BuiltImage]] = {}

    # ---- queries

    def names(self) -> list[str]:
        """The images this installation knows how to build (built-in, then custom)."""
        recipes = self._settings.home / "image-recipes"
        custom = sorted(custom_images.PREFIX + p.stem for p in recipes.glob("*.yaml"))
        return recipe_names() + [n for n in custom if NAME_RE.match(n)]

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
            if child.is_dir() and NAME_RE.match(child.name):
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
        with build_lock(name_dir / ".lock", progress, name):
            for stale in name_dir.glob(".build-*"):  # left by a build that died
                progress(f"[{name}] removing unfinished build {stale.name}")
                remove_tree(stale)
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
                    remove_tree(tmp)
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
        """`image` with exactly `packages` (`name==version`, from the wheelhouse) installed
        (`with_wheels`). Raises WheelhouseError naming what the wheelhouse lacks."""
        if not packages:
            return image
        wheelhouse = Wheelhouse(self._settings)
        wheels = wheelhouse.pinned(packages, python_distributions(image.root))
        files = [(wheelhouse.path(w), w.sha256) for w in wheels]
        return self.with_wheels(image, packages, files, progress=progress, checked=True)

    def with_wheels(
        self,
        image: BuiltImage,
        packages: tuple[str, ...],
        wheels: list[tuple[Path, str]],
        *,
        progress: Progress = _quiet,
        checked: bool = False,
    ) -> BuiltImage:
        """`image` with `wheels` ((file, sha256) each: the wheels of `packages`) installed: a
        derived image, cached by the image's hash and the wheels' hashes, so every sandbox
        with the same set starts from the same tree — on this machine or, the wheels sent
        over the link (`received_wheels.py`), on a sandbox host on another. Built once,
        under the name's build lock; it sits next to the image's builds (`NAME/HASH/`), so
        `prune` removes it when no sandbox uses it and the next sandbox builds it again.
        Unless `checked`, WheelhouseError names each dependency neither in `packages` nor in
        the image."""
        if not checked:
            problems = dependency_problems(
                packages,
                [(path, path.name) for path, _ in wheels],
                python_distributions(image.root),
            )
            if problems:
                raise WheelhouseError("packages: " + "; ".join(problems))
        doc = {
            "derived_format": DERIVED_FORMAT,
            "image": image.content_hash,
            "wheels": sorted(digest for _, digest in wheels),
        }
        content_hash = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
        cached = self._load(image.name, content_hash)
        if cached is not None:
            return cached
        name_dir = self._root / image.name
        with build_lock(name_dir / ".lock", progress, image.name):
            cached = self._load(image.name, content_hash)  # built meanwhile by another sandbox
            if cached is not None:
                return cached
            tmp = name_dir / f".build-{content_hash[:12]}-{secrets.token_hex(4)}"
            tmp.mkdir()
            try:
                started = time.monotonic()
                derive_tree(image.root, tmp, wheels, content_hash, progress)
                meta = {
                    "name": image.name,
                    "content_hash": content_hash,
                    "derived_from": image.content_hash,
                    "packages": sorted(packages),
                    "wheels": {path.name: digest for path, digest in wheels},
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
                    remove_tree(tmp)
        built = self._load(image.name, content_hash)
        assert built is not None
        return built

    def layers(self) -> list[str]:
        """`NAME+PACKAGES_KEY@CONTENT_HASH` of every packages layer built on this machine over
        the current build of its image (`packages_key`: its wheels' hashes), for placement
        to prefer the host that has the layer a create needs."""
        found = []
        for image in self.list():
            for child in sorted((self._root / image.name).iterdir()):
                if child.name == image.content_hash or not is_sha256(child.name):
                    continue
                try:
                    meta = json.loads((child / "image.json").read_text())
                    parent, wheels = meta["derived_from"], meta["wheels"]
                    if parent != image.content_hash or self._load(image.name, child.name) is None:
                        continue
                    key = packages_key(wheels.values())
                except (OSError, ValueError, KeyError, TypeError, AttributeError):
                    continue  # not a layer, or one half-pruned: nothing to prefer it for
                found.append(f"{image.name}+{key}@{child.name}")
        return found

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
        """Delete what no one needs under the image directory (`image_prune.prune`)."""
        return prune(self._root, dry_run=dry_run, progress=progress)

    def _swap_in(self, name: str, tmp: Path, final: Path, progress: Progress) -> None:
        """Replace the image directory `final` by the finished build `tmp` (see `build`)."""
        retired = final.with_name(f".retired-{final.name}-{secrets.token_hex(4)}")
        with exclusive_if_unused(final, create=True) as unused:
            final.rename(retired)
            tmp.rename(final)
        if unused:
            remove_tree(retired)
        else:
            progress(
                f"[{name}] a running sandbox still uses the previous build of "
                f"{final.name[:12]}; it stays as {retired.name} until `aamp image prune` "
                "finds it unused"
            )

    # ---- internals

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not NAME_RE.match(name):
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
        manifest = directory / "image.json"
        root, ext4 = directory / "rootfs", directory / "rootfs.ext4"
        try:
            seen = _file_identity(manifest)
        except OSError:
            return None
        cached = self._loaded.get(directory)
        if cached is not None and cached[0] == seen:
            # The same manifest as last time (a build writes a new one): only what a prune
            # can take away is looked at again. A sandbox's create asks this every time.
            return cached[1] if root.is_dir() and ext4.is_file() else None
        image = self._read(name, content_hash, manifest, root, ext4)
        if image is not None:
            self._loaded[directory] = (seen, image)
        return image

    def _read(
        self, name: str, content_hash: str, manifest: Path, root: Path, ext4: Path
    ) -> BuiltImage | None:
        try:
            meta = json.loads(manifest.read_text())
        except (OSError, ValueError):
            return None
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
        if not is_sha256(target):
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


def _file_identity(path: Path) -> tuple[int, int, int, int]:
    """What changes whenever a file is written anew: device, inode, size, modification time."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
