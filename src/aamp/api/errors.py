"""Every error leaves the API as JSON `{code, message}` with the right status; never a trace."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("aamp.api")


class ErrorOut(BaseModel):
    """Every error response: a stable `code` and a human `message`."""

    code: str
    message: str


# Documented on every route, so clients (and the schema fuzzer) know what errors look like.
# Each names the one `ErrorOut` schema (`document_errors` puts it in the document) rather than
# being given as a `model`: for a model FastAPI builds a validator per status per route, about
# a thousand at every start that nothing uses (the handlers below write these bodies), and
# most of the time an app takes to build.
_ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    status: {"content": _ERROR_CONTENT, "description": text}
    for status, text in (
        (400, "bad request"),
        (401, "not signed in, or the credentials are not valid"),
        (403, "not allowed (the reason names the rule)"),
        (404, "no such thing"),
        (409, "conflicts with what exists"),
        (410, "the sandbox has stopped"),
        (411, "Content-Length required"),
        (413, "too large"),
        (422, "the request does not match the schema"),
        (429, "too many attempts"),
        (502, "the sandbox misbehaved"),
        (503, "unavailable"),
        (504, "the sandbox timed out"),
    )
}


def document_errors(app: FastAPI) -> None:
    """Put the `ErrorOut` schema, which every route's error responses name, into the app's
    OpenAPI document."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        document = app.openapi_schema
        if document is None:  # built once, on first use, then kept by FastAPI
            document = build()
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            schemas["ErrorOut"] = ErrorOut.model_json_schema(mode="serialization")
        return document

    app.openapi = openapi  # type: ignore[method-assign]


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        if err.get("type") == "json_invalid":
            return "the request body is not valid JSON"
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query"))
        parts.append(f"{where or 'request'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


def install_error_handlers(app: FastAPI, domain_errors: dict[type[Exception], int]) -> None:
    """`domain_errors` maps exception types that carry a `code` (or not) to HTTP statuses."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        if any(err.get("type") == "json_invalid" for err in exc.errors()):
            return error_response(400, "malformed_json", _describe_validation(exc))
        return error_response(422, "invalid_request", _describe_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {
            400: "invalid_request",
            404: "not_found",
            405: "method_not_allowed",
            413: "too_large",
        }.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    for exc_type, status in domain_errors.items():

        async def _domain(_: Request, exc: Exception, status: int = status) -> JSONResponse:
            code = getattr(exc, "code", None) or _snake(type(exc).__name__)
            return error_response(getattr(exc, "status", status), code, str(exc))

        app.add_exception_handler(exc_type, _domain)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, "internal_error", "internal error; see the server log")
