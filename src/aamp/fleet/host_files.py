"""`HostFiles`: the read-only files a sandbox host on another machine keeps for the creates
that mount them (a knowledge base's index for the `rag` tool), each under its SHA-256 in
one directory (`$AAMP_HOME/host-files/SHA`, mode 0600), for as long as a sandbox or a create
in flight needs it.

A replica sends a create's files by hash over the link, before the create
(`link_client.py`): `hold` (POST /link/files/SHA/hold) says whether the host has the file
and holds it for that create (named by a random hold id the replica chose, for
`HOLD_SECONDS`); only then `put` (PUT /link/files/SHA) takes its bytes — of the size the hold
declared, at most `max_bytes` — and keeps them only if they hash to SHA. The create then
`claim`s its held files (the paths the driver binds read-only into the guest), and either
`attach`es them to the sandbox it made or, having failed, `forget`s them.

A file nothing needs any more — no live sandbox uses it (`sweep`, given the sandboxes the
host runs) and no unexpired hold names it — is deleted at once. `clear` deletes everything:
at the host's start (nothing of an earlier process is trusted or needed) and when its epoch
is found stale (its sandboxes were all destroyed first).

Every refusal (a name that is no SHA-256, a size over the bound or unlike the hold's, a file
no hold names, bytes that do not hash to their name) is decided here and recorded as one
(`host.file_refused`, deny) through the host's recorder — its process log, as the host's
sandbox lifecycle is — before it is raised as `FileRefused`.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aamp.digests import is_sha256
from aamp.errors import AampError
from aamp.sandbox.rag_worker import MAX_INDEX_BYTES

HOLD_RE = re.compile(r"^[0-9a-f]{32}\Z")
# A hold the replica neither used in a create nor let go of (it died between hold and
# create) stops keeping its files this long after it was made.
HOLD_SECONDS = 600.0
MAX_FILES_PER_CREATE = 16


class FileRefused(AampError, code="file_refused", status=422):
    """A file the host does not take or does not have for a create; recorded already."""

    def __init__(self, message: str, status: int = 422, code: str = "file_refused") -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class _Hold:
    deadline: float
    sizes: dict[str, int] = field(default_factory=dict)  # sha -> size declared


class HostFiles:
    def __init__(
        self,
        root: Path,
        recorder: Any,
        *,
        max_bytes: int = MAX_INDEX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`recorder` has `AuditSink.record`'s signature (the host's `LogRecorder`)."""
        self.root, self.recorder, self.max_bytes, self.clock = root, recorder, max_bytes, clock
        self._holds: dict[str, _Hold] = {}
        self._users: dict[str, set[str]] = {}  # sha -> the sandboxes that mount it

    def path(self, sha: str) -> Path:
        return self.root / sha

    def clear(self) -> None:
        """Delete every file (and partial upload) and forget every hold and use."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, mode=0o700)
        self._holds.clear()
        self._users.clear()

    async def _refuse(self, why: str, sha: str, status: int = 422, **details: object) -> None:
        await self.recorder.record(
            actor="system",
            action="host.file_refused",
            resource=f"host-file:{sha}" if is_sha256(sha) else f"host-file:{sha[:64]!r}",
            decision="deny",
            reason=why,
            details=details,
        )
        code = {404: "file_not_held", 413: "file_too_large"}.get(status, "file_refused")
        raise FileRefused(why, status, code)

    async def _check(self, sha: str, hold_id: str) -> None:
        if not is_sha256(sha):
            await self._refuse("a host file is named by its SHA-256 in lowercase hex", sha)
        if not HOLD_RE.match(hold_id):
            await self._refuse("a hold id is 32 lowercase hex digits", sha)

    async def hold(self, sha: str, size: object, hold_id: str) -> bool:
        """Hold file `sha` of `size` bytes for the create `hold_id`; whether the host has it."""
        await self._check(sha, hold_id)
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= self.max_bytes:
            await self._refuse(
                f"a host file is 1 to {self.max_bytes} bytes, not {str(size)[:40]}",
                sha,
                413,
                size=str(size)[:40],
            )
        hold = self._holds.setdefault(hold_id, _Hold(self.clock() + HOLD_SECONDS))
        if sha not in hold.sizes and len(hold.sizes) >= MAX_FILES_PER_CREATE:
            await self._refuse(f"a create mounts at most {MAX_FILES_PER_CREATE} files", sha)
        hold.sizes[sha] = size  # type: ignore[assignment]
        present = self.path(sha)
        return present.is_file() and present.stat().st_size == size

    async def put(self, sha: str, hold_id: str, size: int, chunks: AsyncIterator[bytes]) -> None:
        """Keep the `size` bytes of `chunks` as file `sha`, held for `hold_id`: refused unless
        held at that size, and unless they hash to `sha` (nothing of them is kept then)."""
        await self._check(sha, hold_id)
        held = self._live_hold(hold_id)
        declared = held.sizes.get(sha) if held is not None else None
        if declared is None:
            await self._refuse(f"no create holds host file {sha}", sha, 404)
        if size != declared:
            await self._refuse(
                f"host file {sha} was held at {declared} bytes, {size} were sent",
                sha,
                413,
                size=size,
            )
        if self.path(sha).is_file():
            return  # another create's upload kept it meanwhile: the same bytes, by its name
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.root / f".{sha}.{secrets.token_hex(6)}.part"
        digest, got = hashlib.sha256(), 0
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                async for chunk in chunks:
                    got += len(chunk)
                    if got > size:
                        break
                    digest.update(chunk)
                    f.write(chunk)
            if got != size:
                await self._refuse(
                    f"host file {sha}: {got} bytes or more sent, {size} announced", sha, size=got
                )
            if digest.hexdigest() != sha:
                await self._refuse(
                    f"host file {sha}: the bytes sent hash to {digest.hexdigest()}",
                    sha,
                    size=size,
                )
            if self._live_hold(hold_id) is None:  # it expired while the bytes came
                await self._refuse(f"the hold of host file {sha} expired", sha, 404)
            os.replace(tmp, self.path(sha))
        finally:
            tmp.unlink(missing_ok=True)

    def _live_hold(self, hold_id: str) -> _Hold | None:
        held = self._holds.get(hold_id)
        return held if held is not None and held.deadline > self.clock() else None

    async def claim(self, hold_id: str, shas: list[str]) -> list[Path]:
        """The paths of `shas`, each held for `hold_id` and present (else refused)."""
        held = self._live_hold(hold_id) if HOLD_RE.match(str(hold_id)) else None
        paths = []
        for sha in shas:
            if held is None or sha not in held.sizes:
                await self._refuse(f"the create did not hold host file {str(sha)[:64]}", str(sha))
            if not self.path(sha).is_file():
                await self._refuse(f"host file {sha} was held but never sent", sha, 404)
            paths.append(self.path(sha))
        return paths

    def attach(self, hold_id: str, sandbox_id: str) -> None:
        """The create `hold_id` made `sandbox_id`: its held files are that sandbox's now."""
        held = self._holds.pop(hold_id, None)
        for sha in held.sizes if held is not None else ():
            self._users.setdefault(sha, set()).add(sandbox_id)

    def forget(self, hold_id: str) -> None:
        """The create `hold_id` failed (or will not come): its files are not kept for it."""
        self._holds.pop(hold_id, None)
        self._delete_unneeded()

    def sweep(self, live: set[str]) -> None:
        """Only `live` sandboxes run on this host: the files no one needs go."""
        for users in self._users.values():
            users &= live
        now = self.clock()
        for hold_id in [h for h, held in self._holds.items() if held.deadline <= now]:
            del self._holds[hold_id]
        self._delete_unneeded()

    def _delete_unneeded(self) -> None:
        needed = {sha for held in self._holds.values() for sha in held.sizes}
        needed |= {sha for sha, users in self._users.items() if users}
        for sha in [s for s in self._users if s not in needed]:
            del self._users[sha]
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            if is_sha256(path.name) and path.name not in needed:
                path.unlink(missing_ok=True)

    def in_use(self) -> dict[str, set[str]]:
        """Each kept file and the sandboxes that mount it (for tests and `describe`)."""
        return {sha: set(users) for sha, users in self._users.items() if users}
