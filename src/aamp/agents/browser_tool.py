"""The `browser` tool on the host: one call becomes one request to the sandbox's browser driver
(through the guest channel's `browser` operation), and its answer becomes the observation.

What the host adds, because only the host knows it:

- Policy refusals. Before the action the tool marks the sandbox's egress events
  (`aamp.egress.recent`), after it reads what the proxy refused meanwhile: a navigation it
  refused is reported as a policy refusal with its rule, over HTTP (where chromium saw the
  proxy's 403) as over HTTPS (where it saw only a failed tunnel), and every other refused
  request is listed briefly. Nothing the guest or a web page sends can claim a refusal.
- Limits: the call's timeout (default 5 s for element actions, 30 s for navigations) is
  bounded by the tool timeout; the screenshot budget for the model and the agent's way of
  answering dialogs come from the definition (`BrowserSettings`).

Everything from the guest is untrusted: the answer is size-capped, parsed as JSON, every
field type-checked and cut to length, images checked to be PNG/JPEG under their cap.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from aamp.agents.browser_schema import NAVIGATIONS
from aamp.agents.browser_settings import BrowserSettings
from aamp.agents.observation import ModelImage, Observation
from aamp.egress.ledger import EgressEvent
from aamp.egress.recent import EgressView
from aamp.sandbox import GuestChannel

Borrow = Callable[[], AbstractAsyncContextManager[GuestChannel]]

DEFAULT_WAIT = 5.0
DEFAULT_LOAD = 30.0
MAX_ANSWER = 16_000_000
MAX_SCREENSHOT = 4_000_000
MAX_LISTED = 10
_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG = b"\xff\xd8\xff"
_REFUSED = ("refused", "cut")


def _text(value: object, limit: int = 2000) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dicts(value: object, limit: int = 100) -> list[dict[str, Any]]:
    return [v for v in value[:limit] if isinstance(v, dict)] if isinstance(value, list) else []


def _destination(url: str) -> tuple[str, int] | None:
    """(host, port) as the egress proxy's ledger names them."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host or parts.scheme not in ("http", "https"):
        return None
    with suppress(UnicodeError):
        host = host.encode("idna").decode("ascii")
    return host.lower().rstrip("."), port or (443 if parts.scheme == "https" else 80)


def _b64(value: object, magic: tuple[bytes, ...]) -> bytes | None:
    if not isinstance(value, str) or len(value) > MAX_SCREENSHOT * 4 // 3 + 8:
        return None
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if data.startswith(magic) and len(data) <= MAX_SCREENSHOT else None


class BrowserTool:
    def __init__(
        self,
        borrow: Borrow,
        timeout_cap: int,
        settings: BrowserSettings | None = None,
        egress: EgressView | None = None,
    ) -> None:
        self.borrow = borrow
        self.timeout_cap = float(timeout_cap)
        self.settings = settings or BrowserSettings()
        self.egress = egress

    def request(self, args: dict[str, Any]) -> dict[str, Any]:
        """The driver's request for one checked call."""
        default = DEFAULT_LOAD if args["action"] in NAVIGATIONS else DEFAULT_WAIT
        timeout = min(float(args.get("timeout", default)), self.timeout_cap)
        request = {**args, "timeout": timeout, "dialog_default": self.settings.dialogs}
        if args["action"] == "screenshot" and self.settings.images:
            request["image_budget"] = self.settings.image_max_bytes
        return request

    async def run(self, args: dict[str, Any]) -> Observation:
        request = self.request(args)
        mark = await self.egress.mark() if self.egress is not None else 0
        async with self.borrow() as channel:
            raw = await channel.browser(request, timeout=self.timeout_cap, max_answer=MAX_ANSWER)
        await asyncio.sleep(0)  # the proxy's last ledger events are handed on in the loop
        refused = []
        if self.egress is not None:
            refused = [e for e in await self.egress.since(mark) if e.decision in _REFUSED]
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            return Observation("error: the browser sent an answer that is not a JSON object", False)
        return observe(args, answer, refused, self.settings)


def observe(
    args: dict[str, Any],
    answer: dict[str, Any],
    refused: list[EgressEvent],
    settings: BrowserSettings,
) -> Observation:
    """The observation of one call: the driver's `answer` (untrusted), checked, with the
    proxy's `refused` events of the same time."""
    return _Report(args, answer, list(refused), settings).observation()


