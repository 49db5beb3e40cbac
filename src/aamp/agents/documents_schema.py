"""The `documents` tool's JSON schema: what the model sees and what its calls are checked
against before anything reaches the sandbox (`aamp.agents.tools.ToolSet`). The work itself
happens in the sandbox (`aamp.guest.documents`)."""

from __future__ import annotations

from typing import Any

ACTIONS = ("render_pdf", "write_xlsx", "write_docx", "read", "convert")

DESCRIPTION = (
    "Make and read documents inside the sandbox (docs image). Paths are relative to "
    "/workspace; outputs go under out/ (e.g. out/report.pdf) and become the run's artifacts. "
    "Actions: render_pdf (html, markdown, or path of an .html/.md file; css; page_size such "
    "as A4, Letter or 'A4 landscape'; margin; header and footer text where {page} and "
    "{pages} are the page numbers; images and stylesheets load from /workspace or through "
    "the egress policy, nothing else); write_xlsx (sheets: name, rows of cells — a number, "
    "text, true/false, null, or {formula: '=SUM(B2:B9)'}, {value, number_format}, {date: "
    "'2024-06-30'} — columns: [{width, number_format}], freeze_header); write_docx (blocks: "
    "{heading, level}, {paragraph, bold, italic}, {table: rows, header}, {image: path, "
    "width_cm}, {page_break: true}; or template: a .docx in /workspace with {{name}} "
    "placeholders and values: {name: text}); read (path of a PDF, DOCX, XLSX or CSV: text and "
    "tables by page, an XLSX's sheets as pages, formulas as written; pages: [first, last]); "
    "convert (path and to: csv to xlsx, xlsx to csv (sheet), md to docx, md to pdf)."
)

_TEXT = {"type": "string", "maxLength": 10_000_000}
_SHORT = {"type": "string", "maxLength": 2000}
_CELL = {
    "oneOf": [
        {"type": ["string", "number", "boolean", "null"]},
        {
            "type": "object",
            "properties": {
                "formula": {"type": "string", "maxLength": 8000},
                "value": {"type": ["string", "number", "boolean", "null"]},
                "date": {"type": "string", "format": "date", "maxLength": 10},
                "number_format": {"type": "string", "maxLength": 200},
                "bold": {"type": "boolean"},
            },
            "additionalProperties": False,
        },
    ]
}
_SHEET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 31, "pattern": r"^[^\[\]:*?/\\]+$"},
        "rows": {
            "type": "array",
            "maxItems": 1_000_000,
            "items": {"type": "array", "items": _CELL},
        },
        "columns": {
            "type": "array",
            "maxItems": 16384,
            "items": {
                "type": "object",
                "properties": {
                    "width": {"type": "number", "minimum": 0, "maximum": 255},
                    "number_format": {"type": "string", "maxLength": 200},
                },
                "additionalProperties": False,
            },
        },
        "freeze_header": {"type": "boolean"},
    },
    "required": ["rows"],
    "additionalProperties": False,
}
_BLOCK = {
    "type": "object",
    "properties": {
        "heading": _SHORT,
        "level": {"type": "integer", "minimum": 0, "maximum": 9},
        "paragraph": _TEXT,
        "bold": {"type": "boolean"},
        "italic": {"type": "boolean"},
        "table": {"type": "array", "items": {"type": "array", "items": _CELL}},
        "header": {"type": "boolean"},
        "image": {"type": "string", "maxLength": 4096},
        "width_cm": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
        "page_break": {"const": True},
    },
    "minProperties": 1,
    "additionalProperties": False,
}
_PATH = {"type": "string", "minLength": 1, "maxLength": 4096}
_REQUIRED = {
    "render_pdf": {"required": ["output"], "anyOf": [
        {"required": ["html"]}, {"required": ["markdown"]}, {"required": ["path"]}]},
    "write_xlsx": {"required": ["output", "sheets"]},
    "write_docx": {"required": ["output"], "anyOf": [
        {"required": ["blocks"]}, {"required": ["template"]}]},
    "read": {"required": ["path"]},
    "convert": {"required": ["path", "to", "output"]},
}  # fmt: skip

SCHEMA: dict[str, Any] = {
    "description": DESCRIPTION,
    "parameters": {
        "type": "object",
        "properties": {
            "action": {"enum": list(ACTIONS)},
            "output": _PATH,
            "path": _PATH,
            "html": _TEXT,
            "markdown": _TEXT,
            "css": {"type": "string", "maxLength": 1_000_000},
            "page_size": {"type": "string", "maxLength": 60, "pattern": r"^[A-Za-z0-9. ]+$"},
            "margin": {"type": "string", "maxLength": 60, "pattern": r"^[A-Za-z0-9. %]+$"},
            "header": _SHORT,
            "footer": _SHORT,
            "sheets": {"type": "array", "minItems": 1, "maxItems": 255, "items": _SHEET},
            "blocks": {"type": "array", "minItems": 1, "maxItems": 100_000, "items": _BLOCK},
            "template": _PATH,
            "values": {
                "type": "object",
                "maxProperties": 10_000,
                "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
            },
            "pages": {
                "type": "array",
                "items": {"type": "integer", "minimum": 1},
                "minItems": 2,
                "maxItems": 2,
            },
            "max_chars": {"type": "integer", "minimum": 1, "maximum": 2_000_000},
            "to": {"enum": ["xlsx", "csv", "docx", "pdf"]},
            "sheet": {"type": "string", "maxLength": 31},
            "timeout": {"type": "integer", "minimum": 1, "maximum": 3600},
        },
        "required": ["action"],
        "additionalProperties": False,
        "allOf": [
            {"if": {"properties": {"action": {"const": a}}}, "then": rule}
            for a, rule in _REQUIRED.items()
        ],
    },
}
