"""A derived image: an image's tree, hard-linked, plus a policy's wheels from the wheelhouse
(`ImageStore.with_packages`), which Python distributions a tree already has, and the key
that names a set of wheels wherever it is built (`packages_key`).
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

from aamp.sandbox.image_commands import (
    PIP,
    ImageBuildError,
    Progress,
    compile_guest_python,
    run_command,
)
from aamp.sandbox.image_ext4 import make_ext4
from aamp.sandbox.image_recipes import GUEST_SITE_PACKAGES, guest_pip_target_args


def packages_key(sha256s: Iterable[str]) -> str:
    """The key of a set of wheels (their SHA-256s, in any order): what a host reports a
    packages layer under (`NAME+KEY@HASH`) and a replica asks placement for, knowing the
    wheels but perhaps not the image's build."""
    return hashlib.sha256(",".join(sorted(sha256s)).encode()).hexdigest()[:16]


def python_distributions(rootfs: Path) -> set[str]:
    """The names of the Python distributions an image's tree already has (Debian's and the
    recipe's pip packages), from their .dist-info and .egg-info directories."""
    found = set()
    for site in ("usr/lib/python3/dist-packages", GUEST_SITE_PACKAGES.lstrip("/")):
        directory = rootfs / site
        if directory.is_dir():
            for entry in directory.iterdir():
                for suffix in (".dist-info", ".egg-info"):
                    if entry.name.endswith(suffix):
                        found.add(entry.name[: -len(suffix)].rsplit("-", 1)[0])
    return found


def derive_tree(
    parent: Path,
    directory: Path,
    wheels: Sequence[tuple[Path, str]],
    content_hash: str,
    progress: Progress,
) -> None:
    """A derived image in `directory`: the `parent` tree plus `wheels` ((file, sha256) each),
    installed by pip with no index and every hash checked, and no dependency but those given.

    The tree is a hard-linked copy of the parent (files are shared, directories are new), so
    only new entries may be written: the wheels go into a directory of their own first and
    are then moved into the guest's site-packages, refusing a name the parent already has,
    and only the new files are byte-compiled. A derived image shares the parent's files, so
    the parent is never written through it.
    """
    rootfs = directory / "rootfs"
    run_command(
        ["cp", "-al", str(parent), str(rootfs)], label="hard-linked copy", progress=progress
    )
    staged = directory / "site"
    requirements = directory / "requirements.txt"
    requirements.write_text(
        "".join(f"{path.resolve()} --hash=sha256:{digest}\n" for path, digest in wheels)
    )
    run_command(
        [*PIP, "install", *guest_pip_target_args(), "--no-index", "--no-deps",
         "--require-hashes", f"--target={staged}", "--no-compile", "--no-warn-script-location",
         "--disable-pip-version-check", "-r", str(requirements)],
        label="pip install",
        progress=progress,
    )  # fmt: skip
    shutil.rmtree(staged / "bin", ignore_errors=True)  # host-interpreter scripts; use -m
    site = rootfs / GUEST_SITE_PACKAGES.lstrip("/")
    site.mkdir(parents=True, exist_ok=True)
    moved = []
    for entry in sorted(staged.iterdir()):
        dest = site / entry.name
        if dest.exists() or dest.is_symlink():
            raise ImageBuildError(
                f"{entry.name} is already in the image's {GUEST_SITE_PACKAGES}; a package "
                "cannot replace what the image has"
            )
        entry.rename(dest)
        moved.append(GUEST_SITE_PACKAGES + "/" + entry.name)
    staged.rmdir()
    requirements.unlink()
    sources = [m for m in moved if m.endswith(".py") or (rootfs / m.lstrip("/")).is_dir()]
    if sources:
        compile_guest_python(rootfs, sources, progress)
    make_ext4(rootfs, directory / "rootfs.ext4", content_hash, progress)
