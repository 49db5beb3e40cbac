"""Every error leaves the API as JSON `{code, message}` with the right status; never a trace."""

from __future__ import annotations

import logging

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
ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    status: {"model": ErrorOut, "description": text}
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
