"""The one browser of a sandbox: chromium, its tabs, and what they report on the way.

`BrowserSession.start()` starts Debian's chromium (through /usr/bin/chromium, so the image's
quiet flags and managed policy apply) with the egress proxy as its only way out, and attaches
Playwright to it over the DevTools protocol on the guest's loopback; the chromium start and
Playwright's own start run side by side. `handle(request)` runs one action (the actions are
in `aamp.guest.browser_actions`) and returns one answer (a JSON-able dict) that says what
happened: the page after it as an accessibility snapshot with refs, and everything the
action caused on the way — dialogs, new tabs, downloads, failed requests.

- Tabs: every page of the browser is a tab (`t1`, `t2`, ...); a tab the page opens (a
  `target=_blank` link, `window.open`) becomes the current one and is reported.
- Dialogs: `alert` is accepted. `confirm`, `prompt` and `beforeunload` follow the call's
  `dialog` argument, else the agent's default (`dialog_default`): `accept` or `dismiss` at
  once (reported with the text), or `ask`: the dialog stays open, the action's answer reports
  it, and the next call must be `dialog` with `accept` true or false (other actions are
  refused until then).
- Downloads are saved as /workspace/downloads/NAME (a safe name; never overwriting) and
  reported with their name, size and type.
- Failed requests (connection refused by the proxy, aborted, ...) are listed after each
  action; the host adds which of them the egress policy refused, from its own ledger.

Runs inside the guest (the browser driver process, with Playwright); never imports the host
side.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time

from aamp.guest.browser_actions import Actions, DialogPending
from aamp.guest.browser_downloads import save_download
from aamp.guest.browser_targets import (
    ActionError,
    call_log_hint,
    describe,
    first_line,
    is_timeout,
    locate,
    ms,
    refs_in,
    target_of,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CHROMIUM = "/usr/bin/chromium"
# The fresh profile's preferences: no spell-check dictionaries, which chromium would otherwise
# download on the first keystroke in a text field even with spell checking off by policy.
PROFILE_PREFERENCES = {"spellcheck": {"dictionaries": [], "dictionary": ""}}
START_TIMEOUT = 90.0
WINDOW = "1280,800"
# After an action: how long to wait for a navigation it started to load, and for the
# requests it started (XHR, fetch) to finish, so the snapshot shows their result.
LOAD_WAIT_MAX = 10.0
REQUESTS_WAIT_MAX = 1.5
TAB_WAIT_MAX = 10.0
TRACKED_REQUESTS = frozenset({"document", "xhr", "fetch"})
MAX_FAILED = 20
MAX_EVENTS = 50
MAX_SNAPSHOT_CHARS = 300_000


class Tab:
    __slots__ = ("id", "inflight", "known_refs", "page")

    def __init__(self, tab_id: str, page: Any) -> None:
        self.id = tab_id
        self.page = page
        self.known_refs: set[str] = set()  # refs shown since the tab last navigated
        self.inflight: set[Any] = set()


def _set_parent_death_signal() -> None:
    """Chromium dies with the driver, so a restarted driver never finds a stray one."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


