"""A bundle is verified before anything uses it: one changed byte, a missing or added file, an
edited manifest, or a bad or missing signature is refused, naming the file, and changes
nothing — also through `scripts/install --bundle`, before anything is installed."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from synthetic import keypair, make_bundle  # tests/bundle/synthetic.py

from aamp.bundle import manifest
from aamp.bundle.manifest import BundleRefused, verify
from aamp.bundle.verify import SEEN, offline_status
from aamp.config import Settings

REPO = Path(__file__).resolve().parents[2]


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under root with its SHA-256 and mtime: what 'changes nothing' compares."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root))] = (
                hashlib.sha256(path.read_bytes()).hexdigest(),
                path.stat().st_mtime_ns,
            )
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, tuple[Path, Path]]:
    """One signed synthetic bundle and its keys, made once; each test tampers with a copy."""
    base = tmp_path_factory.mktemp("pristine")
    keys = keypair(base, "bundle")
    (base / "work").mkdir()
    return make_bundle(base / "bundle", base / "work", key=keys[0]), keys


def refused(root: Path, trust: Path | None = None) -> str:
    before = snapshot(root)
    with pytest.raises(BundleRefused) as err:
        verify(root, trust=trust)
    assert snapshot(root) == before
    return str(err.value)


def test_an_intact_signed_bundle_verifies(bundle: Path, keys: tuple[Path, Path]) -> None:
    made = verify(bundle, trust=keys[1])
    assert "debian/dists/host/main/binary-amd64/Packages" in made["files"]
    assert "debian/pool/aamp-test-one_1.0_all.deb" in made["files"]
    index = (bundle / "debian/dists/host/main/binary-amd64/Packages").read_text()
    assert "Package: aamp-test-two" in index and "SHA256: " in index
    # debootstrap takes a stanza as complete at its blank line, the last one too.
    assert index.endswith("\n\n") and index.count("\n\nPackage: ") == 1
    guest = (bundle / "debian/dists/bookworm/main/binary-amd64/Packages").read_text()
    assert "aamp-test-two" not in guest


def test_one_changed_byte_in_a_deb_is_refused_naming_it(bundle: Path, keys) -> None:
    deb = bundle / "debian/pool/aamp-test-two_1.0_all.deb"
    data = bytearray(deb.read_bytes())
    data[len(data) // 2] ^= 0x01
    deb.write_bytes(bytes(data))
    message = refused(bundle, trust=keys[1])
    assert "debian/pool/aamp-test-two_1.0_all.deb: altered (SHA-256" in message
    assert "aamp-test-one" not in message


def test_a_missing_wheel_is_refused_naming_it(bundle: Path, keys) -> None:
    (bundle / "wheels/host/tiny_two-1.0-py3-none-any.whl").unlink()
    assert "wheels/host/tiny_two-1.0-py3-none-any.whl: missing" in refused(bundle, trust=keys[1])


def test_an_added_wheel_is_refused_naming_it(bundle: Path) -> None:
    # pip --find-links would pick up any wheel in the directory, so a stray one is refused.
    shutil.copy(
        bundle / "wheels/host/tiny_one-1.0-py3-none-any.whl",
        bundle / "wheels/host/evil-9.9-py3-none-any.whl",
    )
    assert "wheels/host/evil-9.9-py3-none-any.whl: not in the manifest" in refused(bundle)


def test_a_link_in_place_of_a_file_is_refused(bundle: Path) -> None:
    wheel = bundle / "wheels/host/tiny_one-1.0-py3-none-any.whl"
    moved = bundle.parent / "outside.whl"
    wheel.rename(moved)
    wheel.symlink_to(moved)
    assert "wheels/host/tiny_one-1.0-py3-none-any.whl: not a plain file" in refused(bundle)


def test_an_edited_manifest_is_refused(bundle: Path, keys) -> None:
    path = bundle / manifest.MANIFEST
    doc = json.loads(path.read_text())
    # Someone replaced a .deb and "fixed" its entry to match.
    doc["files"]["debian/pool/aamp-test-one_1.0_all.deb"]["sha256"] = "0" * 64
    path.write_text(json.dumps(doc))
    # Unsigned checking still names the file whose bytes no longer match the entry ...
    assert "debian/pool/aamp-test-one_1.0_all.deb: altered" in refused(bundle)
    # ... and with the trusted key the edit itself is caught, before any file is read.
    message = refused(bundle, trust=keys[1])
    assert "manifest.json: its signature does not verify" in message


def test_a_signature_by_another_key_is_refused(bundle: Path, tmp_path: Path) -> None:
    other_key, other_pub = keypair(tmp_path, "other")
    assert "manifest.json: its signature does not verify" in refused(bundle, trust=other_pub)
    manifest.sign(bundle, other_key)  # re-signed by someone else: still not the trusted key
    verify(bundle, trust=other_pub)


def test_an_unsigned_bundle_is_refused_when_a_key_is_trusted(bundle: Path, keys) -> None:
    (bundle / manifest.SIGNATURE).unlink()
    verify(bundle)  # without --trust an unsigned bundle is only integrity-checked
    assert "manifest.json.sig: missing" in refused(bundle, trust=keys[1])


def test_a_manifest_naming_a_path_outside_the_bundle_is_refused(bundle: Path) -> None:
    path = bundle / manifest.MANIFEST
    doc = json.loads(path.read_text())
    doc["files"]["../outside"] = {"size": 1, "sha256": "0" * 64}
    path.write_text(json.dumps(doc))
    assert "names a path outside the bundle: '../outside'" in refused(bundle)


def test_no_manifest_is_refused(bundle: Path) -> None:
    (bundle / manifest.MANIFEST).unlink()
    assert "manifest.json: missing" in refused(bundle)


def _install_copy(tmp_path: Path) -> Path:
    """scripts/install's working copy: the worktree's files (not ignored ones), elsewhere."""
    files = (
        subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    clone = tmp_path / "clone"
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, clone / rel)
    return clone


@pytest.mark.skipif(os.geteuid() != 0, reason="scripts/install runs as root")
def test_install_refuses_a_tampered_bundle_before_installing_anything(
    bundle: Path, keys, tmp_path: Path
) -> None:
    clone = _install_copy(tmp_path)
    deb = bundle / "debian/pool/aamp-test-one_1.0_all.deb"
    deb.write_bytes(deb.read_bytes()[:-1] + b"\0")
    before = snapshot(clone)
    # No network in here, so a check that let the install go on could not fetch anything.
    done = subprocess.run(
        ["unshare", "-n", "scripts/install", "--bundle", str(bundle), "--trust", str(keys[1])],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AAMP_HOME": str(tmp_path / "home")},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "debian/pool/aamp-test-one_1.0_all.deb: altered" in done.stderr
    assert "nothing was installed" in done.stderr
    assert "==> Debian packages" not in done.stdout
    assert snapshot(clone) == before
    assert not (clone / ".venv").exists() and not (tmp_path / "home").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="scripts/install runs as root")
def test_install_refuses_a_bundle_for_another_target(tmp_path: Path) -> None:
    clone = _install_copy(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    other = make_bundle(
        tmp_path / "b", work, target={"debian": "bookworm", "arch": "amd64", "python": "2.7"}
    )
    done = subprocess.run(
        ["unshare", "-n", "scripts/install", "--bundle", str(other)],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "the bundle is for another target: python '2.7'" in done.stderr
    assert not (clone / ".venv").exists()


def test_a_check_with_a_record_hashes_only_what_changed_and_still_refuses_it(
    bundle: Path, keys, tmp_path: Path, monkeypatch
) -> None:
    """`aamp doctor`'s shortcut: what an earlier check found intact (device, inode, size,
    mtime, ctime) is not hashed again, but any write to a file moves its ctime, so a changed
    byte is hashed and refused just the same; a record for other manifest bytes is ignored."""
    seen = tmp_path / "seen.json"
    hashed: list[str] = []
    real = manifest.sha256_file
    monkeypatch.setattr(manifest, "sha256_file", lambda p: hashed.append(p.name) or real(p))
    files = len(verify(bundle, trust=keys[1], seen=seen)["files"])
    assert len(hashed) == files and seen.stat().st_mode & 0o777 == 0o600
    hashed.clear()
    verify(bundle, trust=keys[1], seen=seen)
    assert hashed == []
    deb = bundle / "debian/pool/aamp-test-two_1.0_all.deb"
    original = deb.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0x01  # same size; mtime put back as it was
    stat = deb.stat()
    deb.write_bytes(bytes(data))
    os.utime(deb, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    message = refused(bundle, trust=keys[1])  # no record: hashes all
    assert "debian/pool/aamp-test-two_1.0_all.deb: altered (SHA-256" in message
    hashed.clear()
    with pytest.raises(BundleRefused, match=re.escape("aamp-test-two_1.0_all.deb: altered")):
        verify(bundle, trust=keys[1], seen=seen)
    assert hashed == ["aamp-test-two_1.0_all.deb"]
    # The same files under another manifest (re-written): the record does not apply.
    deb.write_bytes(original)
    manifest.write(bundle, {"aamp": {"version": "test"}})
    hashed.clear()
    verify(bundle, seen=seen)
    assert len(hashed) == files


def test_doctor_keeps_its_record_and_still_sees_a_changed_byte(bundle: Path, tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    settings = Settings.from_env({"AAMP_HOME": str(home), "AAMP_BUNDLE": str(bundle)})
    _ok, lines = offline_status(settings, set())
    assert any("files verified" in line for line in lines), lines
    assert (home / SEEN).is_file()
    deb = bundle / "debian/pool/aamp-test-one_1.0_all.deb"
    deb.write_bytes(deb.read_bytes()[:-1] + b"\0")
    ok, lines = offline_status(settings, set())
    assert not ok
    assert any(
        "fails verification: debian/pool/aamp-test-one_1.0_all.deb: altered" in x for x in lines
    )
