"""Which element a browser action means: a ref from the snapshot, an exact role and name, or a
CSS selector, optionally inside one frame — and nothing else.

There is no fuzzy matching: a role's name is compared exactly (Playwright's `exact=True`), a
selector that matches several elements is an error that says how many, and so is one that
matches none within the call's timeout. Refs are the ones Playwright's AI snapshot printed
(`[ref=e12]`, `f1e3` inside frames); a ref the tab has not shown since its last navigation
is refused at once, without waiting, because it cannot mean anything on the current page.

Runs inside the guest (in the browser driver, with Playwright); never imports the host side.
"""

from __future__ import annotations

import re
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

REF_RE = re.compile(r"^(?:f[0-9]+)?e[0-9]+\Z")
ROLE_RE = re.compile(r"^[a-z]{2,40}\Z")
SNAPSHOT_REF_RE = re.compile(r"\[ref=((?:f[0-9]+)?e[0-9]+)\]")


class ActionError(Exception):
    """An action that cannot be done as asked; `kind` is stable, the message is for the model."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def describe(target: dict[str, Any]) -> str:
    """The target as the model wrote it, for messages."""
    if target.get("ref"):
        where = f"ref {target['ref']}"
    elif target.get("role"):
        name = target.get("name")
        where = f"role {target['role']}" + (f" named {name!r}" if name is not None else "")
    else:
        where = f"selector {target.get('selector')!r}"
    if target.get("frame"):
        where += f" in frame {target['frame']!r}"
    return where


def target_of(request: dict[str, Any]) -> dict[str, Any] | None:
    """The addressing fields of a request, checked: exactly one way of addressing, or None
    when the request names no element at all."""
    given = [k for k in ("ref", "role", "selector") if request.get(k) is not None]
    if request.get("name") is not None and request.get("role") is None:
        raise ActionError("bad_request", "name is only used together with role")
    if not given:
        if request.get("frame") is not None:
            raise ActionError("bad_request", "frame needs a role, selector or ref inside it")
        return None
    if len(given) > 1:
        raise ActionError(
            "bad_request",
            f"give one way to address the element, not {' and '.join(given)}: a ref from the "
            "snapshot, or role (with name), or a CSS selector",
        )
    target = {k: request.get(k) for k in ("ref", "role", "name", "selector", "frame")}
    for key, value in target.items():
        if value is not None and not isinstance(value, str):
            raise ActionError("bad_request", f"{key} must be a string")
    if target["ref"] is not None and not REF_RE.match(target["ref"]):
        raise ActionError("bad_request", f"{target['ref']!r} is not a ref such as e12 or f1e3")
    if target["role"] is not None and not ROLE_RE.match(target["role"]):
        raise ActionError("bad_request", f"{target['role']!r} is not an ARIA role such as button")
    if target["ref"] is not None and target["frame"] is not None:
        raise ActionError("bad_request", "a ref already names its frame; leave out frame")
    return target


def refs_in(snapshot: str) -> set[str]:
    return set(SNAPSHOT_REF_RE.findall(snapshot))


async def scope_of(page: Any, frame: str | None, known_refs: set[str], deadline: float) -> Any:
    """The page, or the frame named by `frame`: the ref of its <iframe>/<frame> element in the
    snapshot, or its exact name attribute."""
    if frame is None:
        return page
    if REF_RE.match(frame):
        if frame not in known_refs:
            raise ActionError("stale_ref", _unknown_ref(frame))
        handle = await page.get_by_ref(frame).element_handle(timeout=ms(deadline))
        content = await handle.content_frame() if handle is not None else None
        if content is None:
            raise ActionError("not_a_frame", f"ref {frame} is not an iframe or frame element")
        return content
    for candidate in page.frames:
        if candidate.name == frame:
            return candidate
    names = sorted({f.name for f in page.frames if f.name})
    listed = ", ".join(repr(n) for n in names) or "none has a name"
    raise ActionError("no_frame", f"no frame is named {frame!r} on this page ({listed})")


async def locator_for(
    page: Any, target: dict[str, Any], known_refs: set[str], deadline: float
) -> Any:
    """The Playwright locator for `target`, without waiting for anything to match it."""
    ref = target.get("ref")
    if ref is not None:
        if ref not in known_refs:
            raise ActionError("stale_ref", _unknown_ref(ref))
        return page.get_by_ref(ref)
    scope = await scope_of(page, target.get("frame"), known_refs, deadline)
    if target.get("role") is not None:
        if target.get("name") is not None:
            return scope.get_by_role(target["role"], name=target["name"], exact=True)
        return scope.get_by_role(target["role"])
    return scope.locator(target["selector"])


async def locate(page: Any, target: dict[str, Any], known_refs: set[str], deadline: float) -> Any:
    """The one element `target` means, waiting for it until `deadline` (time.monotonic());
    `ActionError` if there is none by then, or if there is more than one."""
    locator = await locator_for(page, target, known_refs, deadline)
    budget = max(0.0, deadline - time.monotonic())
    count = await locator.count()  # usually the element is there: no wait, one round trip
    if count == 0:
        try:
            await locator.first.wait_for(state="attached", timeout=ms(deadline))
        except Exception as exc:
            if not is_timeout(exc):
                raise ActionError("bad_target", f"{describe(target)}: {first_line(exc)}") from None
            waited = f"waited {budget:.1f} s"
            if target.get("ref") is not None:
                raise ActionError(
                    "not_found",
                    f"ref {target['ref']} no longer matches an element: the page changed since "
                    f"the snapshot; take a new snapshot ({waited})",
                ) from None
            missing = f"no element matches {describe(target)} ({waited})"
            raise ActionError("not_found", missing) from None
        count = await locator.count()
    if count > 1:
        raise ActionError(
            "ambiguous",
            f"{count} elements match {describe(target)}; address one of them by its ref from "
            "the snapshot, or with a more precise selector",
        )
    return locator


def _unknown_ref(ref: str) -> str:
    return (
        f"ref {ref} is not on the current page: refs are only valid until the tab navigates; "
        "take a new snapshot and use a ref from it"
    )


def ms(deadline: float) -> float:
    """Milliseconds until `deadline`, at least 1 (Playwright reads 0 as 'no timeout')."""
    return max(1.0, (deadline - time.monotonic()) * 1000)


def is_timeout(exc: BaseException) -> bool:
    return type(exc).__name__ == "TimeoutError" or "Timeout" in first_line(exc)


def first_line(exc: BaseException) -> str:
    """A Playwright error's first line, without its 'Locator.click: ' prefix."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"^[A-Za-z]+\.[A-Za-z_]+: ", "", text)[:500]


def call_log_hint(exc: BaseException) -> str:
    """What Playwright was waiting for when an action timed out, from its call log."""
    lines = [line.strip(" -") for line in str(exc).splitlines()]
    for line in reversed(lines):
        for hint in ("not visible", "not enabled", "disabled", "not stable", "intercepts"):
            if hint in line:
                return line[:300]
    return ""
