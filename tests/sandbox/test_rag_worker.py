"""The rag image and its knowledge-base worker, in one real gVisor sandbox shared by the module
(indexing is the slow part, so it happens once): documents of every kind indexed with their
pages and sections, hostile ones failing alone with their reasons, searches by vector, BM25
and hybrid, one document re-indexed or removed without touching the others' rows, and the
index file that comes back passing the host's header check — while the sandbox has no way out
(the default rules refuse everything, so the model cannot have been downloaded)."""

from __future__ import annotations

import asyncio
import json

import pytest
from gvisor_plane import run_once
from rag_corpus import (
    looping_page_tree_pdf,
    make_corpus,
    malformed_html,
    million_page_pdf,
    shared_million_page_pdf,
    zip_bomb_docx,
)

from aamp.config import Settings
from aamp.sandbox.manager import CreateRequest, SandboxManager
from aamp.sandbox.rag_worker import BadIndex, SearchWorker, WorkerFailed, call, check_index_header

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("rag_image")]

CORPUS = make_corpus(passages=16)
HOSTILE = {
    "bomb.docx": zip_bomb_docx(),
    "million.pdf": million_page_pdf(),
    "shared.pdf": shared_million_page_pdf(),
    "loop.pdf": looping_page_tree_pdf(),
    "broken.html": malformed_html(),
    "notes.xlsx": b"PK\x03\x04 not a kind a knowledge base takes",
}
FILES = {**CORPUS.files, **HOSTILE}
IDS = {name: f"doc-{n}" for n, name in enumerate(sorted(FILES))}
# The rows of every document, by chunk id, read inside the sandbox (never on the host).
ROWS = r"""
import json, sqlite3
db = sqlite3.connect("file:/workspace/kb/index.sqlite?mode=ro", uri=True)
print(json.dumps(db.execute("SELECT doc_id, id, text FROM chunks ORDER BY id").fetchall()))
"""
# The pids of the guest's resident search workers (`aamp.guest.rag serve`); with "kill", killed.
SERVERS = r"""
import json, os, signal, sys
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    if b"aamp.guest.rag import main" in b" ".join(argv) and b"serve" in argv:
        found.append(int(pid))
if sys.argv[1:] == ["kill"]:
    for pid in found:
        os.kill(pid, signal.SIGKILL)
print(json.dumps(found))
"""


async def _scenario(_: Settings, manager: SandboxManager) -> dict:
    report: dict = {"searches": {}}
    sb = await manager.create(CreateRequest(image="rag"))
    async with manager.use(sb.id) as channel:
        for name, data in FILES.items():
            await channel.put(f"kb/docs/{name}", data, len(data))
        docs = [{"id": IDS[n], "name": n, "path": f"kb/docs/{n}"} for n in sorted(FILES)]
        index = {"action": "index", "index": "kb/index.sqlite", "documents": docs}
        report["index"] = await call(channel, index, timeout=900)

        async def rows() -> list:
            result, out, err = await channel.run(["python3", "-c", ROWS], timeout=60)
            assert result.exit_code == 0, err
            return json.loads(out)

        report["rows_before"] = await rows()
        queries = [q.text for q in CORPUS.questions]
        for mode in ("vector", "bm25", "hybrid"):
            request = {"action": "search", "index": "kb/index.sqlite",
                       "queries": queries, "k": 5, "mode": mode}  # fmt: skip
            answer = await call(channel, request, timeout=300)
            assert answer["ok"] is True, answer
            for query, result in zip(queries, answer["results"], strict=True):
                report["searches"][(query, mode)] = {"ok": True, **result}
        report["resident"] = await _resident(channel, queries)
        stream = await channel.get("kb/index.sqlite")
        report["index_size"] = stream.size
        report["index_head"] = b"".join([c async for c in stream])[:100]

        # Re-index one document with new text: only its rows change.
        changed = "md-guide-1.md"
        new_text = b"# Changed\n\n## Pelican lighthouse\n\nThe Pelican lighthouse is 88 m tall.\n"
        await channel.put(f"kb/docs/{changed}", new_text, len(new_text))
        again = {"action": "index", "index": "kb/index.sqlite",
                 "documents": [{"id": IDS[changed], "name": changed,
                                "path": f"kb/docs/{changed}"}]}  # fmt: skip
        report["reindex"] = await call(channel, again, timeout=300)
        report["rows_after_reindex"] = await rows()
        report["resident_after_reindex"] = (
            await report["resident"]
            .pop("worker")
            .search(
                channel, {"index": "kb/index.sqlite", "query": "Pelican lighthouse height"}, 120
            )
        )
        remove = {
            "action": "remove",
            "index": "kb/index.sqlite",
            "ids": [IDS["pdf-guide-1.pdf"]],
        }
        report["remove"] = await call(channel, remove, timeout=120)
        report["rows_after_remove"] = await rows()
        report["bad_request"] = await call(
            channel, {"action": "search", "index": "kb/index.sqlite", "query": "x",
                      "mode": "sql"}, timeout=60)  # fmt: skip
        report["fts_syntax"] = await call(
            channel, {"action": "search", "index": "kb/index.sqlite", "mode": "bm25",
                      "query": 'lighthouse" OR x MATCH "*) NEAR(', "k": 3},
            timeout=60)  # fmt: skip
    await manager.destroy(sb.id)
    return report


