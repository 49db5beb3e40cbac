"""Saving a run's artifacts into a local directory (`aamp run ... --download DIR`).

An artifact's name was chosen inside a sandbox, so what the API lists is checked before
anything is written: a name must be a relative path of plain components (it keeps the path it
had under /workspace/out, so `a/x.txt` and `b/x.txt` stay apart), with no control characters,
and nothing on the way to it inside DIR may be a symbolic link or a file; so nothing lands
outside DIR. Every file is streamed into a temporary file beside its destination, at most the
size the API listed, its size and SHA-256 checked against that listing, and only then linked
into place. A file already there is never overwritten: one with the same bytes is kept, one
with other bytes stops the download before anything is fetched.

Usage::

    saved = save_artifacts(client, run_id, client.call("GET", f"/v1/runs/{run_id}/artifacts"),
                           Path("out"), progress=print)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from typing import Any

CHUNK = 1024 * 1024
MAX_NAME = 255


class DownloadError(ValueError):
    """An artifact that cannot be saved; the message names it and the reason."""


@dataclass(frozen=True)
class Planned:
    """Where one listed artifact goes, and the size and SHA-256 its bytes must have there."""

    name: str
    size: int
    sha256: str
    dest: Path
    present: bool  # the destination already holds exactly these bytes


def plan(dest_dir: Path, items: list[dict[str, Any]]) -> list[Planned]:
    """Where each listed artifact goes. Refuses, before anything is written, a name that could
    leave `dest_dir`, two artifacts for one file, and a destination that holds other bytes."""
    check_directory(dest_dir)
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise DownloadError("the API's artifact listing is not a list of artifacts")
    planned: list[Planned] = []
    names = [_checked_name(item.get("name")) for item in items]
    if len(set(names)) != len(names):
        raise DownloadError("the API listed an artifact name twice")
    folders = {"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)}
    clashes = sorted(folders.intersection(names))
    if clashes:
        raise DownloadError(f"artifact {clashes[0]!r} would be both a file and a directory")
    for name, item in zip(names, items, strict=True):
        size, sha = item.get("size"), item.get("sha256")
        if not isinstance(size, int) or size < 0 or not isinstance(sha, str) or not _hex64(sha):
            raise DownloadError(f"artifact {name!r}: the API listed no usable size and SHA-256")
        parts = name.split("/")
        _check_no_link_on_the_way(dest_dir, parts, name)
        dest = dest_dir.joinpath(*parts)
        present = dest.exists()
        if present and _sha256_of(dest) != sha:
            raise DownloadError(
                f"{dest} already exists with other content; not overwritten "
                "(move it away or choose another --download directory)"
            )
        planned.append(Planned(name, size, sha, dest, present))
    return planned


def check_directory(dest_dir: Path) -> None:
    """Refuse a download directory that cannot be one, before there is anything to save."""
    if dest_dir.exists() and not dest_dir.is_dir():
        raise DownloadError(f"--download {dest_dir}: exists and is not a directory")


def save_artifacts(
    client: Any,
    run_id: str,
    items: list[dict[str, Any]],
    dest_dir: Path,
    *,
    progress: Callable[[str], None],
) -> list[Path]:
    """Download every listed artifact of `run_id` into `dest_dir`; returns the files."""
    planned = plan(dest_dir, items)
    if not planned:
        progress(f"run {run_id} has no artifacts to download")
        return []
    progress(f"downloading {len(planned)} artifact(s) of run {run_id} into {dest_dir}")
    for i, item in enumerate(planned, 1):
        counter = f"[{i}/{len(planned)}]"
        if item.present:
            progress(f"{counter} {item.dest} is already there (sha256 matches)")
            continue
        progress(f"{counter} {item.name} ({item.size} bytes)")
        _fetch(client, run_id, item, dest_dir)
        progress(f"{counter} saved {item.dest} (size and sha256 match the run's record)")
    return [item.dest for item in planned]


def _fetch(client: Any, run_id: str, item: Planned, dest_dir: Path) -> None:
    parent = _make_parents(dest_dir, item)
    tmp = parent / f".{item.dest.name}.aamp-partial-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    digest, size = hashlib.sha256(), 0
    show = _Meter(item) if sys.stderr.isatty() else None
    try:
        with os.fdopen(fd, "wb") as out:
            url = f"/v1/runs/{run_id}/artifacts/{quote(item.name, safe='/')}"
            with client.stream("GET", url) as resp:
                for chunk in resp.iter_bytes(CHUNK):
                    size += len(chunk)
                    if size > item.size:  # never more than the record says
                        break
                    digest.update(chunk)
                    out.write(chunk)
                    if show:
                        show(size)
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if size != item.size or got != item.sha256:
            more = "more than" if size > item.size else f"{size} bytes, sha256 {got}, not"
            raise DownloadError(
                f"artifact {item.name}: received {more} the {item.size} bytes with sha256 "
                f"{item.sha256} the run recorded; not saved"
            )
        try:
            os.link(tmp, item.dest)  # unlike a rename, never replaces a file that appeared
        except FileExistsError:
            raise DownloadError(
                f"{item.dest} appeared while downloading; not overwritten"
            ) from None
    finally:
        if show:
            show.done()
        tmp.unlink(missing_ok=True)


def _checked_name(name: object) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise DownloadError(f"artifact name {name!r}: not a usable file name")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise DownloadError(f"artifact name {name!r}: contains control characters")
    if name.startswith("/") or any(p in ("", ".", "..") for p in name.split("/")):
        raise DownloadError(
            f"artifact name {name!r}: would leave the download directory "
            "(absolute, or empty, . or .. path parts)"
        )
    return name


def _check_no_link_on_the_way(dest_dir: Path, parts: list[str], name: str) -> None:
    """Every existing step below `dest_dir` must be a real directory, the last a regular file."""
    path = dest_dir
    for i, part in enumerate(parts):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        last = i == len(parts) - 1
        if stat.S_ISLNK(mode):
            raise DownloadError(f"artifact {name!r}: {path} is a symbolic link; not followed")
        if not last and not stat.S_ISDIR(mode):
            raise DownloadError(f"artifact {name!r}: {path} exists and is not a directory")
        if last and not stat.S_ISREG(mode):
            raise DownloadError(f"artifact {name!r}: {path} exists and is not a regular file")


def _make_parents(dest_dir: Path, item: Planned) -> Path:
    """Create the directories an artifact's name has, one step at a time, checking each before
    going into it (the tree may have changed since `plan`)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    parts = item.name.split("/")
    path = dest_dir
    for part in parts[:-1]:
        path = path / part
        with contextlib.suppress(FileExistsError):
            path.mkdir()
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            raise DownloadError(f"artifact {item.name!r}: {path} is not a directory of its own")
    _check_no_link_on_the_way(dest_dir, parts, item.name)
    return path


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _hex64(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


class _Meter:
    """A percentage on the terminal, rewritten in place, for files over a few MB."""

    def __init__(self, item: Planned):
        self.item, self.shown = item, -1

    def __call__(self, size: int) -> None:
        if self.item.size < 4 * CHUNK:
            return
        pct = size * 100 // self.item.size
        if pct != self.shown:
            self.shown = pct
            print(f"\r    {self.item.name}: {pct:3d}%", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.shown >= 0:
            print(file=sys.stderr)
