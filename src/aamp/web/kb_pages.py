"""The knowledge-base pages (builders and admins): the list and a form to create one; one
knowledge base with its documents (type, size, status, chunks, and why a document failed),
a form adding documents, removing a document, deleting the knowledge base.

Every step is a `/v1/knowledge-bases` call as the person signed in, so the API decides (an
operator gets its 403 page, the refusal on record) and records each change. Adding documents
is one API request per document, as `aamp kb add` does; the answer is a page sent while it
is made, a line as each document starts and another as it is indexed or fails (with the
indexer's reason), so the progress of a big set is seen as it goes. The files are checked
first with the knowledge bases' own rule (`check_document`: type, size, bytes that look
like the type), and a form with a file that breaks it is shown again naming the rule, with
nothing uploaded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from aamp.catalog import DOCUMENT_TYPES, MAX_DOCUMENT_BYTES, check_document
from aamp.errors import InvalidInput
from aamp.web.page import ENV, LoginNeeded, Page, PageError, back, create_named, list_with_form

# What one form may carry (the API takes one document of up to MAX_DOCUMENT_BYTES a
# request; larger sets go through `aamp kb add`).
MAX_FORM_BYTES = MAX_DOCUMENT_BYTES
ROWS_MARK = "<!-- rows -->"


def _api(name: str, *rest: str) -> str:
    return "/".join(
        ["/v1/knowledge-bases", quote(name, safe=""), *(quote(r, safe="") for r in rest)]
    )


async def listing(request: Request, status: int = 200, **context: Any) -> Response:
    return await list_with_form(request, "knowledge-bases", "kb_list.html", status, context)


async def create(request: Request) -> Response:
    page, name, answer, errors = await create_named(request, "/v1/knowledge-bases")
    if answer.ok:
        return back(f"/knowledge-bases/{quote(name)}")
    return await listing(request, answer.status, page=page, values={"name": name}, errors=errors)


async def show(request: Request, status: int = 200, **context: Any) -> Response:
    page = context.pop("page", None) or await Page.signed_in(request)
    name = request.path_params["name"]
    return page.render(
        "kb_show.html",
        status,
        kb=await page.get(_api(name)),
        types=", ".join(DOCUMENT_TYPES),
        max_bytes=MAX_DOCUMENT_BYTES,
        errors=context.get("errors", {}),
    )


async def add_documents(request: Request) -> Response:
    """Check every file first (nothing is sent if one breaks the rule), then index them one
    API request each, the page streamed as each starts and ends."""
    page = await Page.signed_in(request)
    form = await page.form()
    name = request.path_params["name"]
    kb = await page.get(_api(name))  # the API's say (and 404) before anything is read
    files = [f for f in form.getlist("documents") if isinstance(f, UploadFile) and f.filename]
    documents: list[tuple[str, bytes]] = []
    problems: list[str] = []
    if not files:
        problems.append("documents: choose at least one file")
    for upload in files:
        data = await upload.read()
        try:
            check_document(upload.filename or "", data)
        except InvalidInput as exc:
            problems.append(f"documents: {exc}")
        documents.append((upload.filename or "", data))
    if len({n for n, _ in documents}) != len(documents):
        problems.append("documents: the same file name is given twice")
    if problems:
        errors = {"documents": "; ".join(p.removeprefix("documents: ") for p in problems)}
        return await show(request, 400, page=page, errors=errors)

    head, tail = (
        page.render("kb_indexing.html", kb=kb, count=len(documents)).body.decode().split(ROWS_MARK)
    )
    row = ENV.get_template("kb_indexing_row.html")

    async def body() -> AsyncIterator[bytes]:
        yield head.encode()
        indexed = failed = 0
        for n, (doc, data) in enumerate(documents, 1):
            yield row.render(doc=doc, n=n, count=len(documents), state="started").encode()
            try:
                answer = await page.call(
                    "PUT", _api(name, "documents", doc), body=data,
                    content_type="application/octet-stream",
                )  # fmt: skip
            except LoginNeeded:  # the session ended while the page was being sent
                yield row.render(doc=doc, n=n, count=len(documents), state="failed",
                                 message="your session ended: sign in again and add the "
                                 "documents not listed as indexed").encode()  # fmt: skip
                break
            entry: dict[str, Any] = {}
            if answer.ok:
                entry = next(d for d in answer.json()["document_list"] if d["name"] == doc)
            ok = answer.ok and entry.get("status") == "indexed"
            indexed, failed = indexed + ok, failed + (not ok)
            yield row.render(
                doc=doc, n=n, count=len(documents), state="indexed" if ok else "failed",
                entry=entry, message=None if answer.ok else answer.message,
            ).encode()  # fmt: skip
        yield row.render(state="done", indexed=indexed, failed=failed).encode()
        yield tail.encode()

    return StreamingResponse(
        body(),
        media_type="text/html; charset=utf-8",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


async def remove_document(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    name, doc = request.path_params["name"], request.path_params["document"]
    answer = await page.call("DELETE", _api(name, "documents", doc))
    if answer.ok:
        return back(f"/knowledge-bases/{quote(name)}")
    if answer.status == 403:
        raise PageError(answer, me=page.me)
    return await show(request, answer.status, page=page, errors={f"doc:{doc}": answer.message})


async def delete(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    name = request.path_params["name"]
    answer = await page.call("DELETE", _api(name))
    if answer.ok:
        return back("/knowledge-bases")
    if answer.status in (403, 404):
        raise PageError(answer, me=page.me)
    return await show(request, answer.status, page=page, errors={"delete": answer.message})


def routes() -> list[Route]:
    return [
        Route("/knowledge-bases", listing, methods=["GET"]),
        Route("/knowledge-bases", create, methods=["POST"]),
        Route("/knowledge-bases/{name}", show, methods=["GET"]),
        Route("/knowledge-bases/{name}/documents", add_documents, methods=["POST"]),
        Route(
            "/knowledge-bases/{name}/documents/{document}/delete",
            remove_document,
            methods=["POST"],
        ),
        Route("/knowledge-bases/{name}/delete", delete, methods=["POST"]),
    ]
