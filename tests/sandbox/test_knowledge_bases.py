"""Knowledge bases as stored things (`aamp.catalog.knowledge_bases`), over one real gVisor
control plane shared by the module: documents checked as they come in, indexed in a rag
sandbox, the index kept under its SHA-256 as a new version; a hostile document (a zip bomb,
a PDF of a million page objects) fails alone with its reason; adding or removing one
document re-indexes only it; an index file that is not SQLite, or too big, is refused before
it is kept; nothing is left behind."""

from __future__ import annotations

import hashlib
import time

import pytest
from gvisor_plane import run_once
from rag_corpus import docx, markdown, real_million_page_pdf, zip_bomb_docx

from aamp.catalog.knowledge_bases import (
    Document,
    KnowledgeBaseError,
    KnowledgeBases,
    check_document,
)
from aamp.config import Settings
from aamp.errors import Conflict, InvalidInput, NotFound
from aamp.sandbox.manager import SandboxManager

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("rag_image")]

GUIDE = markdown(
    "Guide", [("Ferries", "The Orme ferry carries at most 412 passengers on its crossing.")]
)
LETTER = docx([("Vault", "The Quillfeather archive keeps its ledgers in vault seven.")])
LATER = b"<html><body><h2>Lighthouse</h2><p>The Pelican lighthouse is 88 m tall.</p></body></html>"


async def _scenario(settings: Settings, manager: SandboxManager) -> dict:
    kbs = KnowledgeBases(settings, manager)
    out: dict = {"progress": []}
    kbs.create("handbook", by="user:builder")
    with pytest.raises(Conflict):
        kbs.create("handbook", by="user:builder")
    first = [Document("guide.md", GUIDE), Document("letter.docx", LETTER),
             Document("bomb.docx", zip_bomb_docx()),
             Document("huge.pdf", real_million_page_pdf())]  # fmt: skip
    started = time.monotonic()
    out["v1"] = await kbs.add("handbook", first, by="user:builder",
                              progress=out["progress"].append)  # fmt: skip
    out["v1_seconds"] = time.monotonic() - started
    out["v2"] = await kbs.add("handbook", [Document("later.html", LATER)], by="user:builder")
    out["v3"] = await kbs.remove_document("handbook", "guide.md", by="user:admin")
    with pytest.raises(NotFound):
        await kbs.remove_document("handbook", "guide.md", by="user:admin")
    out["sandboxes_after"] = list(manager.list())
    out["leftovers"] = sorted(p.name for p in kbs.root.glob(".*"))
    out["kbs"] = kbs
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_once(tmp_path_factory.mktemp("kb") / "home", _scenario)


def _docs(shown: dict) -> dict[str, dict]:
    return {d["name"]: d for d in shown["document_list"]}


def test_documents_are_indexed_and_a_hostile_one_fails_alone_with_its_reason(report) -> None:
    v1 = _docs(report["v1"])
    assert v1["guide.md"]["status"] == "indexed" and v1["guide.md"]["chunks"] == 1
    assert v1["letter.docx"]["status"] == "indexed" and v1["letter.docx"]["chunks"] == 1
    assert v1["bomb.docx"]["status"] == "failed" and "zip bomb" in v1["bomb.docx"]["error"]
    # A million real page objects (79 MiB) under a page tree that says one, refused in the
    # indexing sandbox's child process while the others index: reading its cross-reference
    # table and million-kid page tree takes close to the child's 1 GiB of address space, so
    # either walking the tree finds too many pages, or the memory runs out first.
    print(f"four documents, one a million-page PDF, in {report['v1_seconds']:.1f} s")
    assert v1["huge.pdf"]["status"] == "failed", v1["huge.pdf"]
    assert v1["huge.pdf"]["error"] in (
        "refused: the PDF's page tree holds more than 5000 pages (it declares 1)",
        "text extraction ran out of memory (its limit: 1024 MiB)",
    )
    assert v1["guide.md"]["sha256"] == hashlib.sha256(GUIDE).hexdigest()
    assert report["v1"]["failed"] == 2 and report["v1"]["version"] == 1
    assert [p["done"] for p in report["progress"]] == [1, 2, 3, 4]
    assert [p["ok"] for p in report["progress"]] == [True, True, False, False]


def test_each_change_is_a_new_version_with_its_own_content_hashed_index(report) -> None:
    kbs = report["kbs"]
    versions = report["v3"]["versions"]
    assert [v["version"] for v in versions] == [1, 2, 3]
    assert versions[1]["added"] == ["later.html"] and versions[2]["removed"] == ["guide.md"]
    assert len({v["index"] for v in versions}) == 3
    for v in versions:
        path = kbs.index_path(v["index"])
        assert hashlib.sha256(path.read_bytes()).hexdigest() == v["index"]
        assert path.read_bytes()[:16] == b"SQLite format 3\x00"
    assert kbs.current_index("handbook") == (3, kbs.index_path(versions[2]["index"]))
    assert sorted(_docs(report["v3"])) == ["bomb.docx", "huge.pdf", "later.html", "letter.docx"]
    # Adding later.html kept letter.docx's entry as it was (only the new one was indexed).
    assert _docs(report["v2"])["letter.docx"] == _docs(report["v1"])["letter.docx"]


def test_nothing_is_left_behind(report) -> None:
    assert report["sandboxes_after"] == []
    assert report["leftovers"] == []  # no temporary index or record file


def test_documents_are_typed_and_sized_before_anything_is_kept() -> None:
    assert check_document("a.pdf", b"%PDF-1.4 ...") == "pdf"
    for name, data, rule in (
        ("a.exe", b"MZ", "takes pdf, docx"),
        ("a.pdf", b"<html>", "not a PDF"),
        ("a.docx", b"%PDF-", "not a ZIP"),
        ("a.md", b"\xff\xfe", "must be UTF-8"),
        ("../a.md", b"x", "no '/'"),
        (".hidden.md", b"x", "not starting with '.'"),
        ("a.md", b"", "1 to"),
    ):
        with pytest.raises(InvalidInput, match=rule):
            check_document(name, data)


def test_an_index_that_is_not_sqlite_or_too_big_is_refused_unopened(report, tmp_path) -> None:
    kbs = report["kbs"]
    before = sorted(p.name for p in (kbs.root / "indexes").iterdir())
    fake = tmp_path / "fake.sqlite"
    fake.write_bytes(b"<?php system($_GET['x']); ?>" + b"\0" * 4000)
    with pytest.raises(KnowledgeBaseError, match="not an SQLite database"):
        kbs.keep_index(fake)
    real = kbs.index_path(report["v3"]["index"]).read_bytes()
    fake.write_bytes(real + b"\0" * 4096)  # a page more than its header counts
    with pytest.raises(KnowledgeBaseError, match="counts"):
        kbs.keep_index(fake)
    assert sorted(p.name for p in (kbs.root / "indexes").iterdir()) == before
