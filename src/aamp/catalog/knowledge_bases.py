"""Knowledge bases: named sets of documents and their search index, kept under
`$AAMP_HOME/knowledge-bases/`, indexed only inside sandboxes.

Layout: `NAME.json` (the knowledge base: its documents and its versions, replaced atomically),
`NAME.lock` (held for the whole of a change, so changes to one knowledge base are serial and
each builds on the version before it), `documents/SHA256` (document bytes) and
`indexes/SHA256.sqlite` (index files) — both content-hashed, so equal bytes are kept once.

A document comes in typed, sized and hashed (`check_document`): a suffix the indexer reads,
bytes that look like that type, at most MAX_DOCUMENT_BYTES. A change (`add`, `remove`)
starts a sandbox of the rag image with the default rules (no egress at all), puts the
current index and only the changed documents into it, has the worker (`aamp.guest.rag`)
replace or delete only those documents' rows, and takes the index file back through the
channel: at most MAX_INDEX_BYTES (the guest announces the size before any byte), its header
checked (`rag_worker.check_index_header`) — it is never opened on the host. The result is a
new version; a search names one version's index, so it always sees one consistent file.
What the worker says about each document (chunks, pages, or why it failed) is its claim,
recorded as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aamp.config import Settings
from aamp.errors import Conflict, InvalidInput, NotFound, matching
from aamp.policy import Resources
from aamp.policy.model import NAME_RE
from aamp.sandbox import (
    MAX_INDEX_BYTES,
    BadIndex,
    CreateRequest,
    SandboxManager,
    WorkerFailed,
    call,
    check_index_header,
)
from aamp.store.timestamps import now

MAX_DOCUMENT_BYTES = 100_000_000
MAX_DOCUMENTS = 10_000
DOCUMENT_NAME_MAX = 200
INDEX_TIMEOUT = 1800.0
# The indexing sandbox: room for the model and one document's extraction child (whose own
# limit, guest/rag.py's EXTRACT_MEMORY, is below this, so a hostile document fails alone).
INDEXING_RESOURCES = Resources(cpus=2, memory="3GiB", pids=256, disk="4GiB")
# What the indexer reads, and how the first bytes of each kind must look.
_TEXT = ("html", "htm", "md", "markdown", "txt")
DOCUMENT_TYPES = ("pdf", "docx", *_TEXT)

Progress = Callable[[dict[str, Any]], None]


class KnowledgeBaseError(RuntimeError):
    """A change that failed as a whole in its sandbox (the worker could not remove rows, or
    the index it returned was refused); nothing of it was kept."""


@dataclass(frozen=True)
class Document:
    name: str
    data: bytes


def check_document(name: str, data: bytes) -> str:
    """The document's type (its suffix), or InvalidInput naming the rule it breaks."""
    if (
        not name
        or len(name) > DOCUMENT_NAME_MAX
        or "/" in name
        or name.startswith(".")
        or any(ord(c) < 32 for c in name)
    ):
        raise InvalidInput(
            f"document name {name[:80]!r}: a file name of 1-{DOCUMENT_NAME_MAX} characters, "
            "no '/', not starting with '.'"
        )
    kind = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if kind not in DOCUMENT_TYPES:
        raise InvalidInput(f"{name}: a knowledge base takes {', '.join(DOCUMENT_TYPES)} files")
    if not 0 < len(data) <= MAX_DOCUMENT_BYTES:
        raise InvalidInput(f"{name}: a document is 1 to {MAX_DOCUMENT_BYTES} bytes")
    if kind == "pdf" and not data.startswith(b"%PDF-"):
        raise InvalidInput(f"{name}: not a PDF (it does not start with %PDF-)")
    if kind == "docx" and not data.startswith(b"PK\x03\x04"):
        raise InvalidInput(f"{name}: not a DOCX (not a ZIP file)")
    if kind in _TEXT:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{name}: a text document must be UTF-8 ({exc.reason})") from None
    return kind


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _doc_id(name: str) -> str:
    """A document's id inside the index: from its name, so adding a new version of a file
    replaces the old one's rows."""
    return "d-" + hashlib.sha256(name.encode()).hexdigest()[:24]


