"""A small bundle made by the bundle's own code (a real .deb built by dpkg-deb and indexed by
dpkg-scanpackages, wheels, a manifest written and signed by `aamp.bundle.manifest`), for the
fast verification tests. Only the contents are small: every step is the real one."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

from aamp.bundle import debian, manifest
from aamp.bundle.create import host_target


def make_deb(work: Path, name: str, version: str) -> Path:
    tree = work / f"{name}-tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "usr/share" / name).mkdir(parents=True)
    (tree / "usr/share" / name / "hello.txt").write_text(f"{name} {version}\n")
    (tree / "DEBIAN/control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: t <t@t>\n"
        "Priority: optional\nDescription: a test package\n"
    )
    out = work / f"{name}_{version}_all.deb"
    subprocess.run(
        ["dpkg-deb", "--build", "--root-owner-group", str(tree), str(out)],
        check=True,
        capture_output=True,
    )
    return out


def make_wheel(path: Path, name: str) -> Path:
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(f"{name}/__init__.py", "VALUE = 42\n")
        whl.writestr(
            f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
        )
    return path


def keypair(work: Path, name: str) -> tuple[Path, Path]:
    key, pub = work / f"{name}.pem", work / f"{name}.pub.pem"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)],
        check=True,
        capture_output=True,
    )
    return key, pub


def make_bundle(
    root: Path,
    work: Path,
    key: Path | None = None,
    target: dict | None = None,
    extra: Path | None = None,
) -> Path:
    """The bundle at `root`; the files under `extra` (if given) are part of it too."""
    repo = root / "debian"
    pool = repo / "pool"
    pool.mkdir(parents=True)
    packages = []
    for name in ("aamp-test-one", "aamp-test-two"):
        deb = make_deb(work, name, "1.0")
        dest = pool / deb.name
        dest.write_bytes(deb.read_bytes())
        packages.append(
            debian.Package(
                name, "1.0", "all", manifest.sha256_file(dest), dest.stat().st_size, deb.name
            )
        )
    debian.write_indexes(
        repo,
        {debian.HOST_SUITE: packages, debian.GUEST_SUITE: packages[:1]},
        "amd64",
        lambda _m: None,
    )
    (root / "wheels/host").mkdir(parents=True)
    make_wheel(root / "wheels/host/tiny_one-1.0-py3-none-any.whl", "tiny_one")
    make_wheel(root / "wheels/host/tiny_two-1.0-py3-none-any.whl", "tiny_two")
    if extra is not None:
        shutil.copytree(extra, root, dirs_exist_ok=True)
    info = {"aamp": {"version": "test"}, "target": target or host_target().as_dict()}
    manifest.write(root, info)
    if key is not None:
        manifest.sign(root, key)
    return root
