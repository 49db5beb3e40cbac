"""Building one resolved recipe into a tree (`TreeBuilder`): debootstrap, apt, pip, native
libraries, the recipe's files, the guest agent, the CA, byte-code and trimming, then the ext4
file; and the check that this host can build at all (`preflight`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from aamp.config import Settings
from aamp.sandbox.debian_mirror import MirrorNotFound, bundle_repository, mirror_url
from aamp.sandbox.first_stage_build import INSTALLED_AS as FIRST_STAGE_INSTALLED_AS
from aamp.sandbox.first_stage_build import SOURCE as FIRST_STAGE_SOURCE
from aamp.sandbox.first_stage_build import FirstStageBuildError, compile_first_stage
from aamp.sandbox.image_commands import (
    PIP,
    ImageBuildError,
    Progress,
    capture_command,
    compile_guest_python,
    find_tool,
    run_command,
)
from aamp.sandbox.image_ext4 import make_ext4
from aamp.sandbox.image_recipes import GUEST_SITE_PACKAGES, ResolvedRecipe, guest_pip_target_args
from aamp.sandbox.native_build import NativeBuildError, build_native

# Bump when the builder changes what it puts into an image, so old caches are not reused.
BUILDER_FORMAT = 1
# Removed from every tree after installation: caches and docs nobody reads in a sandbox.
_TRIM_GLOBS = (
    "var/cache/apt/archives/*.deb",
    "var/cache/apt/*.bin",
    "var/lib/apt/lists/*",
    "usr/share/doc/*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/locale/*/LC_MESSAGES/*.mo",
    "var/log/*.log",
)

# Where the installation's egress CA certificate is in an image's tree.
BAKED_CA = "usr/local/share/ca-certificates/aamp-ca.crt"


def preflight(settings: Settings, recipe: ResolvedRecipe) -> str:
    """Check the host can build at all (tools, root, a mirror); return the mirror URL.

    Called before anything is written, so a host that cannot build is told why and left as it
    was.
    """
    for tool in ("setpriv", "unshare", "chroot", "debootstrap", "mkfs.ext4"):
        find_tool(tool)
    if os.geteuid() != 0:
        raise ImageBuildError("building images needs root (debootstrap, chroot): run as root")
    try:
        return mirror_url(settings, suite=recipe.suite)
    except MirrorNotFound as exc:
        raise ImageBuildError(str(exc)) from None


@dataclass(eq=False, repr=False)
class TreeBuilder:
    """Builds one recipe into `directory` (rootfs/, rootfs.ext4, packages.json), step by step.

    The directory is the caller's temporary build directory; nothing here decides whether the
    result is cached or current.
    """

    settings: Settings
    recipe: ResolvedRecipe
    content_hash: str
    _: KW_ONLY
    package_init: bytes
    guest: dict[str, bytes]
    ca: bytes | None
    directory: Path
    progress: Progress
    started: float = field(init=False, default_factory=time.monotonic)

    @property
    def rootfs(self) -> Path:
        return self.directory / "rootfs"

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        began = time.monotonic()
        self.progress(f"[{self.recipe.name}] {title} ...")
        yield
        now = time.monotonic()
        self.progress(
            f"[{self.recipe.name}] {title}: done in {now - began:.1f}s "
            f"(total {now - self.started:.1f}s)"
        )

    def run(self) -> None:
        mirror = preflight(self.settings, self.recipe)
        with self.step(f"debootstrap {self.recipe.suite} ({self.recipe.variant}) from {mirror}"):
            self.debootstrap(mirror)
        if self.recipe.debian:
            with self.step(f"Debian packages {' '.join(self.recipe.debian)}"):
                self.apt_install()
        if self.recipe.pip:
            with self.step(f"pip packages {' '.join(self.recipe.pip)}"):
                self.pip_install()
        for library in self.recipe.native:
            with self.step(f"native library {library.package}/{library.output}"):
                try:
                    build_native(self.rootfs, library)
                except NativeBuildError as exc:
                    raise ImageBuildError(str(exc)) from None
        if self.recipe.wheels:
            with self.step(f"wheelhouse packages {' '.join(n for n, _ in self.recipe.wheels)}"):
                self.wheelhouse_install()
        if self.recipe.files:
            with self.step(f"files {' '.join('/' + path for path, _ in self.recipe.files)}"):
                self.write_files()
        with self.step("guest agent and sandbox layout"):
            self.guest_layout()
        if self.ca is not None:
            with self.step("CA certificate"):
                self.install_ca()
        with self.step("byte-compiling Python files"):
            self.compile_python()
        with self.step("recording package versions and trimming caches and docs"):
            self.record_packages()
            self.trim()
        with self.step("ext4 image"):
            self.make_ext4()

    def debootstrap(self, mirror: str) -> None:
        argv = [
            find_tool("debootstrap"),
            f"--variant={self.recipe.variant}",
            f"--include={','.join(self.recipe.bootstrap)}",
            "--components=main",
        ]
        if bundle_repository(self.settings) is not None:
            # The bundle's index is unsigned; its manifest is what was verified (debian_mirror.py).
            argv.append("--no-check-gpg")
        if self.settings.download_cache is not None:
            cache = (self.settings.download_cache / "debootstrap").resolve()
            cache.mkdir(parents=True, exist_ok=True)
            argv.append(f"--cache-dir={cache}")
        argv += [self.recipe.suite, str(self.rootfs), mirror]
        try:
            run_command(argv, label="debootstrap", progress=self.progress, isolate=True)
        except ImageBuildError as exc:
            # debootstrap's own messages only point at its log, which the failed build removes.
            log = self.rootfs / "debootstrap/debootstrap.log"
            if log.is_file():
                lines = log.read_text(errors="replace").splitlines()[-25:]
                detail = "\n".join(f"    {line}" for line in lines)
                raise ImageBuildError(f"{exc}\n  end of debootstrap.log:\n{detail}") from None
            raise

    def apt_install(self) -> None:
        """Install the descendants' Debian packages with apt inside the tree.

        Runs in a private mount namespace: /proc and the download cache are mounted into the
        tree only for as long as apt runs. Services are kept from starting (policy-rc.d).
        """
        root = self.rootfs
        policy = root / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")  # replaced in trim()
        archives = ""
        local = bundle_repository(self.settings)
        repo = ""
        made: list[Path] = []  # directories made in the tree for the bind, removed after
        if local is not None:
            # The tree's sources.list names file://BUNDLE/debian: the repository is bound in
            # at that path, read-only, and trusted (unsigned index, verified manifest) for
            # this apt run only, through a list that is removed with the bind.
            repo = str(local.resolve())
            mount_point = root / repo.lstrip("/")
            made = [p for p in (mount_point, *mount_point.parents) if not p.exists()]
            mount_point.mkdir(parents=True)
            (root / "run/aamp-bundle.list").write_text(
                f"deb [trusted=yes] {local.resolve().as_uri()} {self.recipe.suite} main\n"
            )
        if self.settings.download_cache is not None:
            cache = (self.settings.download_cache / "apt").resolve()
            (cache / "partial").mkdir(parents=True, exist_ok=True)
            archives = str(cache)
        script = (
            'set -e; root=$1; archives=$2; repo=$3; shift 3; mount -t proc proc "$root/proc"; '
            'if [ -n "$archives" ]; then '
            'mount --bind "$archives" "$root/var/cache/apt/archives"; fi; '
            'src=""; if [ -n "$repo" ]; then '
            'mount --bind -o ro "$repo" "$root$repo"; '
            "src='-o Dir::Etc::SourceList=/run/aamp-bundle.list "
            "-o Dir::Etc::SourceParts=/nonexistent'; fi; "
            'chroot "$root" apt-get -q $src -o APT::Sandbox::User=root -o Acquire::Languages=none '
            "update; "
            'chroot "$root" apt-get -q -y $src -o APT::Sandbox::User=root -o Dpkg::Use-Pty=0 '
            '--no-install-recommends install "$@"'
        )
        try:
            run_command(
                ["sh", "-c", script, "sh", str(root), archives, repo, *self.recipe.debian],
                label="apt-get install",
                progress=self.progress,
                isolate=True,
            )
        finally:
            policy.unlink(missing_ok=True)
            (root / "run/aamp-bundle.list").unlink(missing_ok=True)
            for directory in made:  # innermost first; the bind died with its namespace
                directory.rmdir()

    def pip_install(self) -> None:
        if self.settings.bundle is not None:  # an offline installation: the bundle's wheels
            self._pip_install_from(self.settings.bundle / "wheels" / "guest")
            return
        if self.settings.download_cache is not None:
            wheels = (self.settings.download_cache / "wheels").resolve()
        else:
            wheels = self.directory / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        run_command(
            [*PIP, "download", *guest_pip_target_args(), "--progress-bar=off",
             f"--dest={wheels}", *self.recipe.pip],
            label="pip download",
            progress=self.progress,
        )  # fmt: skip
        self._pip_install_from(wheels)
        if self.directory / "wheels" == wheels:
            shutil.rmtree(wheels)

    def _pip_install_from(self, wheels: Path) -> None:
        target = self.rootfs / GUEST_SITE_PACKAGES.lstrip("/")
        run_command(
            [*PIP, "install", *guest_pip_target_args(), "--no-index", f"--find-links={wheels}",
             f"--target={target}", "--no-compile", "--no-warn-script-location", *self.recipe.pip],
            label="pip install",
            progress=self.progress,
        )  # fmt: skip
        # Console scripts carry the host interpreter's path; in the guest use `python3 -m`.
        shutil.rmtree(target / "bin", ignore_errors=True)

    def wheelhouse_install(self) -> None:
        """The recipe's wheels, from the wheelhouse only: no index, no dependencies but those
        listed, every hash checked."""
        wheels = self.settings.home / "wheelhouse"
        requirements = self.directory / "wheelhouse.txt"
        requirements.write_text(
            "".join(
                f"{wheels / name} --hash=sha256:{digest}\n" for name, digest in self.recipe.wheels
            )
        )
        target = self.rootfs / GUEST_SITE_PACKAGES.lstrip("/")
        run_command(
            [*PIP, "install", *guest_pip_target_args(), "--no-index",
             "--no-deps", "--require-hashes", f"--target={target}", "--no-compile",
             "--no-warn-script-location", "--disable-pip-version-check", "-r",
             str(requirements)],
            label="pip install (wheelhouse)",
            progress=self.progress,
        )  # fmt: skip
        shutil.rmtree(target / "bin", ignore_errors=True)
        requirements.unlink()

    def write_files(self) -> None:
        for path, text in self.recipe.files:
            dest = self.rootfs / path
            if dest.parent.is_symlink() or dest.is_symlink():
                raise ImageBuildError(f"recipe file /{path}: a symbolic link is in the way")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
            dest.chmod(0o644)

    def guest_layout(self) -> None:
        root = self.rootfs
        lib = root / "opt/aamp/lib/aamp"
        (lib / "guest").mkdir(parents=True, exist_ok=True)
        (lib / "__init__.py").write_bytes(self.package_init)
        for rel, data in self.guest.items():
            dest = lib / "guest" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            dest.chmod(0o644)
        agent = root / "opt/aamp/agent"
        agent.write_bytes(self.guest["launcher.py"])
        agent.chmod(0o755)
        try:
            compile_first_stage(self.guest[FIRST_STAGE_SOURCE], root / FIRST_STAGE_INSTALLED_AS)
        except (KeyError, FirstStageBuildError) as exc:
            raise ImageBuildError(f"the guest agent's first stage: {exc}") from None
        workspace = root / "workspace"
        workspace.mkdir(exist_ok=True)
        workspace.chmod(0o777)
        (root / "run/aamp").mkdir(parents=True, exist_ok=True)
        (root / "etc/hostname").write_text("sandbox\n")

    def install_ca(self) -> None:
        assert self.ca is not None
        dest = self.rootfs / BAKED_CA
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(self.ca)
        dest.chmod(0o644)
        run_command(
            [find_tool("chroot"), str(self.rootfs), "update-ca-certificates"],
            label="update-ca-certificates",
            progress=self.progress,
            isolate=True,
        )

    def compile_python(self) -> None:
        dirs = ["/opt/aamp/lib"]
        if (self.rootfs / GUEST_SITE_PACKAGES.lstrip("/")).is_dir():
            dirs.append(GUEST_SITE_PACKAGES)
        compile_guest_python(self.rootfs, dirs, self.progress)

    def record_packages(self) -> None:
        out = capture_command(
            [find_tool("chroot"), str(self.rootfs), "dpkg-query", "-W",
             "-f=${Package}\t${Version}\n"],
            label="dpkg-query",
        )  # fmt: skip
        packages = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
        (self.directory / "packages.json").write_text(json.dumps(packages, sort_keys=True))

    def trim(self) -> None:
        for pattern in _TRIM_GLOBS:
            for path in self.rootfs.glob(pattern):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        # Every sandbox from this image would otherwise share one random machine id.
        for machine_id in ("etc/machine-id", "var/lib/dbus/machine-id"):
            path = self.rootfs / machine_id
            if path.is_file() and not path.is_symlink():
                path.write_text("")
        # No resolver inside: the guest's only way out is the host's egress proxy.
        resolv = self.rootfs / "etc/resolv.conf"
        if resolv.is_symlink() or resolv.exists():
            resolv.unlink()
        resolv.write_text("")
        resolv.chmod(0o644)

    def make_ext4(self) -> None:
        make_ext4(self.rootfs, self.directory / "rootfs.ext4", self.content_hash, self.progress)
