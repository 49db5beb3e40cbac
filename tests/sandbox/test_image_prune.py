"""`ImageStore.prune`, the image use lock, `build --force`'s swap and `aamp image prune`.

Building an image takes a minute or more, so the structure tests lay out fixture image
directories exactly as `ImageStore.build` leaves them (rootfs/, rootfs.ext4, image.json as
`_write_metadata` writes it, `current` link). The last test runs a real gVisor sandbox from a
hard-linked copy of the session's base image in a private image directory (the shared one is
never pruned here) and proves its image survives a prune until the sandbox is gone.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from aamp.cli import main
from aamp.config import Settings
from aamp.sandbox.images import (
    USE_LOCK,
    BuiltImage,
    ImageStore,
    ImageUnavailable,
    Pruned,
    hold_image,
    hold_image_async,
)


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(
        {
            "AAMP_HOME": str(tmp_path / "home"),
            "AAMP_IMAGE_DIR": str(tmp_path / "images"),
            "AAMP_RUNTIME_DIR": f"/run/aamp-t{secrets.token_hex(4)}",
        }
    )


def _hash(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


def fixture_image_for_tests(image_dir: Path, name: str, label: str, *, kib: int = 64) -> Path:
    """An image directory laid out as `ImageStore.build` leaves one, with `kib` KiB of real
    (non-sparse) data in its tree and ext4 so sizes are measurable."""
    content_hash = _hash(label)
    directory = image_dir / name / content_hash
    (directory / "rootfs" / "etc").mkdir(parents=True)
    (image_dir / name / ".lock").touch()  # every build leaves its name's lock file
    (directory / "rootfs" / "etc" / "label").write_bytes(os.urandom(kib * 1024))
    (directory / "rootfs.ext4").write_bytes(os.urandom(kib * 1024))
    (directory / USE_LOCK).touch()
    meta = {
        "name": name,
        "description": "fixture image for tests",
        "content_hash": content_hash,
        "builder_format": 0,
        "recipe": {},
        "size_bytes": kib * 1024,
        "ext4_bytes": kib * 1024,
        "built_at": datetime.now(UTC).isoformat(),
        "build_seconds": 0.0,
        "debian_packages": [],
    }
    (directory / "image.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return directory


def _point_current(image_dir: Path, name: str, content_hash: str) -> None:
    link = image_dir / name / "current"
    tmp = link.with_name(f".current-{secrets.token_hex(4)}")
    os.symlink(content_hash, tmp)
    os.replace(tmp, link)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)

    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(_settings(tmp_path))


@pytest.fixture
def image_dir(store: ImageStore, tmp_path: Path) -> Path:
    return tmp_path / "images"


# ----------------------------------------------------------------- what prune removes


def test_prune_removes_every_non_current_image_and_leftovers(store, image_dir) -> None:
    old1 = fixture_image_for_tests(image_dir, "base", "base-old-1", kib=128)
    old2 = fixture_image_for_tests(image_dir, "base", "base-old-2")
    cur = fixture_image_for_tests(image_dir, "base", "base-cur")
    b_old = fixture_image_for_tests(image_dir, "browser", "browser-old", kib=256)
    b_cur = fixture_image_for_tests(image_dir, "browser", "browser-cur")
    _point_current(image_dir, "base", cur.name)
    _point_current(image_dir, "browser", b_cur.name)
    dead_build = image_dir / "base" / ".build-0123456789ab-deadbeef"
    (dead_build / "rootfs" / "usr").mkdir(parents=True)
    (dead_build / "rootfs" / "usr" / "x").write_bytes(os.urandom(8192))
    dead_prune = image_dir / "browser" / f".prune-{_hash('gone')[:40]}-0badf00d"
    dead_prune.mkdir()
    os.symlink(cur.name, image_dir / "base" / ".current-half")
    (image_dir / "notes.txt").write_text("not an image")
    before = _tree(image_dir)
    listed = store.list()

    rec = Lines()
    planned = store.prune(dry_run=True, progress=rec)
    assert _tree(image_dir) == before  # a dry run changes nothing
    assert "would remove" in rec.text()

    pruned = store.prune(dry_run=False, progress=Lines())
    assert sorted(pruned) == sorted(planned)
    assert {(p.name, p.content_hash) for p in pruned} == {
        ("base", old1.name),
        ("base", old2.name),
        ("base", dead_build.name),
        ("browser", b_old.name),
        ("browser", dead_prune.name),
    }
    sizes = {p.content_hash: p.size_bytes for p in pruned}
    assert sizes[old1.name] >= 2 * 128 * 1024  # tree + ext4, as allocated on disk
    assert sizes[b_old.name] >= 2 * 256 * 1024
    assert sizes[old1.name] > sizes[old2.name]
    assert all(isinstance(p, Pruned) for p in pruned)

    assert sorted(p.name for p in (image_dir / "base").iterdir()) == sorted(
        [".lock", cur.name, "current"]
    )
    assert sorted(p.name for p in (image_dir / "browser").iterdir()) == sorted(
        [".lock", b_cur.name, "current"]
    )
    assert (image_dir / "notes.txt").read_text() == "not an image"
    assert store.list() == listed
    assert store.get("base").root == cur / "rootfs"
    assert store.prune(dry_run=False, progress=Lines()) == []  # nothing left to do


def test_a_name_without_a_current_image_is_left_alone(store, image_dir) -> None:
    only = fixture_image_for_tests(image_dir, "base", "orphan")
    rec = Lines()
    assert store.prune(dry_run=False, progress=rec) == []
    assert only.is_dir()
    assert "no current image" in rec.text()


def test_prune_of_an_empty_or_missing_image_dir_is_a_no_op(store, image_dir) -> None:
    assert not image_dir.exists()
    assert store.prune(dry_run=False, progress=Lines()) == []
    assert not image_dir.exists()


# ----------------------------------------------------------------- images in use


def test_a_held_image_is_kept_until_its_last_holder_lets_go(store, image_dir) -> None:
    old = fixture_image_for_tests(image_dir, "base", "old")
    cur = fixture_image_for_tests(image_dir, "base", "cur")
    _point_current(image_dir, "base", cur.name)
    first, second = hold_image(old), hold_image(old)  # two sandboxes, one process

    rec = Lines()
    assert store.prune(dry_run=True, progress=rec) == []
    assert store.prune(dry_run=False, progress=rec) == []
    assert old.is_dir()
    assert f"keeping old image {old.name[:12]}: a running sandbox uses it" in rec.text()

    first.release()
    first.release()  # idempotent
    assert store.prune(dry_run=False, progress=Lines()) == []
    assert old.is_dir()

    second.release()
    assert [p.content_hash for p in store.prune(dry_run=True, progress=Lines())] == [old.name]
    assert old.is_dir()
    assert [p.content_hash for p in store.prune(dry_run=False, progress=Lines())] == [old.name]
    assert not old.exists()
    assert cur.is_dir()


def test_a_held_image_in_another_process_is_kept(store, image_dir) -> None:
    old = fixture_image_for_tests(image_dir, "base", "old")
    cur = fixture_image_for_tests(image_dir, "base", "cur")
    _point_current(image_dir, "base", cur.name)
    holder = subprocess.Popen(
        [
            "python3",
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
            "fcntl.flock(fd, fcntl.LOCK_SH); print('held', flush=True); sys.stdin.read()",
            str(old / USE_LOCK),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert store.prune(dry_run=False, progress=Lines()) == []
        assert old.is_dir()
    finally:
        holder.communicate("", timeout=10)
    assert [p.content_hash for p in store.prune(dry_run=False, progress=Lines())] == [old.name]


def test_holding_a_pruned_image_fails_clearly(store, image_dir) -> None:
    old = fixture_image_for_tests(image_dir, "base", "old")
    cur = fixture_image_for_tests(image_dir, "base", "cur")
    _point_current(image_dir, "base", cur.name)
    store.prune(dry_run=False, progress=Lines())
    with pytest.raises(ImageUnavailable, match="no longer exists"):
        hold_image(old)


async def test_holding_from_the_event_loop_waits_off_it_while_prune_holds_the_lock(
    image_dir,
) -> None:
    """A create's hold: at once when the image is free; while prune (or a rebuild) holds the
    lock exclusively it waits in a thread, the event loop running on, and holds it after."""
    old = fixture_image_for_tests(image_dir, "base", "old")
    free = await hold_image_async(old)
    free.release()

    fd = os.open(old / USE_LOCK, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    holding = asyncio.create_task(hold_image_async(old))
    ticks = 0
    for _ in range(20):  # 0.2 s of the loop's own work while the hold waits
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks == 20 and not holding.done()
    os.close(fd)
    use = await asyncio.wait_for(holding, 10)
    probe = os.open(old / USE_LOCK, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):  # the sandbox's hold is real: prune cannot
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        use.release()
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(probe)


def test_a_sandbox_starting_while_its_image_is_renamed_away_is_refused(image_dir) -> None:
    """The prune side of the race: exclusive lock held, directory renamed, lock released. A
    holder that opened the lock file before the rename must notice and not claim the image."""
    old = fixture_image_for_tests(image_dir, "base", "old")
    fd = os.open(old / USE_LOCK, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    outcome: list[object] = []

    def start() -> None:
        try:
            outcome.append(hold_image(old))
        except ImageUnavailable as exc:
            outcome.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive()  # waiting for the exclusive lock
    old.rename(old.with_name(".prune-x"))
    os.close(fd)
    thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], ImageUnavailable), outcome


def test_prune_waits_for_a_build_of_the_same_name(store, image_dir) -> None:
    old = fixture_image_for_tests(image_dir, "base", "old")
    cur = fixture_image_for_tests(image_dir, "base", "cur")
    _point_current(image_dir, "base", cur.name)
    build_lock = os.open(image_dir / "base" / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(build_lock, fcntl.LOCK_EX)  # as ImageStore.build holds it
    rec = Lines()
    result: list[list[Pruned]] = []

    def prune() -> None:
        result.append(store.prune(dry_run=False, progress=rec))

    thread = threading.Thread(target=prune)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and old.is_dir()
    assert "waiting for another build of 'base'" in rec.text()
    os.close(build_lock)
    thread.join(10)
    assert [p.content_hash for p in result[0]] == [old.name]


# ----------------------------------------------------------------- build --force's swap


def _finished_build(image_dir: Path, name: str, content_hash: str) -> Path:
    """A completed build directory waiting to be renamed into place, as `build` has it."""
    tmp = image_dir / name / f".build-{content_hash[:12]}-{secrets.token_hex(4)}"
    made = fixture_image_for_tests(image_dir, name, "scratch")
    made.rename(tmp)
    (tmp / "rootfs" / "etc" / "label").write_text("rebuilt")
    return tmp


def test_force_swap_deletes_the_old_tree_when_unused(store, image_dir) -> None:
    final = fixture_image_for_tests(image_dir, "base", "same")
    tmp = _finished_build(image_dir, "base", final.name)
    store._swap_in("base", tmp, final, Lines())
    assert (final / "rootfs" / "etc" / "label").read_text() == "rebuilt"
    assert sorted(p.name for p in (image_dir / "base").iterdir()) == [".lock", final.name]


def test_the_current_image_is_read_again_after_a_rebuild_and_gone_once_removed(
    store, image_dir
) -> None:
    """`get` (asked at every sandbox create) knows an image it read by its manifest, so it
    still sees a forced rebuild in the same directory and a tree taken away at once."""
    final = fixture_image_for_tests(image_dir, "base", "same")
    _point_current(image_dir, "base", final.name)
    first = store.get("base")
    assert store.get("base") == first
    tmp = _finished_build(image_dir, "base", final.name)
    meta = json.loads((tmp / "image.json").read_text())
    meta["built_at"] = datetime(2100, 1, 1, tzinfo=UTC).isoformat()
    (tmp / "image.json").write_text(json.dumps(meta))
    store._swap_in("base", tmp, final, Lines())
    rebuilt = store.get("base")
    assert rebuilt.content_hash == first.content_hash
    assert rebuilt.built_at == datetime(2100, 1, 1, tzinfo=UTC) != first.built_at
    shutil.rmtree(final / "rootfs")
    with pytest.raises(LookupError, match="not been built"):
        store.get("base")


def test_force_swap_keeps_the_old_tree_while_a_sandbox_uses_it(store, image_dir) -> None:
    final = fixture_image_for_tests(image_dir, "base", "same")
    _point_current(image_dir, "base", final.name)
    old_label = (final / "rootfs" / "etc" / "label").read_bytes()
    use = hold_image(final)
    tmp = _finished_build(image_dir, "base", final.name)
    rec = Lines()
    store._swap_in("base", tmp, final, rec)
    assert (final / "rootfs" / "etc" / "label").read_text() == "rebuilt"
    retired = [p for p in (image_dir / "base").iterdir() if p.name.startswith(".retired-")]
    assert len(retired) == 1
    assert (retired[0] / "rootfs" / "etc" / "label").read_bytes() == old_label
    assert "a running sandbox still uses the previous build" in rec.text()

    assert store.prune(dry_run=False, progress=Lines()) == []  # still held
    assert retired[0].is_dir()
    use.release()
    pruned = store.prune(dry_run=False, progress=Lines())
    assert [p.content_hash for p in pruned] == [retired[0].name]
    assert not retired[0].exists() and final.is_dir()
    hold_image(final).release()  # the new tree is usable


# ----------------------------------------------------------------- the command


def test_cli_prune_prints_what_it_removed_and_the_total(
    tmp_path, image_dir, monkeypatch, capsys
) -> None:
    old = fixture_image_for_tests(image_dir, "base", "old", kib=1024)
    cur = fixture_image_for_tests(image_dir, "base", "cur")
    _point_current(image_dir, "base", cur.name)
    for key, value in {
        "AAMP_HOME": str(tmp_path / "home"),
        "AAMP_IMAGE_DIR": str(image_dir),
        "AAMP_RUNTIME_DIR": f"/run/aamp-t{secrets.token_hex(4)}",
    }.items():
        monkeypatch.setenv(key, value)

    assert main(["image", "prune", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"base  {old.name[:16]}" in out
    assert "1 would be removed, freeing 2.0MiB (dry run: nothing changed)" in out
    assert old.is_dir()

    assert main(["image", "prune"]) == 0
    captured = capsys.readouterr()
    assert f"base  {old.name[:16]}  2.0MiB" in captured.out
    assert "1 removed, freed 2.0MiB" in captured.out
    assert f"removing old image {old.name[:12]}" in captured.err
    assert not old.exists() and cur.is_dir()

    assert main(["image", "prune"]) == 0
    assert "0 removed, freed 0B" in capsys.readouterr().out


def test_cli_prune_rejects_unknown_arguments(tmp_path, image_dir, monkeypatch, capsys) -> None:
    old = fixture_image_for_tests(image_dir, "base", "old")
    cur = fixture_image_for_tests(image_dir, "base", "cur")
    _point_current(image_dir, "base", cur.name)
    monkeypatch.setenv("AAMP_IMAGE_DIR", str(image_dir))
    monkeypatch.setenv("AAMP_HOME", str(tmp_path / "home"))
    with pytest.raises(SystemExit) as exit_info:
        main(["image", "prune", "--dryrun"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --dryrun" in capsys.readouterr().err
    assert old.is_dir()


# ----------------------------------------------------------------- a real gVisor sandbox


def _linked_copy(src: Path, dest: Path) -> None:
    """A copy of a built image directory that shares the big files by hard link (so it costs
    no disk and no time) but has its own use lock and metadata: removing it, or locking it,
    never touches the shared image."""
    dest.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(src / "rootfs"), str(dest / "rootfs")], check=True)
    os.link(src / "rootfs.ext4", dest / "rootfs.ext4")
    shutil.copy2(src / "image.json", dest / "image.json")


async def test_an_image_a_live_gvisor_sandbox_uses_survives_prune(base_image, tmp_path) -> None:
    from aamp.sandbox.gvisor import GVisorDriver
    from aamp.sandbox.manager import CreateRequest, SandboxManager

    shared: BuiltImage = base_image
    settings = _settings(tmp_path)
    image_dir = settings.image_dir
    in_use = image_dir / "base" / shared.content_hash
    _linked_copy(shared.root.parent, in_use)
    _point_current(image_dir, "base", shared.content_hash)
    store = ImageStore(settings)
    assert store.get("base").root == in_use / "rootfs"

    manager = SandboxManager(
        settings, store, {"gvisor": GVisorDriver(settings.runtime_dir)}, "gvisor"
    )
    await manager.start()
    try:
        sb = await manager.create(CreateRequest(image="base"))
        # A rebuild makes a new current image; the sandbox still runs from the old one.
        newer = fixture_image_for_tests(image_dir, "base", "rebuilt")
        _point_current(image_dir, "base", newer.name)

        rec = Lines()
        assert await asyncio.to_thread(store.prune, dry_run=False, progress=rec) == []
        assert "a running sandbox uses it" in rec.text()
        assert (in_use / "rootfs" / "usr" / "bin").is_dir()
        async with manager.use(sb.id) as channel:
            result, out, _ = await channel.run(["python3", "-c", "print(6*7)"])
        assert out.strip() == b"42", (result, out)

        await manager.destroy(sb.id)
        pruned = await asyncio.to_thread(store.prune, dry_run=False, progress=Lines())
        assert [(p.name, p.content_hash) for p in pruned] == [("base", shared.content_hash)]
        assert pruned[0].size_bytes > 0
        assert not in_use.exists()
        assert store.get("base").content_hash == newer.name
    finally:
        await manager.shutdown()
        shutil.rmtree(settings.runtime_dir, ignore_errors=True)
    # The shared image the copy was linked from is untouched.
    assert (shared.root / "usr" / "bin" / "python3").exists()
    assert shared.ext4.stat().st_size == shared.ext4_bytes
