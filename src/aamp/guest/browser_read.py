"""Reading a page for the model: its text in every frame (iframes and framesets included), one
element's text or form value, and tables as rows of cells.

Runs inside the guest (in the browser driver, with Playwright); never imports the host side.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_TEXT_CHARS = 400_000
MAX_ROWS = 2000
MAX_FRAMES = 50

# The text of one element as a person reads it: for form fields their current value (a
# select's chosen labels, a checkbox's state), otherwise the rendered text.
ELEMENT_TEXT = r"""
(el) => {
  const tag = el.tagName.toLowerCase();
  if (tag === "select") {
    return Array.from(el.selectedOptions).map(o => o.label).join(", ");
  }
  if (tag === "input") {
    const type = (el.type || "text").toLowerCase();
    if (type === "checkbox" || type === "radio") return el.checked ? "checked" : "not checked";
    if (type === "file") return Array.from(el.files || []).map(f => f.name).join(", ");
    if (type === "password") return el.value ? "(a password is filled in)" : "";
    return el.value;
  }
  if (tag === "textarea") return el.value;
  return el.innerText !== undefined ? el.innerText : el.textContent;
}
"""

# Every table inside `root` (or `root` itself when it is one), each as rows of cell texts.
TABLE_ROWS = r"""
(root, maxRows) => {
  root = root || document.body || document.documentElement;
  const tables = root.tagName && root.tagName.toLowerCase() === "table"
    ? [root] : Array.from(root.querySelectorAll("table"));
  let budget = maxRows;
  return tables.map(t => {
    const rows = [];
    for (const r of Array.from(t.rows)) {
      if (budget-- <= 0) break;
      rows.push(Array.from(r.cells).map(c => (c.innerText || "").replace(/\s+/g, " ").trim()));
    }
    const caption = t.caption ? t.caption.innerText.trim() : "";
    return {caption, rows, total: t.rows.length};
  });
}
"""

BODY_TEXT = "() => document.body ? document.body.innerText : ''"


def frame_label(frame: Any) -> str:
    name = f" {frame.name!r}" if frame.name else ""
    return f"frame{name} ({frame.url})"


async def page_text(page: Any) -> str:
    """The text of the page, then of each of its frames under a heading of its own."""
    parts = []
    for index, frame in enumerate(page.frames[:MAX_FRAMES]):
        try:
            text = await frame.evaluate(BODY_TEXT)
        except Exception:  # a frame that went away or is cross-process and not ready
            continue
        if not isinstance(text, str) or not text.strip():
            continue
        text = text.strip()
        parts.append(text if index == 0 else f"--- {frame_label(frame)} ---\n{text}")
    return "\n\n".join(parts)[:MAX_TEXT_CHARS]


async def element_text(locator: Any, timeout_ms: float) -> str:
    text = await locator.evaluate(ELEMENT_TEXT, timeout=timeout_ms)
    return str(text)[:MAX_TEXT_CHARS]


async def page_tables(page: Any) -> list[dict[str, Any]]:
    """Every table of the page and its frames."""
    found: list[dict[str, Any]] = []
    for frame in page.frames[:MAX_FRAMES]:
        try:
            tables = await frame.evaluate(f"(m) => ({TABLE_ROWS})(null, m)", MAX_ROWS)
        except Exception:
            continue
        where = "" if frame == page.main_frame else frame_label(frame)
        for table in tables:
            found.append({**table, "frame": where})
    return found


async def element_tables(locator: Any, timeout_ms: float) -> list[dict[str, Any]]:
    tables = await locator.evaluate(TABLE_ROWS, MAX_ROWS, timeout=timeout_ms)
    return [{**t, "frame": ""} for t in tables]
