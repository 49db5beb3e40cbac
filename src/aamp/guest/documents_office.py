"""`write_xlsx` (openpyxl) and `write_docx` (python-docx): Office files from typed content.

A spreadsheet cell is a JSON value — a number, a boolean, null, or text, which stays text even
when it starts with `=` (so data can never turn into a formula) — or an object:
`{"formula": "=SUM(B2:B4)"}`, `{"value": 12.5, "number_format": "0.00"}`,
`{"date": "2024-06-30"}`. A sheet may give its columns' widths and number formats.

A Word document is a list of blocks (heading, paragraph, table, image, page break), or a
template from the workspace whose `{{name}}` placeholders are replaced — in the body, tables,
headers and footers, also where Word split a placeholder over several runs of text. A
placeholder left without a value, or a value no placeholder asks for, is an error naming it.
"""

from __future__ import annotations

import datetime
import re

from aamp.guest.documents import DocumentError, output_file, workspace_file, written
from aamp.guest.documents_read import check_zip

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_CELLS = 2_000_000
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*\}\}")


def _cell(sheet: Any, row: int, col: int, value: object) -> None:
    cell = sheet.cell(row=row, column=col)
    if isinstance(value, dict):
        if "formula" in value:
            formula = str(value["formula"])
            cell.value = formula if formula.startswith("=") else "=" + formula
        elif "date" in value:
            cell.value = datetime.date.fromisoformat(str(value["date"]))
            cell.number_format = "yyyy-mm-dd"
        else:
            _cell(sheet, row, col, value.get("value"))
        if isinstance(value.get("number_format"), str):
            cell.number_format = value["number_format"]
        if value.get("bold") is True:
            from openpyxl.styles import Font

            cell.font = Font(bold=True)
        return
    cell.value = value
    if isinstance(value, str):
        cell.data_type = "s"  # text that starts with "=" is still text


def write_xlsx(request: dict[str, Any]) -> dict[str, Any]:
    from openpyxl import Workbook
    from openpyxl.utils import get_column_letter

    target = output_file(request.get("output"), ".xlsx")
    sheets = request.get("sheets")
    if not isinstance(sheets, list) or not sheets:
        raise DocumentError("write_xlsx needs at least one sheet")
    book = Workbook()
    book.remove(book.active)
    cells = 0
    for spec in sheets:
        sheet = book.create_sheet(title=str(spec.get("name") or f"Sheet{len(book.worksheets) + 1}"))
        for r, row in enumerate(spec.get("rows") or [], 1):
            cells += len(row)
            if cells > MAX_CELLS:
                raise DocumentError(f"more than {MAX_CELLS} cells")
            for c, value in enumerate(row, 1):
                _cell(sheet, r, c, value)
        for c, column in enumerate(spec.get("columns") or [], 1):
            letter = get_column_letter(c)
            if isinstance(column.get("width"), (int, float)):
                sheet.column_dimensions[letter].width = column["width"]
            if isinstance(column.get("number_format"), str):
                for (cell,) in sheet.iter_rows(min_col=c, max_col=c, min_row=2):
                    cell.number_format = column["number_format"]
        if spec.get("freeze_header"):
            sheet.freeze_panes = "A2"
    book.save(target)
    return written(target, sheets=[s.title for s in book.worksheets], cells=cells)


def xlsx_rows(path: str, sheet_name: object = None) -> list[list[object]]:
    from openpyxl import load_workbook

    check_zip(path)
    book = load_workbook(path, read_only=True)
    try:
        if sheet_name is not None and sheet_name not in book.sheetnames:
            raise DocumentError(f"no sheet {sheet_name!r}; the sheets are {book.sheetnames}")
        sheet = book[sheet_name] if sheet_name is not None else book.worksheets[0]
        return [["" if v is None else v for v in row] for row in sheet.iter_rows(values_only=True)]
    finally:
        book.close()


def _paragraphs(document: Any) -> Any:
    """Every paragraph of the document: body, tables (nested too), headers and footers."""

    def of(container: Any) -> Any:
        yield from container.paragraphs
        for table in getattr(container, "tables", []):
            for row in table.rows:
                for cell in row.cells:
                    yield from of(cell)

    yield from of(document)
    for section in document.sections:
        for part in (section.header, section.footer):
            yield from of(part)


def _fill(paragraph: Any, values: dict[str, str], used: set[str], missing: set[str]) -> None:
    text = "".join(run.text for run in paragraph.runs)
    if "{{" not in text:
        return

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            missing.add(name)
            return match.group(0)
        used.add(name)
        return values[name]

    filled = PLACEHOLDER.sub(value, text)
    if filled == text:
        return
    # The text goes into the first run (keeping its formatting); the others are emptied.
    runs = paragraph.runs
    runs[0].text = filled
    for run in runs[1:]:
        run.text = ""


def _template(request: dict[str, Any], target: str) -> dict[str, Any]:
    from docx import Document

    source = workspace_file(request["template"])
    check_zip(source)
    values = request.get("values") or {}
    values = {str(k): "" if v is None else str(v) for k, v in values.items()}
    document = Document(source)
    used: set[str] = set()
    missing: set[str] = set()
    for paragraph in _paragraphs(document):
        _fill(paragraph, values, used, missing)
    if missing:
        raise DocumentError(f"the template asks for values not given: {', '.join(sorted(missing))}")
    unused = sorted(set(values) - used)
    if unused:
        raise DocumentError(f"values no placeholder of the template asks for: {', '.join(unused)}")
    document.save(target)
    return written(target, filled=sorted(used))


def _block(document: Any, block: dict[str, Any]) -> None:
    from docx.shared import Cm

    if "heading" in block:
        document.add_heading(str(block["heading"]), level=int(block.get("level", 1)))
    elif "paragraph" in block:
        paragraph = document.add_paragraph()
        run = paragraph.add_run(str(block["paragraph"]))
        run.bold = block.get("bold") is True
        run.italic = block.get("italic") is True
    elif "table" in block:
        rows = block["table"]
        width = max((len(r) for r in rows), default=0)
        table = document.add_table(rows=len(rows), cols=width)
        table.style = "Table Grid"
        for r, row in enumerate(rows):
            for c, value in enumerate(row):
                table.cell(r, c).text = "" if value is None else str(value)
                if r == 0 and block.get("header", True):
                    for run in table.cell(r, c).paragraphs[0].runs:
                        run.bold = True
    elif "image" in block:
        width = block.get("width_cm")
        document.add_picture(workspace_file(block["image"]), width=Cm(width) if width else None)
    elif block.get("page_break"):
        document.add_page_break()
    else:
        raise DocumentError(f"unknown block {sorted(block)}")


def write_docx(request: dict[str, Any]) -> dict[str, Any]:
    from docx import Document

    target = output_file(request.get("output"), ".docx")
    if request.get("template"):
        return _template(request, target)
    blocks = request.get("blocks")
    if not isinstance(blocks, list) or not blocks:
        raise DocumentError("write_docx needs blocks, or a template and its values")
    document = Document()
    for block in blocks:
        _block(document, block)
    document.save(target)
    return written(target, blocks=len(blocks))
