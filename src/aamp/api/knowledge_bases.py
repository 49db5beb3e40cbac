"""The knowledge bases' routes (`aamp kb ...`): list and show (staff), create, add one
document (its bytes as the request body, at most MAX_DOCUMENT_BYTES, typed and hashed before
anything is kept, then indexed in a rag sandbox), remove one document, remove the knowledge
base (staff). Each change is audited with the document's name, type, size and SHA-256 and what
the indexer said of it; the guard has already recorded the decision."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import Field

from aamp.api.body import Body
from aamp.api.catalog import delete_unless_in_use
from aamp.api.errors import ApiError
from aamp.api.guard import cp_of, guarded_router, record_change, rule
from aamp.catalog import MAX_DOCUMENT_BYTES, Document, KnowledgeBaseError, KnowledgeBases
from aamp.policy.model import NAME_RE

# For pydantic, whose regex engine has no `\Z` and reads `$` as the end of the text.
KB_NAME = NAME_RE.pattern.removesuffix("\\Z") + "$"
DOCUMENT_NAME = r"^[^/\x00-\x1f.][^/\x00-\x1f]{0,199}$"
KbName = Annotated[str, Path(pattern=KB_NAME)]
DocName = Annotated[str, Path(pattern=DOCUMENT_NAME)]


class CreateIn(Body):
    name: str = Field(pattern=KB_NAME)


def _kbs(request: Request) -> KnowledgeBases:
    cp = cp_of(request)
    return KnowledgeBases(cp.settings, cp.manager)


def router() -> APIRouter:
    r = guarded_router(prefix="/v1", tags=["knowledge-bases"])

    @r.get("/knowledge-bases")
    @rule("knowledge_base.list")
    async def list_knowledge_bases(request: Request) -> list[dict[str, Any]]:
        return _kbs(request).list()

    @r.post("/knowledge-bases", status_code=201)
    @rule("knowledge_base.create")
    async def create_knowledge_base(body: CreateIn, request: Request) -> dict[str, Any]:
        made = _kbs(request).create(body.name, by=request.state.actor.audit_name)
        await record_change(request, "knowledge_base.created", f"knowledge-base:{body.name}", {})
        return made

    @r.get("/knowledge-bases/{name}")
    @rule("knowledge_base.read")
    async def show_knowledge_base(name: KbName, request: Request) -> dict[str, Any]:
        return _kbs(request).show(name)

    @r.delete("/knowledge-bases/{name}")
    @rule("knowledge_base.delete")
    async def delete_knowledge_base(name: KbName, request: Request) -> dict[str, Any]:
        """Delete a knowledge base no agent is granted (409 naming them, on record)."""
        catalog, kbs = cp_of(request).catalog, _kbs(request)
        shown = kbs.show(name)

        def remove() -> None:
            catalog.remove_unused("knowledge-base", name, lambda: kbs.delete(name))

        details = {"version": shown["version"], "documents": shown["documents"]}
        await delete_unless_in_use(request, "knowledge-base", name, remove, details)
        return {"deleted": name}

    @r.put("/knowledge-bases/{name}/documents/{document}", status_code=201)
    @rule("knowledge_base.change")
    async def add_document(name: KbName, document: DocName, request: Request) -> dict[str, Any]:
        """Add (or replace) one document and index it; answers the new version."""
        kbs = _kbs(request)
        kbs.show(name)  # 404 before reading a byte of a body meant for no knowledge base
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_DOCUMENT_BYTES:
                raise ApiError(413, "too_large", f"a document is at most {MAX_DOCUMENT_BYTES} B")
        try:
            by = request.state.actor.audit_name
            shown = await kbs.add(name, [Document(document, bytes(data))], by=by)
        except KnowledgeBaseError as exc:
            raise ApiError(502, "indexing_failed", str(exc)) from None
        entry = next(d for d in shown["document_list"] if d["name"] == document)
        details = {key: entry[key] for key in ("sha256", "size", "type", "status", "error")}
        details |= {"document": document, "version": shown["version"], "index": shown["index"]}
        await record_change(
            request, "knowledge_base.document_added", f"knowledge-base:{name}", details
        )
        return shown

    @r.delete("/knowledge-bases/{name}/documents/{document}")
    @rule("knowledge_base.change")
    async def remove_document(name: KbName, document: DocName, request: Request) -> dict[str, Any]:
        try:
            shown = await _kbs(request).remove_document(
                name, document, by=request.state.actor.audit_name
            )
        except KnowledgeBaseError as exc:
            raise ApiError(502, "indexing_failed", str(exc)) from None
        details = {"document": document, "version": shown["version"], "index": shown["index"]}
        await record_change(
            request, "knowledge_base.document_removed", f"knowledge-base:{name}", details
        )
        return shown

    return r
