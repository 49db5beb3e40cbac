"""The documents worker: one process per `documents` call, inside a sandbox of the docs image.

The host's documents tool (`aamp.agents.documents_tool`) runs

    python3 -I -c "...; from aamp.guest.documents import main" LIB

with one JSON request on stdin (an `action` and its checked arguments) and reads one JSON
answer from the last line of stdout: `{"ok": true, ...}` or `{"ok": false, "error": ...}`.
Every document is parsed or rendered here, never on the host. Paths are relative to
/workspace and may not leave it (symbolic links included); whatever is written goes under
/workspace/out, where the run's artifacts are collected and checked against the policy.

Runs inside the guest with the docs image's Debian packages (WeasyPrint, openpyxl,
python-docx, pypdf, pandoc); never imports the host side.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

WORKSPACE = "/workspace"
OUT = WORKSPACE + "/out"
PANDOC_TIMEOUT = 120
MAX_CSV_CELLS = 5_000_000


class DocumentError(Exception):
    """A request this worker refuses or cannot carry out; the message is for the model."""


def workspace_file(path: object, *, must_exist: bool = True) -> str:
    """The real path of `path` (relative to /workspace, or absolute inside it)."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise DocumentError(f"bad path {path!r}")
    full = os.path.realpath(os.path.join(WORKSPACE, path))
    if full != WORKSPACE and not full.startswith(WORKSPACE + "/"):
        raise DocumentError(f"{path} is outside /workspace")
    if must_exist and not os.path.isfile(full):
        raise DocumentError(f"there is no file {path} in /workspace")
    return full


def output_file(path: object, suffix: str) -> str:
    """Where an output goes: under /workspace/out, with the expected suffix."""
    if not isinstance(path, str) or not path:
        raise DocumentError("an output path is needed")
    rel = path[len("out/") :] if path.startswith("out/") else path
    full = os.path.realpath(os.path.join(OUT, rel))
    if not full.startswith(OUT + "/"):
        raise DocumentError(f"outputs go under /workspace/out; {path} does not")
    if not full.lower().endswith(suffix):
        raise DocumentError(f"the output of this action is a {suffix} file; {path} is not")
    os.makedirs(os.path.dirname(full), exist_ok=True)
    return full


def written(full: str, **extra: Any) -> dict[str, Any]:
    return {"ok": True, "output": os.path.relpath(full, WORKSPACE), **extra,
            "size": os.path.getsize(full)}  # fmt: skip


def pandoc(args: list[str], stdin: bytes, *, sandbox: bool = True) -> bytes:
    """Pandoc, by default with `--sandbox`: it reads nothing but its input, fetches nothing."""
    try:
        done = subprocess.run(
            ["pandoc", *(["--sandbox"] if sandbox else []), *args],
            input=stdin,
            capture_output=True,
            cwd=WORKSPACE,
            timeout=PANDOC_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise DocumentError(f"pandoc took longer than {PANDOC_TIMEOUT} s") from None
    if done.returncode != 0:
        raise DocumentError("pandoc failed: " + done.stderr.decode("utf-8", "replace")[-1000:])
    return done.stdout


def markdown_to_html(markdown: str) -> str:
    return pandoc(["-f", "markdown", "-t", "html5"], markdown.encode()).decode()


def _images(node: object) -> Iterator[str]:
    """The targets of every image in a pandoc document (its JSON form)."""
    if isinstance(node, dict):
        if node.get("t") == "Image" and isinstance(node.get("c"), list) and len(node["c"]) == 3:
            target = node["c"][2]
            yield target[0] if isinstance(target, list) and target else ""
        for value in node.values():
            yield from _images(value)
    elif isinstance(node, list):
        for value in node:
            yield from _images(value)


def markdown_to_docx(markdown: bytes) -> bytes:
    """Pandoc's DOCX writer reads every image the text names, and pandoc 2.17's `--sandbox`
    breaks that writer; so the images are checked first (files in /workspace only, no URLs)
    and the conversion runs in /workspace without the sandbox."""
    tree = json.loads(pandoc(["-f", "markdown", "-t", "json"], markdown))
    for target in _images(tree):
        if "://" in target or target.startswith(("data:", "//")):
            raise DocumentError(f"image {target[:200]}: only images in /workspace go into a DOCX")
        workspace_file(target)
    args = ["-f", "json", "-t", "docx", "--resource-path", WORKSPACE, "-o", "-"]
    return pandoc(args, json.dumps(tree).encode(), sandbox=False)


def read_csv(full: str) -> list[list[str]]:
    with open(full, newline="", encoding="utf-8-sig") as f:
        rows, cells = [], 0
        for row in csv.reader(f):
            cells += len(row)
            if cells > MAX_CSV_CELLS:
                raise DocumentError(f"the CSV has more than {MAX_CSV_CELLS} cells")
            rows.append(row)
    return rows


def typed(text: str) -> object:
    """A CSV cell as the number it spells, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def convert(request: dict[str, Any]) -> dict[str, Any]:
    from aamp.guest import documents_office, documents_pdf

    source = workspace_file(request.get("path"))
    to = request.get("to")
    kind = os.path.splitext(source)[1].lower().lstrip(".")
    if (kind, to) == ("csv", "xlsx"):
        rows = [[typed(c) for c in row] for row in read_csv(source)]
        name = os.path.splitext(os.path.basename(source))[0][:31] or "Sheet1"
        sheet = {"name": name, "rows": rows}
        return documents_office.write_xlsx({"output": request.get("output"), "sheets": [sheet]})
    if (kind, to) == ("xlsx", "csv"):
        target = output_file(request.get("output"), ".csv")
        rows = documents_office.xlsx_rows(source, request.get("sheet"))
        with open(target, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(rows)
        return written(target, rows=len(rows))
    if (kind, to) == ("md", "docx"):
        target = output_file(request.get("output"), ".docx")
        with open(source, "rb") as f:
            data = markdown_to_docx(f.read())
        with open(target, "wb") as f:
            f.write(data)
        return written(target)
    if (kind, to) == ("md", "pdf"):
        with open(source, encoding="utf-8") as f:
            markdown = f.read()
        return documents_pdf.render_pdf({**request, "markdown": markdown})
    raise DocumentError(
        f"cannot convert {kind or 'a file without a suffix'} to {to}; the conversions are "
        "csv to xlsx, xlsx to csv, md to docx and md to pdf"
    )


def handle(request: dict[str, Any]) -> dict[str, Any]:
    from aamp.guest import documents_office, documents_pdf, documents_read

    action = request.get("action")
    if action == "render_pdf":
        return documents_pdf.render_pdf(request)
    if action == "write_xlsx":
        return documents_office.write_xlsx(request)
    if action == "write_docx":
        return documents_office.write_docx(request)
    if action == "read":
        return documents_read.read(request)
    if action == "convert":
        return convert(request)
    raise DocumentError(f"there is no documents action {action!r}")


def main(argv: list[str]) -> int:
    del argv
    try:
        request = json.load(sys.stdin)
        if not isinstance(request, dict):
            raise DocumentError("the request is not a JSON object")
        answer = handle(request)
    except DocumentError as exc:
        answer = {"ok": False, "error": str(exc)}
    except ImportError as exc:
        answer = {"ok": False, "error": f"the documents tool needs the docs image: {exc}"}
    except Exception as exc:  # a library's failure on a bad document is the model's to read
        answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    return 0