@dataclass
class _Report:
    """One answer from the driver, checked, turned into the model's observation."""

    args: dict[str, Any]
    answer: dict[str, Any]
    refused: list[EgressEvent]
    settings: BrowserSettings
    lines: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.ok = self.answer.get("ok") is True
        self.detail: dict[str, Any] = {"action": self.args["action"]}

    def observation(self) -> Observation:
        a = self.answer
        url, title, tab = _text(a.get("url"), 8192), _text(a.get("title"), 300), _text(a.get("tab"))
        status = _int(a.get("status"))
        self.detail.update({"url": url, "title": title, "tab": tab, "status": status})
        elapsed = a.get("elapsed_ms")
        self.detail["elapsed_ms"] = elapsed if isinstance(elapsed, (int, float)) else None
        policy = self._navigation_refusal()
        if policy is not None:
            self.ok = False
            self.lines.append(policy)
        elif not self.ok:
            self.lines.append(f"error: {_text(a.get('error')) or 'the browser action failed'}")
        if _int(a.get("generation")) not in (None, 1):
            self.lines.append(
                "note: the browser was restarted; earlier tabs, pages and logins are gone"
            )
        if url:
            self.lines.append(f"tab {tab}: {url}" + (f" ({title})" if title else ""))
        if status is not None:
            self.lines.append(f"http status: {status}")
            if status >= 400:
                self.ok = False
        self._result()
        self._events()
        self._blocked()
        self._tabs()
        self._dialog_open()
        shot, model_image = self._screenshot()
        snapshot = _text(a.get("snapshot"), 1_000_000)
        if snapshot:
            self.lines.append("snapshot:\n" + snapshot)
        return Observation("\n".join(self.lines), self.ok, self.detail, shot, model_image)

    def _navigation_refusal(self) -> str | None:
        """A refused navigation, in the proxy's words; None when the page was not refused."""
        failed = self.answer.get("navigation_error")
        url = _text(failed.get("url"), 8192) if isinstance(failed, dict) else ""
        if not url and self.args["action"] in ("open", "download") and self.args.get("url"):
            url = self.args["url"]
        target = _destination(url) if url else None
        same = [e for e in self.refused if target is not None and (e.host, e.port) == target]
        if not same:
            return None
        # The page and whatever else the tab asked of that host (its favicon) are one refusal.
        self.refused = [e for e in self.refused if e not in same]
        event = same[0]
        self.detail["refused"] = {"url": url, "rule": event.rule}
        return (
            f"error: refused by the egress policy: {url} was not loaded "
            f"(rule: {event.rule}; {event.reason})"
        )

    def _result(self) -> None:
        a = self.answer
        if "value" in a:
            self.lines.append(f"value now: {_text(a.get('value'), 10_000)!r}")
        if isinstance(a.get("checked"), bool):
            self.lines.append("checked" if a["checked"] else "not checked")
        if isinstance(a.get("uploaded"), list):
            names = ", ".join(_text(n, 300) for n in a["uploaded"][:20])
            self.lines.append(f"uploaded: {names}")
        if isinstance(a.get("scroll"), dict):
            s = a["scroll"]
            self.lines.append(
                f"scrolled to x={_int(s.get('x'))} y={_int(s.get('y'))} of page height "
                f"{_int(s.get('height'))} (viewport {_int(s.get('viewport'))})"
            )
        if isinstance(a.get("waited_seconds"), (int, float)):
            self.lines.append(f"waited {a['waited_seconds']:.2f} s")
        if isinstance(a.get("text"), str):
            self.lines.append("text:\n" + a["text"][:1_000_000])
        if isinstance(a.get("tables"), list):
            self._tables(_dicts(a["tables"], 200))

    def _tables(self, tables: list[dict[str, Any]]) -> None:
        if not tables:
            self.lines.append("no tables")
        for n, table in enumerate(tables, 1):
            rows = (
                [r for r in table.get("rows", []) if isinstance(r, list)]
                if isinstance(table.get("rows"), list)
                else []
            )
            where = f" in {_text(table.get('frame'), 500)}" if table.get("frame") else ""
            caption = f" {_text(table.get('caption'), 300)!r}" if table.get("caption") else ""
            total = _int(table.get("total")) or len(rows)
            self.lines.append(f"table {n}{caption}{where}: {total} rows")
            for row in rows:
                self.lines.append(json.dumps([_text(c, 2000) for c in row], ensure_ascii=False))
            if total > len(rows):
                self.lines.append(f"[... {total - len(rows)} more rows not shown]")

    def _events(self) -> None:
        downloads = []
        for e in _dicts(self.answer.get("events"), 50):
            kind = e.get("kind")
            tab = _text(e.get("tab"), 20)
            if kind == "dialog":
                answer, by = _text(e.get("answer"), 20), _text(e.get("by"), 100)
                text = e.get("prompt_text")
                typed = f" with {text[:2000]!r}" if isinstance(text, str) else ""
                self.lines.append(
                    f"dialog ({_text(e.get('type'), 20)}) on tab {tab}: "
                    f"{_text(e.get('message'))!r} — {answer}{typed} ({by})"
                )
            elif kind == "new_tab":
                url = _text(e.get("url"), 8192)
                self.lines.append(f"new tab {tab} opened: {url} (now the current tab)")
            elif kind == "tab_closed":
                self.lines.append(f"tab {tab} closed")
            elif kind == "crash":
                self.lines.append(f"the page in tab {tab} crashed")
                self.ok = False
            elif kind == "download":
                item = {
                    "path": _text(e.get("path"), 300),
                    "size": _int(e.get("size")),
                    "type": _text(e.get("type"), 100),
                }
                downloads.append(item)
                self.lines.append(
                    f"downloaded /workspace/{item['path']} ({item['size']} bytes, {item['type']})"
                )
            elif kind == "download_failed":
                self.lines.append(
                    f"download of {_text(e.get('name'), 300)} failed: {_text(e.get('error'), 300)}"
                )
        if downloads:
            self.detail["downloads"] = downloads

    def _blocked(self) -> None:
        """The requests the proxy refused during the action, and the other failed requests."""
        failed = _dicts(self.answer.get("failed_requests"), 50)
        groups: dict[tuple[str, int | None, str], list[str]] = {}
        for event in self.refused:
            groups.setdefault((event.host, event.port, event.rule), [])
        for item in failed:
            target = _destination(_text(item.get("url"), 2000))
            for host, port, rule in groups:
                if target == (host, port):
                    groups[(host, port, rule)].append(_text(item.get("url"), 300))
                    item["policy"] = True
        if groups:
            self.detail["blocked"] = [{"host": h, "port": p, "rule": r} for h, p, r in groups]
            self.lines.append("blocked by the egress policy:")
            for (host, port, rule), urls in list(groups.items())[:MAX_LISTED]:
                example = f", e.g. {urls[0]}" if urls else ""
                self.lines.append(f"- {host}:{port} (rule: {rule}){example}")
            if len(groups) > MAX_LISTED:
                self.lines.append(f"- and {len(groups) - MAX_LISTED} more destinations")
        others = [i for i in failed if not i.get("policy")]
        if others:
            self.lines.append("failed requests:")
            for item in others[:MAX_LISTED]:
                self.lines.append(
                    f"- {_text(item.get('method'), 10)} {_text(item.get('url'), 300)} "
                    f"({_text(item.get('resource'), 20)}): {_text(item.get('error'), 200)}"
                )
            untold = _int(self.answer.get("failed_requests_dropped")) or 0
            dropped = len(others) - MAX_LISTED + untold
            if dropped > 0:
                self.lines.append(f"- and {dropped} more")

    def _tabs(self) -> None:
        tabs = _dicts(self.answer.get("tabs"), 100)
        if not tabs:
            return
        self.lines.append("tabs:")
        for t in tabs:
            mark = " (current)" if t.get("current") is True else ""
            title = _text(t.get("title"), 200)
            self.lines.append(
                f"- {_text(t.get('id'), 20)}{mark}: {_text(t.get('url'), 2000)}"
                + (f" ({title})" if title else "")
            )

    def _dialog_open(self) -> None:
        d = self.answer.get("dialog_open")
        if not isinstance(d, dict):
            return
        self.detail["dialog_open"] = {"type": _text(d.get("type"), 20)}
        default = _text(d.get("default_value"))
        suffix = f" (default text {default!r})" if default else ""
        self.lines.append(
            f"a {_text(d.get('type'), 20)} dialog is open on tab {_text(d.get('tab'), 20)}: "
            f"{_text(d.get('message'))!r}{suffix}. Answer it with action dialog, accept true "
            "or false (and prompt_text for a prompt)."
        )

    def _screenshot(self) -> tuple[bytes | None, ModelImage | None]:
        image = self.answer.get("image")
        if not isinstance(image, dict):
            return None, None
        png = _b64(image.get("png_b64"), (_PNG,))
        if png is None:
            self.ok = False
            self.lines.append("error: the browser sent a screenshot that is not a usable PNG")
            return None, None
        size = image.get("size")
        dims = f"{size[0]}x{size[1]} " if isinstance(size, list) and len(size) == 2 else ""
        self.lines.append(f"screenshot taken ({dims}{len(png)} bytes PNG)")
        if not self.settings.images:
            self.lines.append(
                "(the screenshot is kept in the run's events; this agent's model is not sent "
                "images, so the snapshot is its view of the page)"
            )
            return png, None
        budget = self.settings.image_max_bytes
        if len(png) <= budget:
            return png, ModelImage("image/png", png)
        jpeg = _b64(image.get("model_jpeg_b64"), (_JPEG,))
        if jpeg is not None and len(jpeg) <= budget:
            self.lines.append(f"(sent to you as a {len(jpeg)} byte JPEG, within {budget} bytes)")
            return png, ModelImage("image/jpeg", jpeg)
        self.lines.append(
            f"(not sent to you: over the image budget of {budget} bytes even as JPEG; take "
            "one element, or the visible part only)"
        )
        return png, None