class KnowledgeBases:
    def __init__(self, settings: Settings, manager: SandboxManager) -> None:
        self.root = settings.home / "knowledge-bases"
        self.manager = manager

    # -- files --------------------------------------------------------------------------

    def _path(self, name: str, suffix: str) -> Path:
        matching(name, NAME_RE, "knowledge base name must be 1-64 lowercase letters, digits, "
                 "'.', '_' or '-', starting and ending with a letter or digit")  # fmt: skip
        return self.root / f"{name}{suffix}"

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._path(name, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextlib.asynccontextmanager
    async def _locked_async(self, name: str) -> AsyncIterator[None]:
        """The same lock, waited for off the event loop (a change can take minutes)."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._path(name, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self, name: str) -> dict[str, Any]:
        path = self._path(name, ".json")
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise NotFound(f"no knowledge base named {name!r}") from None

    def _write(self, name: str, record: dict[str, Any]) -> None:
        self._replace(self._path(name, ".json"), json.dumps(record, indent=1).encode())

    def _replace(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def index_path(self, sha256: str) -> Path:
        return self.root / "indexes" / f"{sha256}.sqlite"

    def _document_path(self, sha256: str) -> Path:
        return self.root / "documents" / sha256

    # -- reading ------------------------------------------------------------------------

    def list(self) -> list[dict[str, Any]]:
        if not self.root.is_dir():
            return []
        return [self.summary(p.name[: -len(".json")]) for p in sorted(self.root.glob("*.json"))]

    def summary(self, name: str) -> dict[str, Any]:
        record = self._read(name)
        docs = record["documents"].values()
        return {"name": name, "version": record["version"], "index": record["index"],
                "documents": len(record["documents"]),
                "failed": sum(1 for d in docs if d["status"] == "failed"),
                "created_at": record["created_at"], "created_by": record["created_by"]}  # fmt: skip

    def show(self, name: str) -> dict[str, Any]:
        record = self._read(name)
        return {**self.summary(name), "document_list": sorted(record["documents"].values(),
                key=lambda d: d["name"]), "versions": record["versions"]}  # fmt: skip

    def current_index(self, name: str) -> tuple[int, Path] | None:
        """(version, index file) a search uses, or None while nothing is indexed."""
        record = self._read(name)
        if record["index"] is None:
            return None
        return record["version"], self.index_path(record["index"])

    # -- changes ------------------------------------------------------------------------

    def create(self, name: str, *, by: str) -> dict[str, Any]:
        with self._locked(name):
            if self._path(name, ".json").exists():
                raise Conflict(f"knowledge base {name!r} already exists")
            stamp = now()
            self._write(name, {"name": name, "created_at": stamp, "created_by": by,
                               "version": 0, "index": None, "documents": {},
                               "versions": []})  # fmt: skip
        return self.summary(name)

    def delete(self, name: str) -> None:
        with self._locked(name):
            self._read(name)
            self._path(name, ".json").unlink()
        self._path(name, ".lock").unlink(missing_ok=True)
        self._collect()

    async def add(
        self, name: str, documents: list[Document], *, by: str, progress: Progress | None = None
    ) -> dict[str, Any]:
        """Index these documents (a document of the same name is replaced); a new version."""
        if not documents:
            raise InvalidInput("no documents to add")
        for doc in documents:
            check_document(doc.name, doc.data)
        if len({d.name for d in documents}) != len(documents):
            raise InvalidInput("the same document name is given twice")
        return await self._change(name, documents, [], by, progress)

    async def remove_document(self, name: str, document: str, *, by: str) -> dict[str, Any]:
        return await self._change(name, [], [document], by, None)

    async def _change(
        self,
        name: str,
        documents: list[Document],
        removed: list[str],
        by: str,
        progress: Progress | None,
    ) -> dict[str, Any]:
        async with self._locked_async(name):
            record = self._read(name)
            for doc_name in removed:
                if doc_name not in {d["name"] for d in record["documents"].values()}:
                    raise NotFound(f"knowledge base {name!r} has no document {doc_name!r}")
            if len(record["documents"]) + len(documents) > MAX_DOCUMENTS:
                raise InvalidInput(f"a knowledge base holds at most {MAX_DOCUMENTS} documents")
            current = self.index_path(record["index"]) if record["index"] else None
            removed_ids = [_doc_id(n) for n in removed]
            index_file, results = await self._index(current, documents, removed_ids, progress)
            try:
                sha = await asyncio.to_thread(self.keep_index, index_file)
            finally:
                index_file.unlink(missing_ok=True)
            stamp = now()
            for doc_name in removed:
                record["documents"].pop(_doc_id(doc_name), None)
            for doc in documents:
                digest = _sha256(doc.data)
                self._replace(self._document_path(digest), doc.data)
                told = results.get(_doc_id(doc.name), {})
                ok = told.get("ok") is True
                record["documents"][_doc_id(doc.name)] = {
                    "name": doc.name, "sha256": digest, "size": len(doc.data),
                    "type": check_document(doc.name, doc.data), "added_at": stamp,
                    "added_by": by, "status": "indexed" if ok else "failed",
                    "error": None if ok else str(told.get("error") or "no answer")[:1000],
                    "chunks": _count(told.get("chunks")) if ok else 0,
                    "pages": _count(told.get("pages")) if ok else None,
                }  # fmt: skip
            record["version"] += 1
            record["index"] = sha
            change = {"added": [d.name for d in documents], "removed": removed}
            record["versions"].append({"version": record["version"], "index": sha,
                                       "at": stamp, "by": by, **change})  # fmt: skip
            self._write(name, record)
        self._collect()
        return self.show(name)

    async def _index(
        self,
        current: Path | None,
        documents: list[Document],
        removed_ids: list[str],
        progress: Progress | None,
    ) -> tuple[Path, dict[str, dict[str, Any]]]:
        """The change made in a fresh sandbox; (the new index file, the worker's per-document
        answers by id). The index file is the caller's to remove."""
        request = CreateRequest(image="rag", resources=INDEXING_RESOURCES)
        sandbox = await self.manager.create(request)
        results: dict[str, dict[str, Any]] = {}
        try:
            async with self.manager.use(sandbox.id) as channel:
                if current is not None:
                    await channel.put_file("kb/index.sqlite", current)
                if removed_ids:
                    answer = await call(channel, {"action": "remove", "index": "kb/index.sqlite",
                                                  "ids": removed_ids}, INDEX_TIMEOUT)  # fmt: skip
                    if answer.get("ok") is not True:
                        raise KnowledgeBaseError(f"removing failed: {answer.get('error')!s:.500}")
                for n, doc in enumerate(documents, 1):
                    path = f"kb/docs/{n}.{check_document(doc.name, doc.data)}"
                    await channel.put(path, doc.data, len(doc.data))
                    request = {"action": "index", "index": "kb/index.sqlite",
                               "documents": [{"id": _doc_id(doc.name), "name": doc.name,
                                              "path": path}]}  # fmt: skip
                    try:
                        answer = await call(channel, request, INDEX_TIMEOUT)
                    except WorkerFailed as exc:  # this document's worker, not the sandbox
                        answer = {"ok": False, "error": str(exc)}
                    told = answer.get("documents") if answer.get("ok") is True else None
                    if (
                        not isinstance(told, list)
                        or len(told) != 1
                        or not isinstance(told[0], dict)
                    ):
                        why = f"{answer.get('error')!s:.500}" if "error" in answer else "no answer"
                        told = [{"ok": False, "error": f"the indexer failed: {why}"}]
                    results[_doc_id(doc.name)] = told[0]
                    if progress is not None:
                        progress({"done": n, "total": len(documents), "document": doc.name,
                                  "ok": told[0].get("ok") is True})  # fmt: skip
                fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".index-")
                try:
                    async with await channel.get("kb/index.sqlite") as stream:
                        if stream.size > MAX_INDEX_BYTES:
                            raise KnowledgeBaseError(
                                f"the index is {stream.size} bytes, over {MAX_INDEX_BYTES}"
                            )
                        with os.fdopen(fd, "wb") as f:
                            async for chunk in stream:
                                f.write(chunk)
                except BaseException:
                    os.unlink(tmp)
                    raise
        finally:
            await self.manager.destroy(sandbox.id)
        return Path(tmp), results

    def keep_index(self, path: Path) -> str:
        """Check the index file the sandbox returned (never opening it) and keep it under its
        SHA-256; the hash."""
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(100)
        try:
            check_index_header(head, size)
        except BadIndex as exc:
            raise KnowledgeBaseError(f"the index the sandbox returned is refused: {exc}") from None
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        sha = h.hexdigest()
        target = self.index_path(sha)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not target.exists():
            os.link(path, target)
        return sha

    def _collect(self) -> None:
        """Remove index and document files no version of any knowledge base names."""
        indexes, documents = set(), set()
        for path in self.root.glob("*.json"):
            record = json.loads(path.read_text())
            indexes |= {v["index"] for v in record["versions"]}
            documents |= {d["sha256"] for d in record["documents"].values()}
        for path in (self.root / "indexes").glob("*.sqlite"):
            if path.name[: -len(".sqlite")] not in indexes:
                path.unlink(missing_ok=True)
        for path in (self.root / "documents").glob("*"):
            if path.name not in documents:
                path.unlink(missing_ok=True)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
