"""A run's files in its sandbox: the inputs put into /workspace/in, each knowledge base's
index mounted or copied in, and the artifacts of /workspace/out checked against the policy's
`data.outbound`, approved where it says so, and kept on the host (`artifacts_dir`).

`RunFiles` is a part of `RunService` (`service.py`), moved here unchanged: its methods use the
service's settings, store, runs, leases, sandbox manager and approvals.
"""

from __future__ import annotations

import hashlib
import posixpath
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aamp.agents import guest_scripts, rag_index_path
from aamp.config import Settings
from aamp.errors import NotFound
from aamp.runs import artifacts as art
from aamp.runs.leases import RunLeases
from aamp.runs.store import RunEvent, RunStore
from aamp.sandbox.manager import SandboxManager
from aamp.store import Store

if TYPE_CHECKING:
    from aamp.runs.service import RunRequest


def artifacts_dir(settings: Settings, run_id: str) -> Path:
    return settings.home / "artifacts" / run_id


class RunFiles:
    """Inputs in, indexes given, artifacts out."""

    settings: Settings
    store: Store
    runs: RunStore
    leases: RunLeases
    manager: SandboxManager
    emit: Callable[[str, str, dict[str, Any]], Awaitable[RunEvent]]  # the service's: a step
    _ask: Callable[[str, str, dict[str, Any], int], Awaitable[None]]  # approvals.py

    async def _put_inputs(
        self, run_id: str, sandbox_id: str, inputs: tuple[tuple[str, bytes], ...]
    ) -> None:
        async with self.manager.use(sandbox_id) as channel:
            await channel.run(["mkdir", "-p", "/workspace/in", "/workspace/out"], timeout=30)
            for name, data in inputs:
                path = posixpath.join("/workspace/in", name)
                await channel.put(path, data, len(data))
                await self.emit(
                    run_id,
                    "file.in",
                    {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
                )

    async def _give_indexes(
        self, run_id: str, sandbox_id: str, indexes: dict[str, tuple[int, Path]], mounted: bool
    ) -> None:
        """Say how each knowledge base's index is in the sandbox, where only the worker reads
        it: mounted read-only at boot (gVisor: the stored file itself, which the guest cannot
        change), or — a driver that cannot mount files (Firecracker) — copied in now, into
        the guest's own disk, where the guest could change its copy but never the stored
        file; the event says which."""
        for name, (version, path) in indexes.items():
            about = {"name": name, "version": version, "index": path.stem}
            if mounted:
                about |= {"size": path.stat().st_size, "read_only": True}
                await self.emit(run_id, "knowledge_base.mounted", about)
                continue
            async with self.manager.use(sandbox_id) as channel:
                size = await channel.put_file(rag_index_path(name), path)
            reason = "this sandbox's driver cannot mount host files read-only"
            await self.emit(run_id, "knowledge_base.copied", about | {"size": size,
                            "read_only": False, "reason": reason})  # fmt: skip

    async def _collect(self, run_id: str, sandbox_id: str, req: RunRequest) -> list[str]:
        """Copy /workspace/out's files out as artifacts; returns the refusals' reasons."""
        rule = req.policy.data.outbound
        async with self.manager.use(sandbox_id) as channel:
            result, out, _ = await channel.run(
                ["python3", "-c", guest_scripts.LIST, *art.ROOTS], timeout=60
            )
        answer = guest_scripts.answer(out) if result.exit_code == 0 else None
        found, clashes = art.candidates(answer.get("entries") if answer else None)
        refused: list[str] = []
        for clash, reason in clashes:
            refused.append(reason)
            await self.emit(run_id, "artifact.refused", {"name": clash.name, "reason": reason})
        used = 0
        kept: set[str] = set()  # content hashes of registered artifacts
        dest = artifacts_dir(self.settings, run_id)
        for candidate in found:
            try:
                art.check(candidate, rule, used)
                async with self.manager.use(sandbox_id) as channel:
                    path, size, sha = await art.copy_out(
                        channel, candidate, dest, rule.max_bytes - used
                    )
            except art.ArtifactRefused as exc:
                refused.append(str(exc))
                await self.emit(
                    run_id, "artifact.refused", {"name": candidate.name, "reason": str(exc)}
                )
                continue
            subject = {"name": candidate.name, "size": size, "sha256": sha}
            if rule.needs_approval(used + size):
                timeout = req.definition.limits.approval_timeout_seconds
                try:
                    await self._ask(run_id, "data.outbound", subject, timeout)
                except BaseException:
                    if sha not in kept:  # data nobody approved does not stay on the host
                        path.unlink(missing_ok=True)
                    raise
            kept.add(sha)
            used += size
            await self.store.run(
                self.runs.add_artifact, run_id, candidate.name, size, sha, self.leases.fence(run_id)
            )
            await self.emit(run_id, "artifact", subject)
        return refused

    def artifact_path(self, run_id: str, name: str) -> tuple[Path, dict[str, Any]]:
        for item in self.runs.artifacts(run_id):
            if item["name"] == name:
                return artifacts_dir(self.settings, run_id) / item["sha256"], item
        raise NotFound(f"run {run_id} has no artifact {name!r}")

    def forget_artifacts(self, run_id: str) -> None:
        shutil.rmtree(artifacts_dir(self.settings, run_id), ignore_errors=True)
