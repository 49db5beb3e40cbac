"""Text out of one document for a knowledge base, as sections: `(page, section, text)` each —
a PDF's pages, the headings of DOCX, HTML and Markdown (their page is None), a plain text file
as one section. Runs in a child process of the indexer (`aamp.guest.rag`), one per document,
under its own memory and CPU limits, so a document that exhausts them fails only itself.

Hostile input: a DOCX goes through `documents_read.check_zip` (zip bombs) before python-docx
opens it; a PDF is refused past MAX_PAGES pages — the count its page tree declares is read
first, then the tree itself is walked, each reference to a page counted, within a bounded
number of steps (`count_pages`): a tree whose count lies, whose nodes are shared so a few
objects make a million pages, or which loops, is refused before pypdf lists its pages (which
it would do all at once, a million of them in 10 s and 600 MB) — and text stops at MAX_CHARS;
HTML goes through the standard library's forgiving parser, which never raises on bad markup.
"""

from __future__ import annotations

import json
import os
import re
import sys
from html.parser import HTMLParser

from aamp.guest.documents import DocumentError
from aamp.guest.documents_read import check_zip

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    Section = tuple[int | None, str, str]

MAX_PAGES = 5_000
# Nodes a page tree may have per page it may hold (intermediate nodes, kids that go nowhere).
PAGE_TREE_STEPS = 4
MAX_CHARS = 20_000_000
KINDS = (".pdf", ".docx", ".html", ".htm", ".md", ".markdown", ".txt")


def count_pages(root: Any, declared: int, limit: int = MAX_PAGES) -> int:
    """The pages under page-tree node `root` (a pypdf dictionary), each reference counted —
    a viewer shows a page once per reference — or DocumentError past `limit` pages, or past
    PAGE_TREE_STEPS nodes visited (a loop, or kids that are not pages at all)."""
    pages, steps, todo = 0, 0, [root]
    while todo:
        node = todo.pop()
        steps += 1
        if steps > limit * PAGE_TREE_STEPS:
            raise DocumentError(
                f"refused: the PDF's page tree has more than {limit * PAGE_TREE_STEPS} nodes"
            )
        node = node.get_object() if hasattr(node, "get_object") else node
        kids = node.get("/Kids") if hasattr(node, "get") else None
        if kids is None:
            pages += 1
            if pages > limit:
                raise DocumentError(
                    f"refused: the PDF's page tree holds more than {limit} pages "
                    f"(it declares {declared})"
                )
            continue
        todo.extend(kids.get_object() if hasattr(kids, "get_object") else kids)
    return pages


def _pdf(path: str) -> Iterator[Section]:
    from pypdf import PdfReader

    reader = PdfReader(path)
    try:
        tree = reader.trailer["/Root"]["/Pages"]
        declared = int(tree["/Count"])
    except (KeyError, TypeError, ValueError):
        tree, declared = None, 0
    if declared > MAX_PAGES:
        raise DocumentError(f"refused: the PDF declares {declared} pages (at most {MAX_PAGES})")
    if tree is not None:
        count_pages(tree, declared)
    for number, page in enumerate(reader.pages, 1):
        if number > MAX_PAGES:
            raise DocumentError(f"refused: the PDF has more than {MAX_PAGES} pages")
        yield number, "", page.extract_text() or ""


def _docx(path: str) -> Iterator[Section]:
    from docx import Document

    check_zip(path)
    heading, lines = "", []
    for paragraph in Document(path).paragraphs:
        style = (paragraph.style.name or "") if paragraph.style is not None else ""
        if style.startswith(("Heading", "Title")) and paragraph.text.strip():
            if lines:
                yield None, heading, "\n".join(lines)
            heading, lines = paragraph.text.strip(), []
        else:
            lines.append(paragraph.text)
    if lines:
        yield None, heading, "\n".join(lines)


class _HtmlSections(HTMLParser):
    """Text by heading (h1-h3); script, style and template contents are dropped."""

    HEADINGS = ("h1", "h2", "h3")
    SKIP = ("script", "style", "template", "noscript")

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[Section] = []
        self.heading, self.parts, self.heading_parts = "", [], []
        self.in_heading = False
        self.skipping = 0

    BLOCKS = ("p", "br", "li", "div", "tr", "table", "ul", "ol", "section", "article")

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.HEADINGS:
            self.end_heading()
            self.flush()
            self.in_heading, self.heading_parts = True, []
        elif tag in self.BLOCKS:
            self.end_heading()  # an unclosed heading ends where a block starts
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skipping = max(self.skipping - 1, 0)
        elif tag in self.HEADINGS:
            self.end_heading()

    def end_heading(self) -> None:
        if self.in_heading:
            self.in_heading = False
            self.heading = " ".join("".join(self.heading_parts).split())[:300]

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            (self.heading_parts if self.in_heading else self.parts).append(data)

    def flush(self) -> None:
        text = "".join(self.parts).strip()
        if text:
            self.sections.append((None, self.heading, text))
        self.parts = []


def _html(path: str) -> Iterator[Section]:
    parser = _HtmlSections()
    with open(path, encoding="utf-8", errors="replace") as f:
        parser.feed(f.read(MAX_CHARS))
    parser.close()
    parser.end_heading()
    parser.flush()
    yield from parser.sections


_ATX = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _markdown(path: str) -> Iterator[Section]:
    heading, lines, fenced = "", [], False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f.read(MAX_CHARS).splitlines():
            if line.lstrip().startswith(("```", "~~~")):
                fenced = not fenced
            match = None if fenced else _ATX.match(line)
            if match:
                if "".join(lines).strip():
                    yield None, heading, "\n".join(lines)
                heading, lines = match.group(2), []
            else:
                lines.append(line)
    if "".join(lines).strip():
        yield None, heading, "\n".join(lines)


def _text(path: str) -> Iterator[Section]:
    with open(path, encoding="utf-8", errors="replace") as f:
        yield None, "", f.read(MAX_CHARS)


def sections(path: str) -> list[Section]:
    """Every section of the document at `path`, its text cut at MAX_CHARS in all."""
    kind = os.path.splitext(path)[1].lower()
    readers = {".pdf": _pdf, ".docx": _docx, ".html": _html, ".htm": _html,
               ".md": _markdown, ".markdown": _markdown, ".txt": _text}  # fmt: skip
    if kind not in readers:
        raise DocumentError(f"a knowledge base takes {', '.join(KINDS)} files, not {kind!r}")
    out, budget = [], MAX_CHARS
    for page, section, text in readers[kind](path):
        text = text[:budget]
        budget -= len(text)
        if text.strip():
            out.append((page, section[:300], text))
        if budget <= 0:
            break
    return out


def main(argv: list[str]) -> int:
    """The child process: the document's path as argv[0], its sections as JSON on stdout."""
    try:
        answer: dict[str, object] = {"ok": True, "sections": sections(argv[0])}
    except DocumentError as exc:
        answer = {"ok": False, "error": str(exc)}
    except Exception as exc:  # a library's failure on a bad document fails that document only
        answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1000]}
    sys.stdout.write(json.dumps(answer))
    return 0
