"""`ReceivedWheels`: the wheels a sandbox host on another machine was sent over the link for
its sandboxes' packages layers, kept as `$AAMP_HOME/link-wheels/SHA256/FILENAME`.

A replica offers the wheels a create needs by SHA-256 (`lacking`: which of them this host
does not keep yet) and sends each one lacking (`keep`); the host builds the packages layer
from them with the same layer code as a replica's own (`ImageStore.with_wheels`), fetching
nothing. A wheel is kept only when it is what was offered: a wheel file name the guest's
Python can install, at most `MAX_WHEEL_BYTES` (announced and sent), the bytes hashing to the
SHA-256 it is kept under, and a readable wheel — anything else is refused with
`WheelRefused`, and nothing of it is kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import zipfile
from collections.abc import AsyncIterable, Iterable
from dataclasses import dataclass
from pathlib import Path

from aamp.digests import is_sha256
from aamp.sandbox.wheelhouse import (
    MAX_WHEEL_BYTES,
    WHEEL_FILENAME,
    WheelhouseError,
    guest_can_use,
    requirements_of,
)

FILENAME_RE = re.compile(rf"^{WHEEL_FILENAME}\Z")
MAX_OFFERED = 256  # wheels in one offer: far more than any policy's packages


class WheelRefused(WheelhouseError):
    """A wheel offered or sent that this host does not keep; `status` is the link's answer
    (400: not what was offered, 413: too large)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class WheelRef:
    """One wheel as a replica names it: its SHA-256 and its file name."""

    sha256: str
    filename: str

    def __post_init__(self) -> None:
        if not is_sha256(self.sha256):
            raise WheelRefused(f"{str(self.sha256)[:80]!r} is not a SHA-256 in hex")
        if not isinstance(self.filename, str) or not FILENAME_RE.match(self.filename):
            raise WheelRefused(f"{str(self.filename)[:80]!r} is not a wheel file name")
        why = guest_can_use(self.filename)
        if why is not None:
            raise WheelRefused(why)

    @classmethod
    def listed(cls, offered: object) -> list[WheelRef]:
        """The wheels of a JSON list of `{sha256, filename}`, or WheelRefused."""
        if not isinstance(offered, list) or len(offered) > MAX_OFFERED:
            raise WheelRefused(f"wheels is a list of at most {MAX_OFFERED} {{sha256, filename}}")
        refs = []
        for item in offered:
            if not isinstance(item, dict) or set(item) != {"sha256", "filename"}:
                raise WheelRefused("each wheel is an object with sha256 and filename only")
            refs.append(cls(item["sha256"], item["filename"]))
        return refs

    def to_dict(self) -> dict[str, str]:
        return {"sha256": self.sha256, "filename": self.filename}


class ReceivedWheels:
    def __init__(self, home: Path) -> None:
        self.root = home / "link-wheels"

    def path(self, ref: WheelRef) -> Path:
        return self.root / ref.sha256 / ref.filename

    def lacking(self, offered: Iterable[WheelRef]) -> list[str]:
        """The SHA-256 of each offered wheel not kept here (under that name)."""
        return [r.sha256 for r in offered if not self.path(r).is_file()]

    def paths(self, wheels: Iterable[WheelRef]) -> list[tuple[Path, str]]:
        """(file, sha256) of each wheel, all kept here, or WheelRefused naming those not."""
        wheels = list(wheels)
        missing = self.lacking(wheels)
        if missing:
            raise WheelRefused(
                "this host was not sent the wheels "
                + ", ".join(
                    f"{r.filename} ({r.sha256[:12]})" for r in wheels if r.sha256 in missing
                )
            )
        return [(self.path(r), r.sha256) for r in wheels]

    async def keep(self, ref: WheelRef, chunks: AsyncIterable[bytes], announced: int) -> Path:
        """Keep the wheel sent as `chunks` (`announced` bytes) as `ref`, or WheelRefused —
        too large (announced or sent), not the bytes announced, not hashing to `ref.sha256`,
        not a readable wheel. A wheel already kept is not written again."""
        if not 0 < announced <= MAX_WHEEL_BYTES:
            raise WheelRefused(
                f"{ref.filename}: {announced} bytes announced; a wheel is 1 to"
                f" {MAX_WHEEL_BYTES} bytes",
                413 if announced > MAX_WHEEL_BYTES else 400,
            )
        final = self.path(ref)
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        tmp = final.parent / f".{secrets.token_hex(8)}.tmp"
        digest, seen = hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as f:
                async for chunk in chunks:
                    seen += len(chunk)
                    if seen > announced:  # never more on disk than was announced
                        raise WheelRefused(f"{ref.filename}: more than {announced} bytes sent", 413)
                    digest.update(chunk)
                    f.write(chunk)
            if seen != announced:
                raise WheelRefused(f"{ref.filename}: {seen} bytes sent, {announced} announced")
            if digest.hexdigest() != ref.sha256:
                raise WheelRefused(
                    f"{ref.filename}: its bytes hash to {digest.hexdigest()}, not the"
                    f" SHA-256 it was offered as ({ref.sha256})"
                )
            try:
                requirements_of(tmp)
            except (zipfile.BadZipFile, WheelhouseError) as exc:
                raise WheelRefused(f"{ref.filename}: not a readable wheel ({exc})") from None
            if final.is_file():  # sent twice at once: the same bytes (its hash) are kept
                tmp.unlink()
            else:
                os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
            if not final.is_file():  # refused: no directory is left for it either
                with contextlib.suppress(OSError):
                    final.parent.rmdir()
        return final