class BrowserSession(Actions):
    def __init__(self, workspace: str, home: str) -> None:
        self.workspace = os.path.realpath(workspace)
        self.home = home
        self.profile = os.path.join(home, "profile")
        self.tabs: dict[str, Tab] = {}
        self.current: Tab | None = None
        self._tab_ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []
        self.failed_dropped = 0
        self.downloads: list[asyncio.Task[None]] = []
        self.pending_dialog: tuple[Any, dict[str, Any]] | None = None
        self.dialog_opened = asyncio.Event()
        self.blocked_action: asyncio.Future[Any] | None = None
        self.dialog_answers: set[asyncio.Future[None]] = set()
        self.agent_dialog_default = "dismiss"
        self.dialog_choice: tuple[str, str | None, str] = ("dismiss", None, "the agent's default")
        self.gone: str | None = None  # why this browser cannot be used any more
        self.chromium: subprocess.Popen[bytes] | None = None
        self.playwright: Any = None
        self.context: Any = None
        self.page_targets: set[str] = set()  # chromium's page targets, as it reports them
        self.announced_targets = 0  # of which Playwright has announced this many as tabs

    # --- start and stop ---------------------------------------------------------------

    async def start(self) -> None:
        shutil.rmtree(self.profile, ignore_errors=True)
        os.makedirs(os.path.join(self.profile, "Default"), mode=0o700)
        with open(os.path.join(self.profile, "Default", "Preferences"), "w") as f:
            json.dump(PROFILE_PREFERENCES, f)
        log_path = os.path.join(self.home, "chromium.log")
        argv = [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={self.profile}",
            f"--window-size={WINDOW}",
        ]
        proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
        if proxy:
            argv.append(f"--proxy-server={proxy}")
        # No first tab: Playwright attaches much faster to a browser with no page (measured in
        # gVisor: 0.4 s against 1.3 s), and then opens one itself.
        argv.append("--no-startup-window")
        with open(log_path, "ab") as log:
            self.chromium = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=_set_parent_death_signal,
            )
        # Imported only now: Playwright's import and its driver's start overlap chromium's.
        from playwright.async_api import async_playwright

        self.playwright = await async_playwright().start()
        endpoint = await self._devtools_endpoint(log_path)
        browser = await self.playwright.chromium.connect_over_cdp(
            endpoint, is_local=True, timeout=START_TIMEOUT * 1000
        )
        browser.on("disconnected", lambda _b: self._lost("chromium exited"))
        self.context = browser.contexts[0]
        # Playwright announces a new tab only once it has set it up (a second or more in
        # gVisor); chromium's own target event comes at once, so an action that opened a tab
        # can wait for it and report it in its own answer.
        targets = await browser.new_browser_cdp_session()
        targets.on("Target.targetCreated", self._on_target_created)
        targets.on("Target.targetDestroyed", self._on_target_destroyed)
        await targets.send("Target.setDiscoverTargets", {"discover": True})
        if not self.context.pages:
            await self.context.new_page()
        for page in self.context.pages:
            self._add_tab(page)
        self.announced_targets = len(self.tabs)
        self.context.on("page", self._on_new_page)  # from now on, pages the pages open
        self.current = next(iter(self.tabs.values()))

    async def _devtools_endpoint(self, log_path: str) -> str:
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(port_file) as f:
                    port = int(f.read().split()[0])
                return f"http://127.0.0.1:{port}"
            assert self.chromium is not None
            if self.chromium.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"chromium did not start (exit status {self.chromium.returncode}): "
                    + _tail(log_path)
                )
            await asyncio.sleep(0.02)

    def _lost(self, why: str) -> None:
        self.gone = f"the browser stopped ({why}); the next call starts a new one"

    async def close(self) -> None:
        if self.playwright is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.playwright.stop(), 5)
        if self.chromium is not None and self.chromium.poll() is None:
            self.chromium.kill()
            self.chromium.wait()

    # --- what the pages do ------------------------------------------------------------

    def _add_tab(self, page: Any) -> Tab:
        tab = Tab(f"t{next(self._tab_ids)}", page)
        self.tabs[tab.id] = tab
        page.on("dialog", lambda dialog: self._on_dialog(tab, dialog))
        page.on("download", lambda download: self._on_download(tab, download))
        page.on("request", lambda r: self._on_request(tab, r))
        page.on("requestfinished", lambda r: tab.inflight.discard(r))
        page.on("requestfailed", lambda r: self._on_request_failed(tab, r))
        page.on("framenavigated", lambda frame: self._on_navigated(tab, frame))
        page.on("close", lambda _p: self._on_close(tab))
        page.on("crash", lambda _p: self._event({"kind": "crash", "tab": tab.id}))
        return tab

    def _event(self, event: dict[str, Any]) -> None:
        if len(self.events) < MAX_EVENTS:
            self.events.append(event)

    def _on_target_created(self, params: dict[str, Any]) -> None:
        info = params.get("targetInfo") or {}
        if info.get("type") == "page":
            self.page_targets.add(info.get("targetId"))

    def _on_target_destroyed(self, params: dict[str, Any]) -> None:
        self.page_targets.discard(params.get("targetId"))

    def _tabs_coming(self) -> bool:
        """Whether chromium has opened more pages than Playwright has announced yet."""
        return len(self.page_targets) > self.announced_targets

    def _on_new_page(self, page: Any) -> None:
        if any(t.page is page for t in self.tabs.values()):
            return
        self.announced_targets += 1
        tab = self._add_tab(page)
        self.current = tab
        self._event({"kind": "new_tab", "tab": tab.id})

    def _on_close(self, tab: Tab) -> None:
        if self.tabs.pop(tab.id, None) is None:
            return
        self.announced_targets -= 1
        self._event({"kind": "tab_closed", "tab": tab.id})
        if self.current is tab:
            self.current = list(self.tabs.values())[-1] if self.tabs else None

    def _on_navigated(self, tab: Tab, frame: Any) -> None:
        if frame == tab.page.main_frame:
            tab.known_refs.clear()

    def _on_request(self, tab: Tab, request: Any) -> None:
        if request.resource_type in TRACKED_REQUESTS:
            tab.inflight.add(request)

    def _on_request_failed(self, tab: Tab, request: Any) -> None:
        tab.inflight.discard(request)
        error = request.failure or "failed"
        if "ERR_ABORTED" in error and request.resource_type == "document":
            return  # a navigation that became a download, or was replaced by another
        if len(self.failed) >= MAX_FAILED:
            self.failed_dropped += 1
            return
        self.failed.append(
            {
                "tab": tab.id,
                "url": request.url[:500],
                "method": request.method,
                "resource": request.resource_type,
                "error": str(error)[:200],
            }
        )

    def _on_dialog(self, tab: Tab, dialog: Any) -> None:
        info = {
            "kind": "dialog",
            "tab": tab.id,
            "type": dialog.type,
            "message": (dialog.message or "")[:2000],
            "default_value": (dialog.default_value or "")[:2000],
        }
        if dialog.type == "alert":
            choice, text, source = "accept", None, "an alert only has OK"
        else:
            choice, text, source = self.dialog_choice
        if choice == "ask":
            self.pending_dialog = (dialog, info)
            self.dialog_opened.set()
            return
        answering = asyncio.ensure_future(
            self._answer_dialog(dialog, info, choice == "accept", text, source)
        )
        self.dialog_answers.add(answering)
        answering.add_done_callback(self.dialog_answers.discard)

    async def _answer_dialog(
        self, dialog: Any, info: dict[str, Any], accept: bool, text: str | None, source: str
    ) -> None:
        try:
            if accept:
                await dialog.accept(text) if text is not None else await dialog.accept()
            else:
                await dialog.dismiss()
        except Exception as exc:
            info["error"] = first_line(exc)
        info["answer"] = "accepted" if accept else "dismissed"
        info["by"] = source
        if accept and text is not None:
            info["prompt_text"] = text[:2000]
        self._event(info)

    def _on_download(self, tab: Tab, download: Any) -> None:
        saving = save_download(self.workspace, tab.id, download, self._event)
        self.downloads.append(asyncio.ensure_future(saving))

    # --- one request ------------------------------------------------------------------

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        if self.gone:
            return {"ok": False, "error_kind": "browser_gone", "error": self.gone}
        action = request.get("action")
        handler = self._actions().get(action) if isinstance(action, str) else None
        timeout = request.get("timeout")
        if handler is None or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
            return {"ok": False, "error_kind": "bad_request", "error": "bad browser request"}
        deadline = started + float(timeout)
        self._choose_dialogs(request)
        try:
            if self.pending_dialog is not None and action not in ("dialog", "tabs"):
                raise ActionError("dialog_open", self._dialog_open_message())
            fields = await handler(request, deadline)
        except DialogPending:
            fields = {}
        except ActionError as exc:
            fields = {"ok": False, "error_kind": exc.kind, "error": str(exc)}
        except Exception as exc:  # Playwright's own errors: say what was asked and why not
            fields = self._failure(action, request, exc, timeout)
        finally:
            self.dialog_choice = (self.agent_dialog_default, None, "the agent's default")
        answer = await self._answer(fields)
        answer["elapsed_ms"] = round((time.monotonic() - started) * 1000, 1)
        return answer

    def _choose_dialogs(self, request: dict[str, Any]) -> None:
        default = request.get("dialog_default")
        if default in ("accept", "dismiss", "ask"):
            self.agent_dialog_default = default
        choice = request.get("dialog")
        if choice in ("accept", "dismiss"):
            text = request.get("prompt_text")
            self.dialog_choice = (choice, text if isinstance(text, str) else None, "this call")
        else:
            self.dialog_choice = (self.agent_dialog_default, None, "the agent's default")

    def _dialog_open_message(self) -> str:
        assert self.pending_dialog is not None
        info = self.pending_dialog[1]
        return (
            f"a {info['type']} dialog is open on tab {info['tab']} ({info['message']!r}); "
            "answer it first: action dialog with accept true or false"
        )

    def _failure(
        self, action: str, request: dict[str, Any], exc: Exception, timeout: float
    ) -> dict[str, Any]:
        try:
            target = target_of(request)
        except ActionError:
            target = None
        what = f"{action} on {describe(target)}" if target else action
        if is_timeout(exc):
            hint = call_log_hint(exc)
            message = f"{what} did not finish within {timeout:g} s" + (f": {hint}" if hint else "")
            return {"ok": False, "error_kind": "timeout", "error": message}
        return {"ok": False, "error_kind": "failed", "error": f"{what} failed: {first_line(exc)}"}

    # --- running actions so that dialogs can interrupt them -----------------------------

    async def _guarded(self, awaitable: Any, deadline: float) -> Any:
        """Await a page operation; if a dialog the model must answer opens meanwhile, leave
        the operation waiting behind it and raise DialogPending."""
        if self.pending_dialog is not None:
            raise DialogPending
        self.dialog_opened.clear()
        task = asyncio.ensure_future(awaitable)
        opened = asyncio.ensure_future(self.dialog_opened.wait())
        try:
            await asyncio.wait(
                {task, opened},
                timeout=max(0.0, deadline - time.monotonic()) + 2.0,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            opened.cancel()
        if task.done():
            return task.result()
        if self.pending_dialog is not None:
            self.blocked_action = task
            raise DialogPending
        task.cancel()
        raise ActionError("timeout", "the browser did not answer in time")

    async def _settle(self, deadline: float) -> None:
        """Let what the action started finish: a new tab's announcement, a navigation's
        load, then its requests and downloads."""
        await asyncio.sleep(0)
        tabs_by = min(deadline, time.monotonic() + TAB_WAIT_MAX)
        while self._tabs_coming():
            if time.monotonic() >= tabs_by:  # a page Playwright will not announce: stop waiting
                self.announced_targets = len(self.page_targets)
                break
            await asyncio.sleep(0.025)
        tab = self.current
        if tab is None:
            return
        load_by = min(deadline, time.monotonic() + LOAD_WAIT_MAX)
        with contextlib.suppress(Exception):
            await self._guarded(tab.page.wait_for_load_state("load", timeout=ms(load_by)), load_by)
        requests_by = min(deadline, time.monotonic() + REQUESTS_WAIT_MAX)
        waited = False
        while tab.inflight and time.monotonic() < requests_by:
            waited = True
            await asyncio.sleep(0.025)
        if waited:
            await asyncio.sleep(0.05)  # the page renders what the last response brought
        pending = [d for d in self.downloads if not d.done()] + list(self.dialog_answers)
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        self.downloads = [d for d in self.downloads if not d.done()]
        if self.pending_dialog is not None:
            raise DialogPending

    async def _snapshot(self, deadline: float) -> dict[str, Any]:
        tab = self._tab()
        text = await self._guarded(
            tab.page.aria_snapshot(mode="ai", timeout=ms(deadline + 5)), deadline + 5
        )
        tab.known_refs |= refs_in(text)
        return {"snapshot": text[:MAX_SNAPSHOT_CHARS]}

    def _tab(self) -> Tab:
        if self.current is None:
            raise ActionError("no_tab", "no tab is open; open a URL first")
        return self.current

    async def _after(self, deadline: float, **fields: Any) -> dict[str, Any]:
        await self._settle(deadline)
        return {**fields, **await self._snapshot(deadline)}

    async def _element(self, request: dict[str, Any], deadline: float) -> Any:
        target = target_of(request)
        if target is None:
            raise ActionError(
                "bad_request",
                f"{request.get('action')} needs an element: a ref from the snapshot, or role "
                "(and name), or a CSS selector",
            )
        tab = self._tab()
        return await self._guarded(locate(tab.page, target, tab.known_refs, deadline), deadline)

    # --- the answer -------------------------------------------------------------------

    async def _answer(self, fields: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = {"ok": True, **fields}
        list_tabs = answer.pop("list_tabs", False)
        tab = self.current
        if tab is not None:
            answer["tab"] = tab.id
            answer["url"] = tab.page.url
            answer["title"] = await self._title(tab)
        events, self.events = self.events, []
        for event in events:
            if event["kind"] == "new_tab" and event["tab"] in self.tabs:
                event["url"] = self.tabs[event["tab"]].page.url
        if events:
            answer["events"] = events
            list_tabs = list_tabs or any(e["kind"] in ("new_tab", "tab_closed") for e in events)
        if self.failed:
            answer["failed_requests"] = self.failed
            if self.failed_dropped:
                answer["failed_requests_dropped"] = self.failed_dropped
            self.failed, self.failed_dropped = [], 0
        if self.pending_dialog is not None:
            answer["dialog_open"] = {
                k: v for k, v in self.pending_dialog[1].items() if k not in ("kind",)
            }
            answer.pop("snapshot", None)
        if list_tabs:
            answer["tabs"] = [
                {"id": t.id, "url": t.page.url, "title": await self._title(t), "current": t is tab}
                for t in self.tabs.values()
            ]
        return answer

    async def _title(self, tab: Tab) -> str:
        if self.pending_dialog is not None and self.pending_dialog[1]["tab"] == tab.id:
            return ""  # the page's script is stopped by the dialog
        try:
            return (await asyncio.wait_for(tab.page.title(), 2.0))[:300]
        except Exception:
            return ""


def _tail(path: str, size: int = 1500) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return "(no log)"
