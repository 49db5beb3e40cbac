"""Guest images: real debootstrap builds, the content-hash cache, locking and crash safety.

These build real images (root and the Debian mirror from this host's apt sources are needed).
Downloaded .debs and wheels are kept in /var/cache/aamp-test-cache so repeated runs are fast;
the cache only saves downloads, every build still runs debootstrap from scratch.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import aamp
from aamp.config import Settings
from aamp.sandbox import image_recipes
from aamp.sandbox.debian_mirror import mirror_url
from aamp.sandbox.images import (
    BuiltImage,
    ImageBuildError,
    ImageNotBuilt,
    ImageStore,
    MissingTool,
    UnknownImage,
)

TEST_CACHE = Path("/var/cache/aamp-test-cache")
PACKAGE_GUEST = Path(aamp.__file__).resolve().parent / "guest"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="image builds need root")


class Abort(Exception):
    """Raised from a progress callback to interrupt a build at a chosen point."""


def _settings(image_dir: Path) -> Settings:
    return Settings(
        home=image_dir.parent / "home",
        runtime_dir=image_dir.parent / "run",
        image_dir=image_dir,
        download_cache=TEST_CACHE,
    )


def _guest_copy(dest: Path) -> Path:
    shutil.copytree(PACKAGE_GUEST, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def _mounts_mentioning(text: str) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if text in line]


def _assert_nothing_left(image_dir: Path, name: str) -> None:
    name_dir = image_dir / name
    assert not (name_dir / "current").exists()
    assert [p.name for p in name_dir.iterdir() if p.name != ".lock"] == []
    assert _processes_mentioning(str(image_dir)) == []
    assert _mounts_mentioning(str(image_dir)) == []


class Recorder:
    """Collects progress lines with the time they arrived."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self.start = time.monotonic()

    def __call__(self, line: str) -> None:
        self.lines.append((time.monotonic() - self.start, line))

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


# ----------------------------------------------------------------- without building anything


def test_names_and_unknown_image(tmp_path: Path) -> None:
    store = ImageStore(_settings(tmp_path / "images"))
    assert store.names() == ["base", "browser", "docs", "rag"]
    for bad in ("nope", "../base", "Base", ""):
        with pytest.raises(UnknownImage) as err:
            store.get(bad)
        assert "base" in str(err.value) and "browser" in str(err.value)
        with pytest.raises(UnknownImage):
            store.build(bad, progress=lambda line: None)
    assert not (tmp_path / "images").exists()  # refusing changed nothing


def test_not_built_names_the_command(tmp_path: Path) -> None:
    store = ImageStore(_settings(tmp_path / "images"))
    with pytest.raises(ImageNotBuilt, match=r"aamp image build browser"):
        store.get("browser")
    assert store.list() == []


def test_hash_covers_recipe_guest_files_and_ca(tmp_path: Path) -> None:
    guest = _guest_copy(tmp_path / "guest")
    store = ImageStore(_settings(tmp_path / "images"), guest_dir=guest)
    base = store.content_hash("base")
    assert base == ImageStore(_settings(tmp_path / "other"), guest_dir=guest).content_hash("base")
    assert store.content_hash("browser") != base

    (guest / "README.txt").write_text("not python, not in the image")
    assert store.content_hash("base") == base

    launcher = guest / "launcher.py"
    original = launcher.read_bytes()
    launcher.write_bytes(original + b"\n# changed\n")
    changed = store.content_hash("base")
    assert changed != base
    launcher.write_bytes(original)
    assert store.content_hash("base") == base

    (guest / "extra_module.py").write_text("X = 1\n")
    assert store.content_hash("base") not in (base, changed)
    (guest / "extra_module.py").unlink()

    ca1, ca2 = tmp_path / "ca1.crt", tmp_path / "ca2.crt"
    ca1.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    ca2.write_text("-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n")
    with_ca = store.content_hash("base", ca_cert=ca1)
    assert with_ca != base
    assert store.content_hash("base", ca_cert=ca2) not in (base, with_ca)

    bad = tmp_path / "bad.crt"
    bad.write_text("hello")
    with pytest.raises(ImageBuildError, match="not a PEM certificate"):
        store.build("base", progress=lambda line: None, ca_cert=bad)
    with pytest.raises(ImageBuildError, match="cannot read CA certificate"):
        store.build("base", progress=lambda line: None, ca_cert=tmp_path / "missing.crt")
    assert not (tmp_path / "images" / "base").exists()