async def _resident(channel, queries: list[str]) -> dict:
    """Searches through one resident worker: its answers, the workers' pids as it goes, and
    what happens when it is killed, times out, or is asked something bad."""

    async def servers(*how: str) -> list[int]:
        result, out, err = await channel.run(["python3", "-c", SERVERS, *how], timeout=60)
        assert result.exit_code == 0, err
        return json.loads(out)

    worker = SearchWorker()
    out: dict = {"worker": worker, "before": await servers(), "answers": []}
    for query in queries[:6]:
        request = {"index": "kb/index.sqlite", "query": query, "k": 5, "mode": "hybrid"}
        out["answers"].append(await worker.search(channel, request, 120))
    out["after_six"] = await servers()
    out["bad"] = await worker.search(channel, {"index": "kb/index.sqlite", "query": ""}, 60)
    out["after_bad"] = await servers()
    out["killed"] = await servers("kill")
    try:
        await worker.search(channel, {"index": "kb/index.sqlite", "query": queries[0]}, 60)
    except WorkerFailed as exc:
        out["after_kill"] = str(exc)
    out["again"] = await worker.search(
        channel, {"index": "kb/index.sqlite", "query": queries[0]}, 60
    )
    out["restarted"] = await servers()
    try:
        await worker.search(channel, {"index": "kb/index.sqlite", "query": queries[1]}, 0.001)
    except WorkerFailed as exc:
        out["timed_out"] = str(exc)
    for _ in range(50):  # the guest kills the worker's process group as the host hangs up
        out["after_timeout"] = await servers()
        if not out["after_timeout"]:
            break
        await asyncio.sleep(0.1)
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_once(tmp_path_factory.mktemp("rag") / "home", _scenario)


def _by_name(report: dict) -> dict[str, dict]:
    names = {v: k for k, v in IDS.items()}
    return {names[d["id"]]: d for d in report["index"]["documents"]}


def test_every_kind_is_indexed_with_its_pages_and_hostile_documents_fail_alone(report) -> None:
    assert report["index"]["ok"] is True, report["index"]
    results = _by_name(report)
    for name in CORPUS.files:
        assert results[name]["ok"] is True and results[name]["chunks"] >= 1, results[name]
    assert results["pdf-guide-1.pdf"]["pages"] == 2
    assert "zip bomb" in results["bomb.docx"]["error"] and not results["bomb.docx"]["ok"]
    assert "declares 1000000 pages" in results["million.pdf"]["error"]
    # Its count says one page; walking its tree finds 5,001 before pypdf lists a page.
    assert results["shared.pdf"]["error"] == (
        "refused: the PDF's page tree holds more than 5000 pages (it declares 1)"
    )
    assert results["loop.pdf"]["error"] == "refused: the PDF's page tree has more than 20000 nodes"
    assert "not '.xlsx'" in results["notes.xlsx"]["error"]
    assert results["broken.html"]["ok"] is True  # the readable sentence of it is indexed
    texts = " ".join(text for _, _, text in report["rows_before"])
    assert "The Quillfeather archive keeps its ledgers in vault seven." in texts
    assert "not text" not in texts  # an HTML page's script is not passage text


def test_each_search_mode_finds_the_literal_question_s_passage_with_its_citation(report) -> None:
    for question in CORPUS.questions:
        if question.kind != "literal":
            continue
        for mode in ("vector", "bm25", "hybrid"):
            answer = report["searches"][(question.text, mode)]
            assert answer["ok"] is True, answer
            hits = [p for p in answer["passages"] if question.key in p["text"]]
            assert hits and hits[0]["document"] == question.document, (question, mode, answer)
            scores = [p["score"] for p in answer["passages"]]
            assert scores == sorted(scores, reverse=True) and len(scores) <= 5
            if question.document.endswith(".pdf"):
                assert hits[0]["page"] in (1, 2)
            else:
                assert hits[0]["page"] is None and hits[0]["section"], hits[0]


