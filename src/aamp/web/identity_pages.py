"""Pages everyone has: sign in, sign out, and "me" (role, grants, own API tokens, own
password).

Signing in is the API's `POST /v1/session`: its session cookie (HttpOnly, SameSite=Strict) is
passed to the browser as the API set it, and the session's CSRF token is kept in a second
HttpOnly SameSite=Strict cookie, from which each page puts it into its forms; the API checks
the token a form sends against the session. A sign-in form from another site is refused by
the API's Origin check (there is no session yet for a token to belong to).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from aamp.api import SESSION_COOKIE
from aamp.web.page import CSRF_COOKIE, Page, back, field_errors, local_path, render

HOME_BY_ROLE = {"admin": "/admin/users", "builder": "/build", "operator": "/agents"}


async def home(request: Request) -> Response:
    page = await Page.signed_in(request)
    return back(HOME_BY_ROLE.get(page.role, "/me"))


async def login_form(request: Request) -> Response:
    return render(request, "login.html", me={}, values={}, errors={}, next=_next(request))


def _next(request: Request) -> str:
    return local_path(request.query_params.get("next"), "/")


async def login(request: Request) -> Response:
    form = await request.form()
    username, password = str(form.get("username", "")), str(form.get("password", ""))
    target = local_path(str(form.get("next", "")), "/")
    answer = await request.app.state.backend.call(
        request, "POST", "/v1/session", json_body={"username": username, "password": password}
    )
    if not answer.ok:
        errors = field_errors(answer.message) if answer.status == 422 else {"": answer.message}
        return render(
            request,
            "login.html",
            answer.status,
            me={},
            values={"username": username},
            errors=errors,
            next=target,
        )
    response = RedirectResponse(target, status_code=303)
    for cookie in answer.cookies:
        response.raw_headers.append((b"set-cookie", cookie.encode("latin-1")))
    response.set_cookie(
        CSRF_COOKIE,
        answer.json()["csrf_token"],
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


async def logout(request: Request) -> Response:
    page = Page(request)
    await page.form()
    answer = await page.backend.call(request, "DELETE", "/v1/session", csrf=page.text("csrf"))
    if not answer.ok and answer.status != 401:
        return render(
            request,
            "error.html",
            answer.status,
            me={},
            http_status=answer.status,
            code=answer.code,
            title="Not signed out",
            message=answer.message,
            next_step="Reload the page and sign out again.",
        )
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(CSRF_COOKIE, path="/")
    return response


async def me_page(
    request: Request,
    new_token: dict | None = None,
    errors=None,
    values=None,
    status: int = 200,
    password_errors=None,
) -> Response:
    page = await Page.signed_in(request)
    tokens = await page.get("/v1/tokens")
    mine = [t for t in tokens if t.get("username") == page.me.get("username")]
    return page.render(
        "me.html",
        status,
        tokens=mine,
        new_token=new_token,
        errors=errors or {},
        values=values or {},
        password_errors=password_errors or {},
    )


async def create_token(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    name, days = page.text("name").strip(), page.text("expires_in_days").strip()
    body: dict[str, object] = {"name": name}
    errors: dict[str, str] = {}
    if days:
        if not days.isdigit():
            errors["expires_in_days"] = "expires_in_days: a whole number of days"
        else:
            body["expires_in_days"] = int(days)
    if not errors:
        answer = await page.call("POST", "/v1/tokens", json_body=body)
        if answer.ok:
            # Shown once, on this answer only (no redirect that could show it again).
            return await me_page(request, new_token=answer.json())
        errors = field_errors(answer.message)
    return await me_page(
        request, errors=errors, values={"name": name, "expires_in_days": days}, status=400
    )


async def change_password(request: Request) -> Response:
    """Your own password, with your current one; every session ends, so you sign in again."""
    page = await Page.signed_in(request)
    await page.form()
    username = str(page.me.get("username", ""))
    body = {"current_password": page.text("current_password"), "password": page.text("password")}
    answer = await page.call("PUT", f"/v1/users/{username}/password", json_body=body)
    if answer.ok:
        return back("/login")
    return await me_page(
        request, password_errors=field_errors(answer.message), status=answer.status
    )


async def revoke_token(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    token_id = request.path_params["token_id"]
    answer = await page.call("DELETE", f"/v1/tokens/{token_id}")
    if not answer.ok:
        return await me_page(request, errors={"": answer.message}, status=answer.status)
    return back("/me")


def routes() -> list[Route]:
    return [
        Route("/", home),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/me", me_page, methods=["GET"]),
        Route("/me/tokens", create_token, methods=["POST"]),
        Route("/me/password", change_password, methods=["POST"]),
        Route("/me/tokens/{token_id}/revoke", revoke_token, methods=["POST"]),
    ]
