"""The bundle's manifest: every file with its size and SHA-256, written, signed and verified.

A bundle is a directory. `manifest.json` at its top lists every other file (relative path,
size, SHA-256) with the aamp version and commit, the target and the date; `manifest.json.sig`,
when the bundle was made with `--sign KEY`, is an Ed25519 signature over the manifest's exact
bytes (made and checked with `openssl pkeyutl`, so a machine with nothing installed yet can
check it). `verify` is the one check every consumer runs before it uses a byte of a bundle:
it reads only, and refuses — naming each file — a file missing, changed, added or not a plain
file, a manifest that is not one, and an unsigned or badly signed manifest when a trusted key
is given. Standard library only (it runs before the venv exists).

    write(bundle_dir, info)                       # after every part is in place
    sign(bundle_dir, Path("bundle-key.pem"))      # optional
    verify(bundle_dir, trust=Path("bundle.pub"))  # raises BundleRefused naming the files
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from aamp.sandbox import sha256_file

MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.sig"
FORMAT = "aamp-bundle/1"
# Problems named in one refusal; a bundle with more is refused just the same.
MAX_NAMED = 20

Progress = Callable[[str], None]


class BundleRefused(RuntimeError):
    """The bundle fails verification; the message names the files and what is wrong."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        shown = problems[:MAX_NAMED]
        more = len(problems) - len(shown)
        text = "bundle refused:\n" + "\n".join(f"  {p}" for p in shown)
        if more:
            text += f"\n  ... and {more} more"
        super().__init__(text)


def bundle_files(root: Path) -> Iterator[str]:
    """Every entry under `root` but the manifest and its signature, as relative POSIX paths,
    sorted; directories are walked, anything else (a file, a link, a device) is yielded."""
    for directory, subdirs, files in os.walk(root):
        subdirs.sort()
        rel_dir = Path(directory).relative_to(root)
        for name in sorted(files + [d for d in subdirs if (Path(directory) / d).is_symlink()]):
            rel = (rel_dir / name).as_posix()
            if rel not in (MANIFEST, SIGNATURE):
                yield rel


def write(root: Path, info: dict[str, object], progress: Progress | None = None) -> dict:
    """Hash every file under `root` and write `manifest.json`; return the manifest.

    A previous signature is removed: it signed another manifest."""
    say = progress or (lambda _m: None)
    files: dict[str, dict[str, object]] = {}
    for rel in bundle_files(root):
        path = root / rel
        if path.is_symlink() or not path.is_file():
            raise ValueError(f"{rel}: a bundle holds plain files only")
        files[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    say(f"manifest: {len(files)} files hashed")
    manifest = {"format": FORMAT, **info, "files": files}
    (root / SIGNATURE).unlink(missing_ok=True)
    tmp = root / (MANIFEST + ".partial")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.replace(root / MANIFEST)
    return manifest


def _pkeyutl(*args: str) -> subprocess.CompletedProcess[str]:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is needed to sign or check a bundle's signature; install it")
    return subprocess.run(
        [openssl, "pkeyutl", "-rawin", *args], capture_output=True, text=True, check=False
    )


def sign(root: Path, key: Path) -> None:
    """Sign `manifest.json` with the Ed25519 private key `key` (PEM) into manifest.json.sig."""
    done = _pkeyutl(
        "-sign", "-inkey", str(key), "-in", str(root / MANIFEST), "-out", str(root / SIGNATURE)
    )
    if done.returncode != 0:
        (root / SIGNATURE).unlink(missing_ok=True)
        raise RuntimeError(f"cannot sign with {key}: {done.stderr.strip()[-300:]}")


def _check_signature(root: Path, trust: Path) -> list[str]:
    if not (root / SIGNATURE).is_file():
        return [
            f"{SIGNATURE}: missing, but a trusted key was given ({trust}): the bundle is unsigned"
        ]
    if not trust.is_file():
        return [f"{trust}: the trusted public key is not a readable file"]
    done = _pkeyutl(
        "-verify", "-pubin", "-inkey", str(trust),
        "-in", str(root / MANIFEST), "-sigfile", str(root / SIGNATURE),
    )  # fmt: skip
    if done.returncode != 0:
        return [
            f"{MANIFEST}: its signature does not verify with {trust} "
            "(edited, or signed by another key)"
        ]
    return []


def _safe_relative(rel: object) -> bool:
    if not isinstance(rel, str) or not rel or "\\" in rel or "\0" in rel:
        return False
    path = PurePosixPath(rel)
    return not path.is_absolute() and ".." not in path.parts and path.as_posix() == rel


def load(root: Path) -> dict:
    """The manifest's JSON, or BundleRefused saying why it is not a manifest."""
    path = root / MANIFEST
    if not path.is_file() or path.is_symlink():
        raise BundleRefused([f"{MANIFEST}: missing in {root} (is this a bundle directory?)"])
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleRefused([f"{MANIFEST}: not JSON ({exc})"]) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleRefused([f"{MANIFEST}: not an {FORMAT} manifest"])
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise BundleRefused([f"{MANIFEST}: has no file list"])
    for rel, entry in files.items():
        if not _safe_relative(rel) or rel in (MANIFEST, SIGNATURE):
            raise BundleRefused([f"{MANIFEST}: names a path outside the bundle: {rel!r}"])
        ok = (
            isinstance(entry, dict)
            and type(entry.get("size")) is int
            and isinstance(entry.get("sha256"), str)
            and len(entry["sha256"]) == 64
        )
        if not ok:
            raise BundleRefused([f"{MANIFEST}: the entry for {rel} has no size and SHA-256"])
    return manifest


def _identity(path: Path) -> list[int]:
    """What changes whenever a file's bytes do: any write moves its ctime, which no one but
    the clock sets."""
    st = path.lstat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _read_seen(seen: Path, root: Path, digest: str) -> dict[str, list[int]]:
    try:
        record = json.loads(seen.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict) or [record.get("bundle"), record.get("manifest")] != [
        str(root),
        digest,
    ]:
        return {}
    files = record.get("files")
    return files if isinstance(files, dict) else {}


def _write_seen(seen: Path, root: Path, digest: str, files: dict[str, list[int]]) -> None:
    try:
        tmp = seen.with_name(seen.name + ".partial")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"bundle": str(root), "manifest": digest, "files": files}, f)
        tmp.replace(seen)
    except OSError:
        pass  # only a later check's shortcut is lost