def test_hybrid_finds_most_paraphrased_questions_in_the_top_five(report) -> None:
    paraphrased = [q for q in CORPUS.questions if q.kind == "paraphrased"]
    found = sum(
        any(q.key in p["text"] for p in report["searches"][(q.text, "hybrid")]["passages"])
        for q in paraphrased
    )
    assert found >= len(paraphrased) * 0.75, (found, len(paraphrased))


def test_a_passage_asked_for_by_its_register_code_is_found_by_the_lexical_side(report) -> None:
    """A made-up code embeds like any other string; BM25 has it as a word of one passage.
    (Hybrid can lose it: every passage shares the question's other words, so passages ranked
    fairly by both sides outscore BM25's first in the fusion — benchmarks/rag.py measures
    how often.)"""
    for q in (q for q in CORPUS.questions if q.kind == "code"):
        bm25 = report["searches"][(q.text, "bm25")]["passages"]
        assert q.key in bm25[0]["text"], (q, bm25[:1])


def test_the_index_that_comes_back_passes_the_host_s_header_check(report) -> None:
    head, size = report["index_head"], report["index_size"]
    check_index_header(head, size)  # raises if it does not
    with pytest.raises(BadIndex, match="not an SQLite database"):
        check_index_header(b"SQLite format 2\x00" + head[16:], size)
    with pytest.raises(BadIndex, match="counts"):
        check_index_header(head, size + 4096)
    with pytest.raises(BadIndex, match="1 to 1000 bytes"):
        check_index_header(head, size, max_bytes=1000)


def test_re_indexing_or_removing_one_document_leaves_the_others_rows_alone(report) -> None:
    assert report["reindex"]["documents"][0]["ok"] is True
    changed = IDS["md-guide-1.md"]
    before = {tuple(r) for r in report["rows_before"] if r[0] != changed}
    after = {tuple(r) for r in report["rows_after_reindex"] if r[0] != changed}
    assert before == after  # same ids, same text: untouched
    new = [r for r in report["rows_after_reindex"] if r[0] == changed]
    assert [r[2] for r in new] == ["The Pelican lighthouse is 88 m tall."]
    removed = IDS["pdf-guide-1.pdf"]
    assert report["remove"]["ok"] is True
    assert {tuple(r) for r in report["rows_after_remove"]} == {
        tuple(r) for r in report["rows_after_reindex"] if r[0] != removed
    }


def test_bad_requests_are_refused_and_query_text_never_reaches_fts5_syntax(report) -> None:
    assert report["bad_request"] == {
        "ok": False,
        "error": "mode must be one of hybrid, vector, bm25",
    }
    answer = report["fts_syntax"]
    assert answer["ok"] is True, answer
    assert "Pelican lighthouse" in answer["passages"][0]["text"]


def test_a_resident_worker_answers_many_searches_as_one_process_and_restarts_when_gone(
    report,
) -> None:
    """The same passages as a process per search, from one worker process kept between
    searches; a bad request is answered and the worker stays; killed, the search that finds it
    gone fails, saying so, and the next starts a new one; a search that times out ends it."""
    resident = report["resident"]
    queries = [q.text for q in CORPUS.questions][:6]
    for query, answer in zip(queries, resident["answers"], strict=True):
        assert answer["ok"] is True, answer
        alone = report["searches"][(query, "hybrid")]["passages"]
        assert [p["text"] for p in answer["passages"]] == [p["text"] for p in alone]
    assert resident["before"] == []
    assert len(resident["after_six"]) == 1  # one worker for all six searches
    assert resident["bad"] == {"ok": False, "error": "a query is needed"}
    assert resident["after_bad"] == resident["after_six"] == resident["killed"]
    assert "the search worker stopped" in resident["after_kill"]
    assert resident["again"]["ok"] is True and resident["again"]["passages"]
    assert len(resident["restarted"]) == 1 and resident["restarted"] != resident["killed"]
    assert resident["timed_out"] == "the search worker took longer than 0.001 s"
    assert resident["after_timeout"] == []  # a worker whose answer is late is ended


def test_a_resident_worker_reads_an_index_changed_under_its_path_afresh(report) -> None:
    answer = report["resident_after_reindex"]
    assert answer["ok"] is True, answer
    assert "The Pelican lighthouse is 88 m tall." in answer["passages"][0]["text"]
