"""The actions of the sandbox's browser: what `open`, `click`, `fill`, `select`, `upload`,
`wait_for`, `dialog`, `download`, `screenshot` and the others do to the current tab.

`Actions` is the half of `aamp.guest.browser_session.BrowserSession` that acts; the session
is the half that owns the browser, its tabs and what they report (dialogs, downloads, failed
requests), and it provides what every action uses: the current tab, the one element a target
means (`_element`), page operations a dialog may interrupt (`_guarded`), and the page after
an action with its snapshot (`_after`). Each action returns the fields of its answer, or
raises `ActionError` with a message for the model.

Runs inside the guest (the browser driver process, with Playwright); never imports the host
side.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import time

from aamp.guest import browser_read as read
from aamp.guest.browser_targets import (
    ActionError,
    describe,
    first_line,
    is_timeout,
    locator_for,
    ms,
    target_of,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from aamp.guest.browser_session import Tab

MAX_SCREENSHOT_BYTES = 4_000_000
JPEG_QUALITIES = (80, 60, 40, 25)
SCROLL_DIRECTIONS = {"down": (0, 1), "up": (0, -1), "right": (1, 0), "left": (-1, 0)}
_NET_ERROR = re.compile(r"net::ERR_[A-Z_]+")


class DialogPending(Exception):
    """The action is waiting for a dialog the model has to answer."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _png_size(png: bytes) -> list[int] | None:
    if len(png) >= 24 and png.startswith(b"\x89PNG"):
        return [int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")]
    return None


class Actions:
    # The session's state the actions read and change (see BrowserSession).
    workspace: str
    context: Any
    tabs: dict[str, Tab]
    current: Tab | None
    events: list[dict[str, Any]]
    downloads: list[asyncio.Task[None]]
    pending_dialog: tuple[Any, dict[str, Any]] | None
    blocked_action: asyncio.Future[Any] | None

    def _actions(self) -> dict[str, Any]:
        return {
            "open": self._open,
            "back": self._back,
            "snapshot": self._snapshot_only,
            "click": self._click,
            "fill": self._fill,
            "type": self._type,
            "press": self._press,
            "select": self._select,
            "check": self._check,
            "uncheck": self._check,
            "upload": self._upload,
            "hover": self._hover,
            "scroll": self._scroll,
            "wait_for": self._wait_for,
            "dialog": self._dialog,
            "tabs": self._tabs,
            "switch_tab": self._switch_tab,
            "close_tab": self._close_tab,
            "read": self._read,
            "download": self._download,
            "screenshot": self._screenshot,
        }

    async def _open(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        if self.current is None:
            self._add_tab(await self.context.new_page())
            self.current = list(self.tabs.values())[-1]
        return await self._navigate(
            request["url"],
            lambda: self._tab().page.goto(request["url"], wait_until="load", timeout=ms(deadline)),
            deadline,
        )

    async def _back(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        page = self._tab().page
        before = page.url
        fields = await self._navigate(
            before, lambda: page.go_back(wait_until="load", timeout=ms(deadline)), deadline
        )
        if fields.get("status") is None and page.url == before and fields.get("ok", True):
            raise ActionError("no_history", "there is no earlier page in this tab")
        return fields

    async def _navigate(self, url: str, go: Any, deadline: float) -> dict[str, Any]:
        before = len(self.downloads)
        budget = max(0.0, deadline - time.monotonic())
        try:
            response = await self._navigation(url, go, deadline)
        except (ActionError, DialogPending):
            raise
        except Exception as exc:
            message = first_line(exc)
            started_download = "Download is starting" in message
            if started_download or len(self.downloads) > before:
                return await self._after(deadline)
            if is_timeout(exc):
                raise ActionError(
                    "timeout", f"{url} did not finish loading within {budget:.1f} s"
                ) from None
            error = _NET_ERROR.search(str(exc))
            return {
                "ok": False,
                "error_kind": "navigation",
                "error": f"could not load {url}: {error.group(0) if error else message}",
                "navigation_error": {"url": url, "error": error.group(0) if error else message},
            }
        status = response.status if response is not None else None
        return await self._after(deadline, status=status)

    async def _navigation(self, url: str, go: Any, deadline: float) -> Any:
        """`go()`, made again if it was cut short by chromium's error page for an earlier
        failed navigation (which may commit after that failure was reported); if it was cut
        short by the very same navigation, that one is waited for instead."""
        for attempt in range(3):
            try:
                return await self._guarded(go(), deadline)
            except (ActionError, DialogPending):
                raise
            except Exception as exc:
                text = str(exc)
                if attempt < 2 and 'another navigation to "chrome-error://' in text:
                    await asyncio.sleep(0.1)
                    continue
                if f'another navigation to "{url}"' not in text:
                    raise
                loaded = self._tab().page.wait_for_load_state("load", timeout=ms(deadline))
                await self._guarded(loaded, deadline)
                return None
        raise AssertionError("unreachable")

    async def _snapshot_only(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        return await self._snapshot(deadline)

    async def _click(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        locator = await self._element(request, deadline)
        await self._guarded(locator.click(timeout=ms(deadline)), deadline)
        return await self._after(deadline)

    async def _fill(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        locator = await self._element(request, deadline)
        try:
            await self._guarded(locator.fill(request["value"], timeout=ms(deadline)), deadline)
        except (ActionError, DialogPending):
            raise
        except Exception as exc:
            kind = await _field_kind(locator)
            advice = _FILL_ADVICE.get(kind)
            if advice is None or is_timeout(exc):
                raise
            raise ActionError("wrong_action", f"{describe(target_of(request))} {advice}") from None
        value = await read.element_text(locator, ms(deadline))
        return {"value": value}

    async def _type(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        text = request["text"]
        if target_of(request) is not None:
            locator = await self._element(request, deadline)
            await self._guarded(locator.press_sequentially(text, timeout=ms(deadline)), deadline)
        else:
            await self._guarded(self._tab().page.keyboard.type(text), deadline)
        return await self._after(deadline)

    async def _press(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        key = request["key"]
        try:
            if target_of(request) is not None:
                locator = await self._element(request, deadline)
                await self._guarded(locator.press(key, timeout=ms(deadline)), deadline)
            else:
                await self._guarded(self._tab().page.keyboard.press(key), deadline)
        except (ActionError, DialogPending):
            raise
        except Exception as exc:
            if "Unknown key" in str(exc):
                raise ActionError(
                    "bad_request",
                    f"{key!r} is not a key name; use names such as Enter, Tab, Escape, "
                    "ArrowDown, Backspace, F5, a single character, or Control+A",
                ) from None
            raise
        return await self._after(deadline)

    async def _select(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        locator = await self._element(request, deadline)
        wanted = request["options"]
        kind = await _field_kind(locator)
        if kind != "select":
            raise ActionError(
                "wrong_action", f"{describe(target_of(request))} is not a drop-down list (select)"
            )
        options = await locator.evaluate(_OPTIONS)
        known = {o["value"] for o in options} | {o["label"] for o in options}
        missing = [w for w in wanted if w not in known]
        if missing:
            listed = "; ".join(f"{o['label']!r} (value {o['value']!r})" for o in options[:50])
            raise ActionError(
                "no_option",
                f"{describe(target_of(request))} has no option whose value or label is exactly "
                f"{', '.join(repr(m) for m in missing)}; its options: {listed}",
            )
        await self._guarded(locator.select_option(wanted, timeout=ms(deadline)), deadline)
        selected = await read.element_text(locator, ms(deadline))
        return await self._after(deadline, value=selected)

    async def _check(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        locator = await self._element(request, deadline)
        kind = await _field_kind(locator)
        if kind not in ("checkbox", "radio", "other"):
            raise ActionError(
                "wrong_action", f"{describe(target_of(request))} is not a checkbox or radio button"
            )
        if request["action"] == "check":
            await self._guarded(locator.check(timeout=ms(deadline)), deadline)
        elif kind == "radio":
            raise ActionError(
                "wrong_action",
                "a radio button cannot be unchecked; check another button of its group",
            )
        else:
            await self._guarded(locator.uncheck(timeout=ms(deadline)), deadline)
        return await self._after(deadline, checked=await locator.is_checked())

    async def _upload(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        paths = [self._workspace_file(p) for p in request["files"]]
        locator = await self._element(request, deadline)
        if await _field_kind(locator) == "file":
            await self._guarded(locator.set_input_files(paths, timeout=ms(deadline)), deadline)
        else:  # a button that opens a file chooser
            page = self._tab().page
            async with page.expect_file_chooser(timeout=ms(deadline)) as chooser:
                await self._guarded(locator.click(timeout=ms(deadline)), deadline)
            await (await chooser.value).set_files(paths, timeout=ms(deadline))
        names = [os.path.basename(p) for p in paths]
        return await self._after(deadline, uploaded=names)

    def _workspace_file(self, path: object) -> str:
        if not isinstance(path, str) or not path or "\x00" in path:
            raise ActionError("bad_path", "files must be paths inside /workspace")
        full = os.path.realpath(os.path.join(self.workspace, path))
        if not full.startswith(self.workspace + os.sep):
            raise ActionError("bad_path", f"{path!r} is not inside /workspace")
        if not os.path.isfile(full):
            raise ActionError("not_found", f"{path!r} is not a file in /workspace")
        return full

    async def _hover(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        locator = await self._element(request, deadline)
        await self._guarded(locator.hover(timeout=ms(deadline)), deadline)
        return await self._after(deadline)

    async def _scroll(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        page = self._tab().page
        if target_of(request) is not None:
            locator = await self._element(request, deadline)
            await self._guarded(locator.scroll_into_view_if_needed(timeout=ms(deadline)), deadline)
        else:
            dx, dy = SCROLL_DIRECTIONS[request.get("direction") or "down"]
            amount = request.get("amount")
            if amount is None:
                amount = await self._guarded(page.evaluate("() => innerHeight * 0.9"), deadline)
            await self._guarded(page.mouse.wheel(dx * amount, dy * amount), deadline)
            await asyncio.sleep(0.15)  # wheel scrolling and its scroll events are asynchronous
        position = await self._guarded(
            page.evaluate(
                "() => ({x: scrollX, y: scrollY, height: document.documentElement.scrollHeight,"
                " viewport: innerHeight})"
            ),
            deadline,
        )
        return await self._after(deadline, scroll=position)

    async def _wait_for(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        started = time.monotonic()
        state = request.get("state") or "visible"
        tab = self._tab()
        text = request.get("text")
        if text is not None:
            pattern = re.compile(re.escape(text))
            while True:
                seen = await self._guarded(_text_visible(tab.page, pattern), deadline)
                if seen == (state == "visible"):
                    break
                if time.monotonic() >= deadline:
                    verb = "appear" if state == "visible" else "disappear"
                    raise ActionError(
                        "timeout",
                        f"the text {text!r} did not {verb} within {deadline - started:.1f} s",
                    )
                await asyncio.sleep(0.1)
        else:
            target = target_of(request)
            if target is None:
                raise ActionError("bad_request", "wait_for needs text, or an element to wait for")
            locator = await locator_for(tab.page, target, tab.known_refs, deadline)
            try:
                await self._guarded(
                    locator.first.wait_for(state=state, timeout=ms(deadline)), deadline
                )
            except (ActionError, DialogPending):
                raise
            except Exception as exc:
                if not is_timeout(exc):
                    raise
                verb = "become visible" if state == "visible" else "disappear"
                raise ActionError(
                    "timeout",
                    f"{describe(target)} did not {verb} within {deadline - started:.1f} s",
                ) from None
        waited = round(time.monotonic() - started, 3)
        return await self._after(deadline, waited_seconds=waited)

    async def _dialog(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        if self.pending_dialog is None:
            raise ActionError("no_dialog", "no dialog is open")
        dialog, info = self.pending_dialog
        self.pending_dialog = None
        accept = request.get("accept")
        if not isinstance(accept, bool):
            raise ActionError("bad_request", "dialog needs accept: true or false")
        text = request.get("prompt_text")
        await self._answer_dialog(dialog, info, accept, text, "the model")
        blocked, self.blocked_action = self.blocked_action, None
        if blocked is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(blocked, timeout=max(0.1, deadline - time.monotonic()))
        return await self._after(deadline)

    async def _tabs(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        return {"list_tabs": True}

    def _tab_named(self, request: dict[str, Any]) -> Tab:
        tab_id = request.get("tab")
        if tab_id is None:
            return self._tab()
        tab = self.tabs.get(tab_id) if isinstance(tab_id, str) else None
        if tab is None:
            raise ActionError(
                "no_tab", f"there is no tab {tab_id!r}; the tabs are {', '.join(self.tabs)}"
            )
        return tab

    async def _switch_tab(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        if request.get("tab") is None:
            raise ActionError("bad_request", "switch_tab needs the tab's id, such as t2")
        self.current = self._tab_named(request)
        with contextlib.suppress(Exception):
            await self._guarded(self.current.page.bring_to_front(), deadline)
        return {**await self._snapshot(deadline), "list_tabs": True}

    async def _close_tab(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        tab = self._tab_named(request)
        await self._guarded(tab.page.close(), deadline)
        self._on_close(tab)  # the close event may come later; the tab is gone either way
        if not self.tabs:
            return {"list_tabs": True}
        return {**await self._snapshot(deadline), "list_tabs": True}

    async def _read(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        rows = request.get("format") == "rows"
        page = self._tab().page
        if target_of(request) is None:
            if rows:
                return {"tables": await self._guarded(read.page_tables(page), deadline)}
            return {"text": await self._guarded(read.page_text(page), deadline)}
        locator = await self._element(request, deadline)
        if rows:
            tables = await self._guarded(read.element_tables(locator, ms(deadline)), deadline)
            return {"tables": tables}
        return {"text": await self._guarded(read.element_text(locator, ms(deadline)), deadline)}

    async def _download(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        started = time.monotonic()
        before = len(self.downloads) + sum(1 for e in self.events if e["kind"].startswith("down"))
        if request.get("url") is not None:
            fields = await self._open(request, deadline)
            if fields.get("ok") is False:
                return fields
        else:
            locator = await self._element(request, deadline)
            await self._guarded(locator.click(timeout=ms(deadline)), deadline)
        while (
            len(self.downloads) + sum(1 for e in self.events if e["kind"].startswith("down"))
            == before
        ):
            if time.monotonic() >= deadline:
                raise ActionError(
                    "no_download", f"no download started within {deadline - started:.1f} s"
                )
            await asyncio.sleep(0.05)
        return await self._after(deadline)

    async def _screenshot(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        page = self._tab().page
        if target_of(request) is not None:
            locator = await self._element(request, deadline)

            def shoot(**kw: Any) -> Any:
                return locator.screenshot(timeout=ms(deadline), **kw)
        else:
            full = bool(request.get("full_page"))

            def shoot(**kw: Any) -> Any:
                return page.screenshot(full_page=full, timeout=ms(deadline), **kw)

        png = await self._guarded(shoot(type="png"), deadline)
        if len(png) > MAX_SCREENSHOT_BYTES:
            raise ActionError(
                "too_large",
                f"the screenshot is {len(png)} bytes, over {MAX_SCREENSHOT_BYTES}; take the "
                "visible part (no full_page) or one element",
            )
        image: dict[str, Any] = {"png_b64": _b64(png), "size": _png_size(png)}
        budget = request.get("image_budget")
        if isinstance(budget, int) and len(png) > budget:
            for quality in JPEG_QUALITIES:
                jpeg = await self._guarded(shoot(type="jpeg", quality=quality), deadline)
                if len(jpeg) <= budget:
                    image["model_jpeg_b64"] = _b64(jpeg)
                    break
        return {"image": image}


_FILL_ADVICE = {
    "select": "is a drop-down list: use action select with its option's value or label",
    "checkbox": "is a checkbox: use action check or uncheck",
    "radio": "is a radio button: use action check",
    "file": "is a file field: use action upload with files from /workspace",
    "button": "is a button: use action click",
}

_KIND = r"""
(el) => {
  const tag = el.tagName.toLowerCase();
  if (tag === "select") return "select";
  if (tag === "input") {
    const type = (el.type || "text").toLowerCase();
    if (["checkbox", "radio", "file"].includes(type)) return type;
    if (["button", "submit", "reset", "image"].includes(type)) return "button";
    return "text";
  }
  if (tag === "textarea") return "text";
  if (tag === "button") return "button";
  const role = el.getAttribute("role");
  if (role === "checkbox" || role === "switch") return "checkbox";
  if (role === "radio") return "radio";
  return "other";
}
"""

_OPTIONS = "(el) => Array.from(el.options).map(o => ({value: o.value, label: o.label}))"


async def _field_kind(locator: Any) -> str:
    try:
        return str(await locator.evaluate(_KIND, timeout=2000))
    except Exception:
        return "other"


async def _text_visible(page: Any, pattern: re.Pattern[str]) -> bool:
    for frame in page.frames[: read.MAX_FRAMES]:
        with contextlib.suppress(Exception):
            if await frame.get_by_text(pattern).filter(visible=True).count():
                return True
    return False
