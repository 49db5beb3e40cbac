"""`read`: text and tables out of PDF (pypdf), DOCX (python-docx), XLSX (openpyxl) and CSV,
by page (a PDF's pages, an XLSX's sheets; a DOCX or CSV is one page).

DOCX and XLSX are ZIP files, so before a library opens one `check_zip` holds it to what its
directory declares: at most MAX_MEMBERS members, MAX_UNPACKED bytes unpacked in all, and no
member that unpacks to over MAX_RATIO times its packed size once it is larger than 1 MB — a
zip bomb is refused before anything is inflated. (Python's zipfile never inflates a member past
the size the directory declares, so the declared sizes are the real bounds.) What a library
does with a valid but huge document is contained by the sandbox's own limits.
"""

from __future__ import annotations

import os
import zipfile

from aamp.guest.documents import DocumentError, read_csv, workspace_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_MEMBERS = 10_000
MAX_UNPACKED = 200_000_000
MAX_RATIO = 200
MAX_CHARS = 2_000_000
MAX_TABLE_ROWS = 10_000


def check_zip(path: str) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except zipfile.BadZipFile as exc:
        raise DocumentError(f"{os.path.basename(path)} is not a valid Office file: {exc}") from None
    if len(members) > MAX_MEMBERS:
        raise DocumentError(f"refused: {len(members)} parts in the file (at most {MAX_MEMBERS})")
    total = 0
    for member in members:
        total += member.file_size
        ratio = member.file_size / max(member.compress_size, 1)
        if member.file_size > 1_000_000 and ratio > MAX_RATIO:
            raise DocumentError(
                f"refused: {member.filename} unpacks {ratio:.0f} times its size "
                f"(a zip bomb?); at most {MAX_RATIO} times"
            )
    if total > MAX_UNPACKED:
        raise DocumentError(f"refused: {total} bytes unpacked (at most {MAX_UNPACKED})")


def _cells(rows: list[list[object]]) -> list[list[str]]:
    return [["" if v is None else str(v) for v in row] for row in rows[:MAX_TABLE_ROWS]]


def _pdf(path: str) -> list[dict[str, Any]]:
    from pypdf import PdfReader

    reader = PdfReader(path)
    return [
        {"page": n, "text": page.extract_text() or ""} for n, page in enumerate(reader.pages, 1)
    ]


def _docx(path: str) -> list[dict[str, Any]]:
    from docx import Document

    check_zip(path)
    document = Document(path)
    text = "\n".join(p.text for p in document.paragraphs)
    tables = [_cells([[c.text for c in row.cells] for row in t.rows]) for t in document.tables]
    return [{"page": 1, "text": text, "tables": tables}]


def _xlsx(path: str) -> list[dict[str, Any]]:
    from openpyxl import load_workbook

    check_zip(path)
    book = load_workbook(path, read_only=True)  # formulas as written, not cached values
    try:
        pages = []
        for n, sheet in enumerate(book.worksheets, 1):
            rows = [list(row) for row in sheet.iter_rows(values_only=True)]
            pages.append({"page": n, "sheet": sheet.title, "tables": [_cells(rows)]})
        return pages
    finally:
        book.close()


def read(request: dict[str, Any]) -> dict[str, Any]:
    path = workspace_file(request.get("path"))
    kind = os.path.splitext(path)[1].lower()
    readers = {".pdf": _pdf, ".docx": _docx, ".xlsx": _xlsx}
    if kind == ".csv":
        pages = [{"page": 1, "tables": [_cells(read_csv(path))]}]
    elif kind in readers:
        pages = readers[kind](path)
    else:
        raise DocumentError(f"read takes PDF, DOCX, XLSX or CSV files, not {kind or path}")
    wanted = request.get("pages")
    if isinstance(wanted, list) and len(wanted) == 2:
        pages = [p for p in pages if wanted[0] <= p["page"] <= wanted[1]]
    budget = int(request.get("max_chars") or MAX_CHARS)
    for page in pages:
        text = page.get("text")
        if isinstance(text, str):
            page["text"] = text[: max(budget, 0)]
            budget -= len(text)
    return {"ok": True, "path": os.path.relpath(path, "/workspace"), "pages": pages}
