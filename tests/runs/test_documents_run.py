"""The documents tool's Must-hold run, end to end through the HTTP API with the scripted model
and a real gVisor sandbox from the docs image (documents_probe.py, in a network namespace of
its own): an invoice PDF rendered from HTML, an XLSX with a formula, a DOCX filled from a
template — each an artifact in the audit log with its hash, each checked here by parsing it
(the test's side only: aamp parses no document on the host). And the hostile parts: a zip-bomb
DOCX given to `read`, and HTML asking for a remote image and for file:///etc/passwd, are
refused; the egress ledger shows the refused fetch; the sandbox and the host keep working."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

import openpyxl
import pypdf
import pytest
from run_helpers import probe_in_netns

pytestmark = pytest.mark.usefixtures("docs_image")

PROBE = Path(__file__).with_name("documents_probe.py")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return probe_in_netns(PROBE, tmp_path_factory.mktemp("documents"))


def _file(report: dict, name: str) -> bytes:
    return base64.b64decode(report["files"][name])


def test_the_run_makes_three_artifacts_each_audited_with_its_hash(report: dict) -> None:
    run = report["run"]
    assert run["status"] == "succeeded", (run, report["tool_messages"])
    names = {a["name"] for a in report["artifacts"]}
    assert names == {"invoice.pdf", "totals.xlsx", "letter.docx"}
    audited = {
        r["details"]["name"]: r["details"]["sha256"]
        for r in report["audit"]
        if r["action"] == "run.artifact" and r["actor"] == f"run:{run['id']}"
    }
    for name in names:
        assert audited[name] == hashlib.sha256(_file(report, name)).hexdigest(), name
    assert report["sandboxes_after"] == []


def test_the_invoice_pdf_holds_its_text_and_nothing_it_was_refused(report: dict) -> None:
    pdf = pypdf.PdfReader(io.BytesIO(_file(report, "invoice.pdf")))
    text = "\n".join(page.extract_text() for page in pdf.pages)
    assert "Invoice INV-2024-017" in text and "Total due: 1,234.50 EUR" in text
    assert "Consulting, June" in text and "Page 1 of 1" in text
    assert "root:x:0:0" not in text
    assert pdf.metadata.title == "Invoice INV-2024-017"
    first = report["tool_messages"][0]
    assert "wrote /workspace/out/invoice.pdf" in first and "; 1 page)" in first
    # The allowed logo came through the proxy; the remote image was refused by the policy.
    assert "data.test/logo.png" in report["upstream_asked"]
    assert not any("remote.test" in asked for asked in report["upstream_asked"])
    assert "blocked by the egress policy:\n- remote.test:80" in first
    assert "file:///etc/passwd: file URLs outside /workspace are refused" in first
    refused = [
        r
        for r in report["audit"]
        if r["action"].startswith("egress.") and "remote.test" in str(r["details"])
    ]
    assert refused and all(r["decision"] != "allow" for r in refused), refused


def test_the_xlsx_formula_cell_reads_back(report: dict) -> None:
    book = openpyxl.load_workbook(io.BytesIO(_file(report, "totals.xlsx")))
    sheet = book["Totals"]
    assert sheet["B4"].value == "=SUM(B2:B3)" and sheet["B4"].font.b
    assert sheet["B2"].value == 1000 and sheet["B3"].value == 234.5
    assert sheet["B2"].number_format == "#,##0.00"
    assert sheet.column_dimensions["A"].width == 24
    assert sheet.freeze_panes == "A2"
    # Text that looks like a formula stays text: data never becomes a formula.
    assert sheet["A5"].data_type == "s" and sheet["A5"].value.startswith("=HYPERLINK")
    read_back = report["tool_messages"][5]
    assert '["total", "=SUM(B2:B3)"]' in read_back and "sheet 'Totals'" in read_back


def test_the_docx_template_is_filled_also_across_runs(report: dict) -> None:
    with zipfile.ZipFile(io.BytesIO(_file(report, "letter.docx"))) as z:
        body = z.read("word/document.xml").decode()
    assert "Ms Ada Lovelace" in body and "A-17" in body and "2024-07-01" in body
    assert "{{" not in body and "}}" not in body
    assert "filled date, name, order" in report["tool_messages"][2]


def test_a_zip_bomb_docx_is_refused_and_the_sandbox_goes_on(report: dict) -> None:
    bomb = report["tool_messages"][3]
    assert bomb.startswith("error: refused: word/document.xml unpacks") and "zip bomb" in bomb
    assert "Invoice INV-2024-017" in report["tool_messages"][4]  # read inside the sandbox
    assert "still-alive" in report["tool_messages"][6]
    assert report["health"] == 200