def verify(
    root: Path,
    trust: Path | None = None,
    progress: Progress | None = None,
    seen: Path | None = None,
) -> dict:
    """Check the bundle at `root` and return its manifest, or raise BundleRefused naming every
    file that is missing, changed, not listed or not a plain file. Reads only the bundle.

    `seen` (a file only its caller writes, e.g. under $AAMP_HOME) records what a successful
    check hashed: each file's device, inode, size, mtime and ctime, for these manifest bytes
    at this path. A later check with the same record hashes only the files whose identity
    moved (any write to a file moves its ctime), so a status check does not hash the same
    unchanged bytes again. The install's check before it installs gives no record: it hashes
    everything."""
    say = progress or (lambda _m: None)
    root = root.resolve()
    if trust is not None:
        problems = _check_signature(root, trust)
        if problems:
            raise BundleRefused(problems)
    manifest = load(root)
    files: dict[str, dict] = manifest["files"]
    digest = hashlib.sha256((root / MANIFEST).read_bytes()).hexdigest()
    known = _read_seen(seen, root, digest) if seen is not None else {}
    hashed: dict[str, list[int]] = {}
    problems = []
    on_disk = set(bundle_files(root))
    for rel in sorted(on_disk - files.keys()):
        problems.append(f"{rel}: not in the manifest (added after the bundle was made)")
    checked = 0
    for rel, entry in sorted(files.items()):
        path = root / rel
        if rel not in on_disk:  # a file behind a linked directory is not in the bundle either
            problems.append(f"{rel}: missing")
            continue
        if path.is_symlink() or not path.is_file():
            problems.append(f"{rel}: not a plain file")
            continue
        identity = _identity(path)
        size = identity[2]
        if size != entry["size"]:
            problems.append(f"{rel}: altered (size {size}, the manifest says {entry['size']})")
            continue
        if known.get(rel) == identity:
            hashed[rel] = identity
        else:
            actual = sha256_file(path)
            if actual != entry["sha256"]:
                problems.append(
                    f"{rel}: altered (SHA-256 {actual}, the manifest says {entry['sha256']})"
                )
            elif _identity(path) == identity:  # unchanged while it was hashed
                hashed[rel] = identity
        checked += 1
        if checked % 500 == 0:
            say(f"  verified {checked}/{len(files)} files")
    if problems:
        raise BundleRefused(problems)
    if seen is not None:
        _write_seen(seen, root, digest, hashed)
    signed = "signature checked with " + str(trust) if trust else "not signature-checked"
    again = sum(1 for rel, ident in hashed.items() if known.get(rel) == ident)
    unchanged = f", {again} unchanged since the last check, not hashed again" if again else ""
    say(f"bundle verified: {len(files)} files, sizes and SHA-256 match ({signed}{unchanged})")
    return manifest


def _copy_hashing(src: Path, dest: Path) -> tuple[int, str] | None:
    """Copy `src` (a plain file, not followed through a link) to `dest`, hashing the bytes as
    they are copied; (size, SHA-256), or None when `src` is not a plain file."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    digest, size = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as out:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
                size += len(block)
                out.write(block)
    return size, digest.hexdigest()


def copy_verified(root: Path, part: str, dest: Path, trust: Path | None = None) -> list[Path]:
    """Copy every file of the bundle's `part` (a directory, e.g. "wheels/wheelhouse") into
    `dest`, each checked against the manifest as it is copied (and the manifest's signature
    first, when `trust` is given): what a consumer then uses is exactly what the manifest
    lists, even if the bundle changed after `verify`. Returns the copies; raises BundleRefused
    naming every file missing, altered, not listed or not a plain file, leaving none."""
    root = root.resolve()
    if trust is not None:
        problems = _check_signature(root, trust)
        if problems:
            raise BundleRefused(problems)
    prefix = part.strip("/") + "/"
    listed = {rel: e for rel, e in load(root)["files"].items() if rel.startswith(prefix)}
    here = root / prefix
    on_disk = {prefix + rel for rel in bundle_files(here)} if here.is_dir() else set()
    problems = [
        f"{rel}: not in the manifest (added after the bundle was made)"
        for rel in sorted(on_disk - listed.keys())
    ]
    copies: list[Path] = []
    for rel, entry in sorted(listed.items()):
        if rel not in on_disk:
            problems.append(f"{rel}: missing")
            continue
        copy = dest / rel.removeprefix(prefix)
        got = _copy_hashing(root / rel, copy)
        copies.append(copy)
        if got is None:
            problems.append(f"{rel}: not a plain file")
        elif got != (entry["size"], entry["sha256"]):
            problems.append(
                f"{rel}: altered (size {got[0]}, SHA-256 {got[1]}; the manifest says "
                f"{entry['size']}, {entry['sha256']})"
            )
    if problems:
        for copy in copies:
            copy.unlink(missing_ok=True)
        raise BundleRefused(problems)
    return copies
