"""The site's wheelhouse packages in a bundle: `scripts/bundle --wheelhouse FILE` takes exact
pins only (naming every other line), downloads them with their dependencies for the guest's
Python into `wheels/wheelhouse/` (hashes in the manifest; a second create reuses them), and
the install adds them to the installation's wheelhouse — each wheel checked against the
manifest as it is copied, so a wheel altered, added or swapped for a link after the first
check, or a manifest edited under a trusted key, is refused naming it, and nothing is added."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic import keypair, make_bundle  # tests/bundle/synthetic.py
from wheel_files import make_wheel  # tests/wheel_files.py

from aamp.bundle import manifest
from aamp.bundle.create import (
    WHEELHOUSE_PART,
    BundleError,
    Creator,
    host_target,
    read_wheelhouse_list,
)
from aamp.bundle.wheelhouse import add_bundled
from aamp.config import Settings
from aamp.sandbox.wheelhouse import Wheelhouse

REPO = Path(__file__).resolve().parents[2]
WHEEL = f"{WHEELHOUSE_PART}/greeting-1.0-py3-none-any.whl"


def test_a_wheelhouse_list_takes_exact_pins_only_naming_each_other_line(tmp_path: Path) -> None:
    listed = tmp_path / "list.txt"
    listed.write_text("# ours\ntabulate==0.9.0  # tables\n\nTabulate==0.9.0\ntabulate==0.9.0\n")
    assert read_wheelhouse_list(listed) == ["tabulate==0.9.0", "Tabulate==0.9.0"]
    listed.write_text(
        "tabulate\nrich>=13\nx @ http://127.0.0.1:9/x.whl\n--index-url=http://127.0.0.1:9\n"
        "ok==1.0\n-r/etc/passwd\n"
    )
    with pytest.raises(BundleError) as err:
        read_wheelhouse_list(listed)
    for line in (1, 2, 3, 4, 6):
        assert f"line {line} " in str(err.value)
    assert "line 5" not in str(err.value)
    listed.write_text("# nothing\n")
    with pytest.raises(BundleError, match="lists no package"):
        read_wheelhouse_list(listed)
    done = subprocess.run(
        [str(REPO / "scripts/bundle"), str(tmp_path / "out"), "--wheelhouse", str(listed)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "lists no package" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()  # refused before anything is made


def test_create_puts_the_listed_wheels_and_their_hashes_in_the_bundle(tmp_path: Path) -> None:
    """A real `pip download` (the host's configured index) for the guest's Python."""
    settings = Settings.from_env({"AAMP_HOME": str(tmp_path / "home"),
                                  "AAMP_DOWNLOAD_CACHE": str(tmp_path / "cache")})  # fmt: skip
    out = tmp_path / "bundle"
    said: list[str] = []
    creator = Creator(out, host_target(), settings, said.append)
    creator.wheelhouse(["tabulate==0.9.0"])
    assert sorted(p.name for p in (out / WHEELHOUSE_PART).iterdir()) == [
        "tabulate-0.9.0-py3-none-any.whl"
    ]
    made = creator.manifest(None, ["tabulate==0.9.0"])
    entry = made["files"][f"{WHEELHOUSE_PART}/tabulate-0.9.0-py3-none-any.whl"]
    assert entry["sha256"] == manifest.sha256_file(
        out / WHEELHOUSE_PART / "tabulate-0.9.0-py3-none-any.whl"
    )
    assert made["wheelhouse"] == ["tabulate==0.9.0"]
    creator.wheelhouse(["tabulate==0.9.0"])  # a second create downloads nothing
    assert any("unchanged since the last create" in line for line in said), said
    creator.wheelhouse([])  # no list: the part is gone, not left over from an earlier create
    assert not (out / WHEELHOUSE_PART).exists()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, tuple[Path, Path]]:
    """The synthetic bundle, with one wheelhouse wheel (and a dependency) in it, and its
    keys; made once, each test tampers with a copy."""
    base = tmp_path_factory.mktemp("pristine")
    keys = keypair(base, "bundle")
    (base / "work").mkdir()
    extra = base / "extra"
    (extra / WHEELHOUSE_PART).mkdir(parents=True)
    make_wheel(extra / WHEELHOUSE_PART, "greeting", "1.0", "HELLO = 'hi'\n", ["words==2.0"])
    make_wheel(extra / WHEELHOUSE_PART, "words", "2.0", "WORDS = ['hi']\n")
    return make_bundle(base / "bundle", base / "work", key=keys[0], extra=extra), keys


def test_install_adds_the_bundled_wheels_to_the_wheelhouse(
    bundle: Path, keys, settings: Settings
) -> None:
    assert not settings.home.exists()
    added = add_bundled(bundle, settings, trust=keys[1])
    assert settings.home.stat().st_mode & 0o777 == 0o700  # made as `aamp up` makes it
    files = json.loads((bundle / manifest.MANIFEST).read_text())["files"]
    kept = {w.filename: w for w in Wheelhouse(settings).list()}
    assert sorted(kept) == ["greeting-1.0-py3-none-any.whl", "words-2.0-py3-none-any.whl"]
    for wheel in added:
        assert wheel.sha256 == files[f"{WHEELHOUSE_PART}/{wheel.filename}"]["sha256"]
        assert kept[wheel.filename].added_by.startswith("scripts/install --bundle")
        assert manifest.sha256_file(Wheelhouse(settings).path(wheel)) == wheel.sha256
    # A policy can now name them (pinned resolves both from the wheelhouse).
    assert len(Wheelhouse(settings).pinned(["greeting==1.0", "words==2.0"])) == 2
    # The same bundle again (an upgrade's install): nothing changes.
    before = (settings.home / "wheelhouse/index.json").read_text()
    add_bundled(bundle, settings, trust=keys[1])
    assert (settings.home / "wheelhouse/index.json").read_text() == before


def _refused(bundle: Path, settings: Settings, trust: Path | None = None) -> str:
    with pytest.raises(manifest.BundleRefused) as err:
        add_bundled(bundle, settings, trust=trust)
    assert Wheelhouse(settings).list() == []
    assert not (settings.home / "wheelhouse").exists() or not any(
        p.suffix == ".whl" for p in (settings.home / "wheelhouse").iterdir()
    )
    return str(err.value)


def test_a_wheel_altered_after_the_first_check_is_refused_and_nothing_added(
    bundle: Path, keys, settings: Settings
) -> None:
    path = bundle / WHEEL
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size, other bytes
    path.write_bytes(bytes(data))
    assert f"{WHEEL}: altered" in _refused(bundle, settings, trust=keys[1])


def test_a_wheel_added_missing_or_linked_is_refused(bundle: Path, settings: Settings) -> None:
    stray = bundle / WHEELHOUSE_PART / "evil-9.9-py3-none-any.whl"
    stray.write_bytes((bundle / WHEEL).read_bytes())
    assert f"{WHEELHOUSE_PART}/evil-9.9-py3-none-any.whl: not in the manifest" in _refused(
        bundle, settings
    )
    stray.unlink()
    outside = bundle.parent / "outside.whl"
    (bundle / WHEEL).rename(outside)
    assert f"{WHEEL}: missing" in _refused(bundle, settings)
    (bundle / WHEEL).symlink_to(outside)
    assert f"{WHEEL}: not a plain file" in _refused(bundle, settings)


def test_an_edited_manifest_is_refused_under_a_trusted_key(
    bundle: Path, keys, settings: Settings
) -> None:
    path = bundle / manifest.MANIFEST
    doc = json.loads(path.read_text())
    evil = bundle / WHEEL
    evil.write_bytes(evil.read_bytes() + b"\0")  # swapped, and its entry "fixed" to match
    doc["files"][WHEEL] = {"size": evil.stat().st_size, "sha256": manifest.sha256_file(evil)}
    path.write_text(json.dumps(doc))
    assert "manifest.json: its signature does not verify" in _refused(
        bundle, settings, trust=keys[1]
    )


def test_the_install_step_reports_a_refusal_and_adds_nothing(
    bundle: Path, keys, settings: Settings
) -> None:
    (bundle / WHEEL).write_bytes(b"not the wheel")
    done = subprocess.run(
        [sys.executable, "-m", "aamp.bundle.wheelhouse", str(bundle), "--trust", str(keys[1])],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "src"),
             "AAMP_HOME": str(settings.home)},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{WHEEL}: altered" in done.stderr
    assert "no wheel was added to the wheelhouse" in done.stderr
    assert Wheelhouse(settings).list() == []
