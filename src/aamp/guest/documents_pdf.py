"""`render_pdf`: HTML or Markdown (through pandoc) with CSS to PDF, by WeasyPrint.

What a page may load is decided by `Fetcher`, WeasyPrint's only way to any resource:
`data:` URLs; `file:` URLs inside /workspace only (a symbolic link out of it is refused
too); `http:`/`https:` only through the sandbox's egress proxy (HTTP(S)_PROXY), which applies
the policy; nothing else. Each refusal is reported in the answer (the host adds the proxy's
own record of what it refused). Page size, margins and a header or footer (with `{page}` and
`{pages}`) become an `@page` rule ahead of the caller's CSS.
"""

from __future__ import annotations

import html
import os
import urllib.error
import urllib.parse
import urllib.request

from aamp.guest.documents import (
    WORKSPACE,
    DocumentError,
    markdown_to_html,
    output_file,
    workspace_file,
    written,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_RESOURCE_BYTES = 20_000_000
FETCH_TIMEOUT = 30.0
MAX_REFUSALS = 50


class Fetcher:
    """WeasyPrint's URL fetcher for one rendering; `refused` lists what it would not load."""

    def __init__(self) -> None:
        self.refused: list[dict[str, str]] = []
        proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("HTTP_PROXY")
        handlers = [urllib.request.ProxyHandler({"http": proxy, "https": proxy} if proxy else {})]
        self.opener = urllib.request.build_opener(*handlers)
        self.proxy = proxy

    def refuse(self, url: str, why: str) -> None:
        if len(self.refused) < MAX_REFUSALS:
            self.refused.append({"url": url[:2000], "reason": why[:500]})
        raise DocumentError(f"{url[:200]}: {why}")

    def __call__(self, url: str) -> dict[str, Any]:
        from weasyprint import default_url_fetcher

        scheme = urllib.parse.urlsplit(url).scheme.lower()
        if scheme == "data":
            return default_url_fetcher(url)
        if scheme == "file":
            path = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
            real = os.path.realpath(path)
            if not real.startswith(WORKSPACE + "/"):
                self.refuse(url, "file URLs outside /workspace are refused")
            return default_url_fetcher(url)
        if scheme in ("http", "https"):
            if not self.proxy:
                self.refuse(url, "no egress proxy is configured, so nothing is fetched")
            return self.fetch(url)
        return self.refuse(url, f"{scheme or 'this'} URLs are refused")

    def fetch(self, url: str) -> dict[str, Any]:
        try:
            response = self.opener.open(url, timeout=FETCH_TIMEOUT)
        except urllib.error.HTTPError as exc:
            rule = exc.headers.get("X-Aamp-Egress-Rule") if exc.headers else None
            why = f"refused by the egress policy ({rule})" if rule else f"HTTP {exc.code}"
            return self.refuse(url, why)
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            return self.refuse(url, f"not fetched: {reason}")
        with response:
            data = response.read(MAX_RESOURCE_BYTES + 1)
            if len(data) > MAX_RESOURCE_BYTES:
                return self.refuse(url, f"larger than {MAX_RESOURCE_BYTES} bytes")
            return {
                "string": data,
                "mime_type": response.headers.get_content_type(),
                "redirected_url": response.geturl(),
            }


def _css_string(text: str) -> str:
    """`text` as a CSS `content` value, `{page}` and `{pages}` as the page counters."""
    parts: list[str] = []
    for i, piece in enumerate(text.replace("{pages}", "\x00P").split("{page}")):
        if i:
            parts.append("counter(page)")
        for j, sub in enumerate(piece.split("\x00P")):
            if j:
                parts.append("counter(pages)")
            if sub:
                escaped = sub.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\A ")
                parts.append(f'"{escaped}"')
    return " ".join(parts) or '""'


def page_css(request: dict[str, Any]) -> str:
    size = request.get("page_size") or "A4"
    margin = request.get("margin") or "2cm"
    rules = [f"size: {size};", f"margin: {margin};"]
    for key, box in (("header", "top-center"), ("footer", "bottom-center")):
        text = request.get(key)
        if isinstance(text, str) and text:
            rules.append(f"@{box} {{ content: {_css_string(text)}; font-size: 9pt; }}")
    return "@page { " + " ".join(rules) + " }"


def _source(request: dict[str, Any]) -> str:
    if isinstance(request.get("html"), str):
        return request["html"]
    if isinstance(request.get("markdown"), str):
        body = markdown_to_html(request["markdown"])
        return f"<!doctype html><html><head><meta charset='utf-8'></head><body>{body}</body></html>"
    if request.get("path"):
        full = workspace_file(request["path"])
        with open(full, encoding="utf-8") as f:
            text = f.read()
        if full.lower().endswith((".md", ".markdown")):
            return _source({"markdown": text})
        return text
    raise DocumentError("render_pdf needs html, markdown or the path of an .html or .md file")


def render_pdf(request: dict[str, Any]) -> dict[str, Any]:
    from weasyprint import CSS, HTML

    source = _source(request)
    target = output_file(request.get("output"), ".pdf")
    fetcher = Fetcher()
    base = request.get("path")
    base_url = os.path.dirname(workspace_file(base)) + "/" if base else WORKSPACE + "/"
    document = HTML(string=source, base_url=base_url, url_fetcher=fetcher)
    sheets = [CSS(string=page_css(request), url_fetcher=fetcher)]
    if isinstance(request.get("css"), str):
        sheets.append(CSS(string=request["css"], base_url=base_url, url_fetcher=fetcher))
    rendered = document.render(stylesheets=sheets)
    rendered.write_pdf(target)
    title = html.unescape(rendered.metadata.title or "") if rendered.metadata else ""
    return written(target, pages=len(rendered.pages), refused=fetcher.refused, title=title)