def test_recipe_files_are_part_of_the_hash_and_must_stay_in_the_tree(
    tmp_path: Path, monkeypatch
) -> None:
    store = ImageStore(_settings(tmp_path / "images"), guest_dir=_guest_copy(tmp_path / "guest"))
    base, browser = store.content_hash("base"), store.content_hash("browser")
    assert "files" not in image_recipes.resolve("base").fingerprint()  # base keeps its hash
    paths = [path for path, _ in image_recipes.resolve("browser").files]
    assert "etc/chromium/policies/managed/aamp-quiet.json" in paths
    changed = [
        (path, text + "\n# changed\n") for path, text in image_recipes.resolve("browser").files
    ]
    recipes = [
        dataclasses.replace(r, files=tuple(changed)) if r.name == "browser" else r
        for r in image_recipes.RECIPES
    ]
    monkeypatch.setattr(image_recipes, "RECIPES", tuple(recipes))
    assert store.content_hash("browser") not in (browser, base)
    assert store.content_hash("base") == base
    escaping = [
        dataclasses.replace(r, files=(("../etc/passwd", "x"),)) if r.name == "browser" else r
        for r in image_recipes.RECIPES
    ]
    monkeypatch.setattr(image_recipes, "RECIPES", tuple(escaping))
    with pytest.raises(ValueError, match="must stay in the tree"):
        image_recipes.resolve("browser")


def test_guest_dir_without_launcher_is_refused(tmp_path: Path) -> None:
    guest = _guest_copy(tmp_path / "guest")
    (guest / "launcher.py").unlink()
    store = ImageStore(_settings(tmp_path / "images"), guest_dir=guest)
    with pytest.raises(ImageBuildError, match=r"launcher\.py"):
        store.build("base", progress=lambda line: None)
    assert not (tmp_path / "images" / "base").exists()


def test_missing_tool_names_the_debian_package(tmp_path: Path, monkeypatch) -> None:
    # A host without debootstrap (simulated: it is installed here): say what to install.
    real_which = shutil.which
    monkeypatch.setattr(
        shutil,
        "which",
        lambda name, path=None: None if name == "debootstrap" else real_which(name, path=path),
    )
    store = ImageStore(_settings(tmp_path / "images"), guest_dir=_guest_copy(tmp_path / "g"))
    with pytest.raises(MissingTool, match=r"apt-get install debootstrap"):
        store.build("base", progress=lambda line: None)
    assert not (tmp_path / "images").exists()


def test_no_debian_mirror_is_a_clear_build_error(tmp_path: Path, monkeypatch) -> None:
    # A host whose apt has no bookworm source (simulated by an empty apt directory).
    monkeypatch.setattr(
        "aamp.sandbox.image_tree.mirror_url",
        lambda settings, suite: mirror_url(settings, apt_dir=tmp_path / "no-apt", suite=suite),
    )
    store = ImageStore(_settings(tmp_path / "images"), guest_dir=_guest_copy(tmp_path / "g"))
    with pytest.raises(ImageBuildError, match="AAMP_DEBIAN_MIRROR"):
        store.build("base", progress=lambda line: None)
    assert not (tmp_path / "images").exists()


# ----------------------------------------------------------------- interrupted builds


@needs_root
def test_build_waits_for_the_lock_and_an_abort_leaves_nothing(tmp_path: Path) -> None:
    image_dir = tmp_path / "images"
    store = ImageStore(_settings(image_dir), guest_dir=_guest_copy(tmp_path / "guest"))
    (image_dir / "base").mkdir(parents=True)
    holder = os.open(image_dir / "base" / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # "another build" holds the lock

    rec = Recorder()
    outcome: list[BaseException | BuiltImage] = []

    def progress(line: str) -> None:
        rec(line)
        if line.startswith("  I: "):  # debootstrap is running: interrupt it mid-flight
            raise Abort(line)

    def run() -> None:
        try:
            outcome.append(store.build("base", progress=progress))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1.5)
    assert "waiting for another build of 'base'" in rec.text()
    assert "debootstrap" not in rec.text()
    assert list((image_dir / "base").glob(".build-*")) == []
    os.close(holder)  # the other build finishes
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], Abort), outcome
    assert "debootstrap" in rec.text()
    _assert_nothing_left(image_dir, "base")


BUILD_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from aamp.config import Settings
    from aamp.sandbox.images import ImageStore
    image_dir, guest, cache = map(Path, sys.argv[1:4])
    settings = Settings(home=image_dir.parent / "home", runtime_dir=image_dir.parent / "run",
                        image_dir=image_dir, download_cache=cache)
    ImageStore(settings, guest_dir=guest).build(
        "base", progress=lambda line: print(line, flush=True))
    """
)


@pytest.mark.slow
@needs_root
def test_killed_build_leaves_no_image_and_the_next_build_cleans_up(tmp_path: Path) -> None:
    image_dir = tmp_path / "images"
    guest = _guest_copy(tmp_path / "guest")
    proc = subprocess.Popen(
        [sys.executable, "-c", BUILD_SCRIPT, str(image_dir), str(guest), str(TEST_CACHE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(aamp.__file__).resolve().parents[1])},
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "I: Installing core packages" in line or "I: Extracting" in line:
            break
    else:
        pytest.fail("build ended before debootstrap extracted anything:\n" + "".join(seen))
    os.kill(proc.pid, signal.SIGKILL)  # only the Python process: its children must follow
    proc.wait()
    proc.stdout.close()

    deadline = time.monotonic() + 20
    while _processes_mentioning(str(image_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_mentioning(str(image_dir)) == []
    assert _mounts_mentioning(str(image_dir)) == []
    store = ImageStore(_settings(image_dir), guest_dir=guest)
    with pytest.raises(ImageNotBuilt):
        store.get("base")
    assert store.list() == []
    assert len(list((image_dir / "base").glob(".build-*"))) == 1  # the dead build's leftovers

    rec = Recorder()

    def progress(line: str) -> None:
        rec(line)
        if "debootstrap" in line:
            raise Abort(line)

    with pytest.raises(Abort):
        store.build("base", progress=progress)
    assert "removing unfinished build" in rec.text()
    _assert_nothing_left(image_dir, "base")


# ----------------------------------------------------------------- a real base image


@pytest.fixture(scope="module")
def base_build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ImageStore, Path]]:
    if os.geteuid() != 0:
        pytest.skip("image builds need root")
    work = tmp_path_factory.mktemp("base-image")
    guest = _guest_copy(work / "guest")
    store = ImageStore(_settings(work / "images"), guest_dir=guest)
    yield store, work


@pytest.fixture(scope="module")
def base_image(base_build: tuple[ImageStore, Path]) -> tuple[BuiltImage, Recorder]:
    store, _ = base_build
    rec = Recorder()
    image = store.build("base", progress=rec)
    return image, rec


def _chroot(root: Path, *argv: str) -> str:
    return subprocess.run(
        ["chroot", str(root), *argv], capture_output=True, text=True, check=True, timeout=60
    ).stdout


@pytest.mark.slow
def test_base_tree_has_python_agent_and_sandbox_layout(base_image, base_build) -> None:
    image, _ = base_image
    _, work = base_build
    root = image.root
    assert image.name == "base" and len(image.content_hash) == 64
    assert root == image.ext4.parent / "rootfs"
    assert _chroot(root, "/usr/bin/python3", "-c", "print(6*7)") == "42\n"
    assert _chroot(root, "/usr/bin/python3", "--version").startswith("Python 3.11")

    guest = work / "guest"
    for src in guest.rglob("*.py"):
        rel = src.relative_to(guest)
        assert (root / "opt/aamp/lib/aamp/guest" / rel).read_bytes() == src.read_bytes()
    pkg_init = Path(aamp.__file__).read_bytes()
    assert (root / "opt/aamp/lib/aamp/__init__.py").read_bytes() == pkg_init
    agent = root / "opt/aamp/agent"
    assert agent.read_bytes() == (guest / "launcher.py").read_bytes()
    assert agent.stat().st_mode & 0o777 == 0o755
    version = _chroot(
        root, "/usr/bin/python3", "-c",
        "import sys; sys.path.insert(0, '/opt/aamp/lib'); import aamp; print(aamp.__version__)",
    )  # fmt: skip
    assert version.strip() == aamp.__version__

    assert (root / "workspace").is_dir() and list((root / "workspace").iterdir()) == []
    assert (root / "run/aamp").is_dir()
    resolv = root / "etc/resolv.conf"
    assert not resolv.is_symlink() and resolv.read_bytes() == b""
    assert (root / "etc/hostname").read_text() == "sandbox\n"
    assert (root / "etc/ssl/certs/ca-certificates.crt").stat().st_size > 0
    assert not (root / "usr/local/share/ca-certificates/aamp-ca.crt").exists()
    assert list((root / "usr/share/doc").iterdir()) == []
    assert list((root / "usr/share/man").iterdir()) == []
    assert list((root / "var/lib/apt/lists").glob("*")) == []
    assert list((root / "var/cache/apt/archives").glob("*.deb")) == []

    meta = json.loads((image.ext4.parent / "image.json").read_text())
    assert meta["content_hash"] == image.content_hash
    assert meta["size_bytes"] == image.size_bytes
    assert "python3" in meta["debian_packages"]
    assert 50 * 2**20 < image.size_bytes < 400 * 2**20


@pytest.mark.slow
def test_base_ext4_holds_the_same_tree(base_image) -> None:
    image, _ = base_image
    assert image.ext4_bytes == image.ext4.stat().st_size
    assert image.ext4_bytes >= image.size_bytes * 1.3 + 64 * 2**20
    listing = subprocess.run(
        ["debugfs", "-R", "ls -l /opt/aamp", str(image.ext4)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    agent_line = next(line for line in listing.splitlines() if line.split()[-1:] == ["agent"])
    assert "100755" in agent_line
    resolv = subprocess.run(
        ["debugfs", "-R", "stat /etc/resolv.conf", str(image.ext4)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "Size: 0" in resolv
    header = subprocess.run(
        ["dumpe2fs", "-h", str(image.ext4)], capture_output=True, text=True, check=True
    ).stdout
    assert "Filesystem volume name:   aamp-root" in header
    fs_uuid = next(
        line.split()[-1] for line in header.splitlines() if line.startswith("Filesystem UUID")
    )
    # Derived from the content hash, so a rebuild of the same inputs gets the same filesystem id.
    derived = hashlib.sha256(f"{image.content_hash}:fs-uuid".encode()).digest()[:16]
    assert fs_uuid == str(uuid.UUID(bytes=derived))
    check = subprocess.run(["e2fsck", "-fn", str(image.ext4)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.slow
def test_progress_streams_debootstrap_and_is_never_silent(base_image) -> None:
    image, rec = base_image
    text = rec.text()
    assert "  I: Retrieving" in text or "  I: Validating" in text
    assert "I: Base system installed successfully." in text
    assert "[base] debootstrap bookworm (minbase)" in text
    assert "ext4 image: done in" in text
    times = [0.0] + [t for t, _ in rec.lines]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 10, max(gaps)
    assert rec.lines[-1][1].startswith(f"[base] built {image.content_hash[:12]}")


@pytest.mark.slow
def test_get_list_and_cache_hit(base_image, base_build) -> None:
    image, _ = base_image
    store, _ = base_build
    assert store.get("base") == image
    assert store.list() == [image]
    rec = Recorder()
    started = time.monotonic()
    again = store.build("base", progress=rec)
    elapsed = time.monotonic() - started
    assert again == image  # same hash, same built_at: nothing was rebuilt
    assert elapsed < 3, elapsed
    assert "up to date" in rec.text()
    with pytest.raises(ImageNotBuilt, match="aamp image build browser"):
        store.get("browser")


@pytest.mark.slow
def test_changed_guest_and_ca_build_a_new_image(base_image, base_build, tmp_path: Path) -> None:
    image, _ = base_image
    store, work = base_build
    guest = work / "guest"
    (guest / "extra_for_test.py").write_text("MARK = 'rebuilt'\n")
    ca = tmp_path / "ca.crt"
    key = tmp_path / "ca.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=aamp test CA", "-keyout", str(key), "-out", str(ca)],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        rebuilt = store.build("base", progress=lambda line: None, ca_cert=ca)
    finally:
        (guest / "extra_for_test.py").unlink()
    assert rebuilt.content_hash != image.content_hash
    assert store.get("base") == rebuilt
    assert store.list() == [rebuilt]
    assert image.root.is_dir()  # the old image stays for sandboxes still using it
    root = rebuilt.root
    assert (root / "opt/aamp/lib/aamp/guest/extra_for_test.py").read_text() == "MARK = 'rebuilt'\n"
    installed = root / "usr/local/share/ca-certificates/aamp-ca.crt"
    assert installed.read_bytes() == ca.read_bytes()
    body = "".join(ca.read_text().split("\n")[1:-2])
    bundle = (root / "etc/ssl/certs/ca-certificates.crt").read_text().replace("\n", "")
    assert body in bundle
    # Back to the original inputs: the first image is a cache hit again and becomes current.
    assert store.build("base", progress=lambda line: None) == image
    assert store.get("base") == image


@pytest.mark.slow
def test_force_rebuilds_the_same_hash(base_image, base_build) -> None:
    image, _ = base_image
    store, _ = base_build
    rebuilt = store.build("base", progress=lambda line: None, force=True)
    assert rebuilt.content_hash == image.content_hash
    assert rebuilt.built_at > image.built_at
    assert store.get("base") == rebuilt
    name_dir = rebuilt.root.parent.parent
    assert sorted(p.name for p in name_dir.glob(".build-*")) == []


# ----------------------------------------------------------------- the browser image


def _run_in_runsc(root: Path, argv: list[str], work: Path) -> subprocess.CompletedProcess[str]:
    """Run argv in a one-off gVisor sandbox whose read-only root is the image tree."""
    bundle = work / f"bundle-{uuid.uuid4().hex[:8]}"
    bundle.mkdir(parents=True)
    subprocess.run(["runsc", "spec", "--", *argv], cwd=bundle, check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": str(root), "readonly": True}
    config["process"]["env"].append("HOME=/tmp")
    config["mounts"] += [
        {"destination": d, "type": "tmpfs", "source": "tmpfs"} for d in ("/tmp", "/dev/shm")
    ]
    (bundle / "config.json").write_text(json.dumps(config))
    state = work / "runsc-state"
    state.mkdir(exist_ok=True)
    cid = "aamp-imgtest-" + uuid.uuid4().hex[:8]
    runsc = ["runsc", "--root", str(state), "--platform=ptrace", "--network=none"]
    try:
        return subprocess.run(
            [*runsc, "run", "--bundle", str(bundle), cid],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        subprocess.run([*runsc, "delete", "-force", cid], capture_output=True, check=False)


RENDER = """
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    browser = p.chromium.launch(
        executable_path="/usr/bin/chromium",
        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
    )
    page = browser.new_page()
    page.goto("data:text/html,<h1 style='font-family:sans-serif'>Hello from aamp</h1>")
    print(page.inner_text("h1"))
    png = page.screenshot()
    print(len(png), png[:8].hex())
    browser.close()
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("runsc") is None, reason="runsc is not installed")
def test_browser_image_runs_playwright_and_chromium_in_gvisor(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("image builds need root")
    work = tmp_path_factory.mktemp("browser-image")
    store = ImageStore(_settings(work / "images"), guest_dir=_guest_copy(work / "guest"))
    rec = Recorder()
    image = store.build("browser", progress=rec)
    assert "Debian packages chromium" in rec.text()
    assert "Successfully installed greenlet-3.2.5 playwright-1.65.2" in rec.text()
    assert (image.root / "usr/bin/chromium").exists()
    assert not (image.root / "usr/local/lib/python3.11/dist-packages/bin").exists()
    assert (image.root / "etc/resolv.conf").read_bytes() == b""
    assert (image.root / "opt/aamp/agent").stat().st_mode & 0o777 == 0o755

    started = time.monotonic()
    assert store.build("browser", progress=lambda line: None) == image
    assert time.monotonic() - started < 3

    version = _run_in_runsc(
        image.root,
        ["python3", "-c", "import importlib.metadata as m; print(m.version('playwright'))"],
        work,
    )
    assert (version.returncode, version.stdout) == (0, "1.65.2\n"), version.stderr
    chromium = _run_in_runsc(image.root, ["chromium", "--version"], work)
    assert chromium.returncode == 0, chromium.stderr
    assert chromium.stdout.startswith("Chromium ")
    render = _run_in_runsc(image.root, ["python3", "-c", RENDER], work)
    assert render.returncode == 0, render.stdout + render.stderr
    heading, shot = render.stdout.splitlines()[-2:]
    assert heading == "Hello from aamp"
    size, magic = shot.split()
    assert magic == "89504e470d0a1a0a" and int(size) > 1000  # a PNG with something drawn
