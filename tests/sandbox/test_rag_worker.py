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
# sqlite-vec's own exact cosine search of each query (argv[1], JSON): the 50 nearest passages'
# texts and similarities, best first — what the worker's matrix must answer the same. The
# queries are embedded by the worker's own engine (`rag_engine`), so only the search differs.
SQLITE_VEC_NEAREST = r"""
import json, sys
sys.path.insert(0, "/opt/aamp/lib")
from aamp.guest import rag, rag_index
db = rag_index.connect("/workspace/kb/index.sqlite", read_only=True)
model, out = rag.Searcher().embedder(), []
for query in json.loads(sys.argv[1]):
    rows = db.execute(
        "SELECT c.text, 1 - v.distance FROM (SELECT rowid, distance FROM chunks_vec "
        "WHERE embedding MATCH ? AND k = 50) v JOIN chunks c ON c.id = v.rowid "
        "ORDER BY v.distance", (model.query(query).astype("float32").tobytes(),)).fetchall()
    out.append(rows)
print(json.dumps(out))
"""
# A copy of the index with one passage's vector made NaN, as a compromised indexer could.
POISON = r"""
import shutil, struct, sys
sys.path.insert(0, "/opt/aamp/lib")
from aamp.guest import rag_index
shutil.copy("/workspace/kb/index.sqlite", "/workspace/kb/poisoned.sqlite")
db = rag_index.connect("/workspace/kb/poisoned.sqlite")
rowid = db.execute("SELECT min(rowid) FROM chunks_vec").fetchone()[0]
db.execute("UPDATE chunks_vec SET embedding = ? WHERE rowid = ?",
           (struct.pack("384f", *([float("nan")] * 384)), rowid))
db.close()
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
if sys.argv[1:] == ["model"]:  # which of them have the model's weights mapped
    found = [pid for pid in found if "e5-small-q4.bin" in open(f"/proc/{pid}/maps").read()]
if sys.argv[1:] == ["kill"]:
    for pid in found:
        os.kill(pid, signal.SIGKILL)
print(json.dumps(found))
"""

# A searcher's query embeddings (argv[1]: queries, JSON), its model wrapped to count calls,
# and the plan of every FTS5 statement a hybrid search runs (traced as it runs).
SEARCHER = r"""
import json, sys
sys.path.insert(0, "/opt/aamp/lib")
import numpy as np
from aamp.guest import rag, rag_search

class CountingEmbedder:
    "A test double around the real model: counts the queries it embeds."
    def __init__(self, model):
        self.model, self.asked = model, []
    def query(self, text):
        self.asked.append(text)
        return self.model.query(text)

queries = json.loads(sys.argv[1])
searcher = rag.Searcher()
model = searcher.embedder()
counting = searcher._embedder = CountingEmbedder(model)
out = {"same_vector": [], "passages": []}
for query in [queries[0], queries[1], queries[0]]:
    out["passages"].append(rag.search(
        {"index": "kb/index.sqlite", "query": query, "k": 5, "mode": "hybrid"}, searcher
    )["passages"])
    out["same_vector"].append(bool(np.array_equal(searcher.embed(query), model.query(query))))
out["asked"] = list(counting.asked)
rag.QUERY_CACHE = 2
for query in queries[2:4] + queries[:1]:
    searcher.embed(query)
out["asked_after_bound"] = counting.asked[len(out["asked"]):]
db = searcher.index("/workspace/kb/index.sqlite").db
traced = []
db.set_trace_callback(traced.append)
rag_search.search(searcher.index("/workspace/kb/index.sqlite"), searcher.embed,
                  queries[4], 5, "hybrid")
db.set_trace_callback(None)
out["plans"] = [[row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql)]
                for sql in traced if "chunks_fts MATCH" in sql]
print(json.dumps(out))
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
        nearest = {"action": "search", "index": "kb/index.sqlite", "queries": queries,
                   "k": 50, "mode": "vector"}  # fmt: skip
        report["nearest_50"] = await call(channel, nearest, timeout=300)
        result, out, err = await channel.run(
            ["python3", "-c", SQLITE_VEC_NEAREST, json.dumps(queries)], timeout=300
        )
        assert result.exit_code == 0, err
        report["sqlite_vec_50"] = json.loads(out)
        result, _, err = await channel.run(["python3", "-c", POISON], timeout=60)
        assert result.exit_code == 0, err
        report["poisoned"] = {
            mode: await call(channel, {"action": "search", "index": "kb/poisoned.sqlite",
                                       "query": queries[0], "mode": mode}, timeout=120)
            for mode in ("vector", "bm25")
        }  # fmt: skip
        result, out, err = await channel.run(
            ["python3", "-c", SEARCHER, json.dumps(queries)], cwd="/workspace", timeout=300
        )
        assert result.exit_code == 0, err
        report["searcher"] = json.loads(out)
        report["resident"] = await _resident(channel, queries)
        report["started"] = await _started_ahead(channel, queries[0])
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
    out["timed"] = {
        mode: await worker.search(channel, {"index": "kb/index.sqlite", "query": queries[0],
                                            "k": 5, "mode": mode, "timings": True}, 120)
        for mode in ("hybrid", "vector", "bm25")
    }  # fmt: skip
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


async def _started_ahead(channel, query: str) -> dict:
    """A worker started before any search (as a run's sandbox starts it): the model is
    loaded with no search asked, and the first search is answered by that same process."""

    async def servers(*how: str) -> list[int]:
        result, out, err = await channel.run(["python3", "-c", SERVERS, *how], timeout=60)
        assert result.exit_code == 0, err
        return json.loads(out)

    worker = SearchWorker(warm=("kb/index.sqlite", "kb/missing.sqlite"))
    out: dict = {"before": await servers()}
    await worker.start(channel, 60)
    for _ in range(300):
        out["loaded"] = await servers("model")
        if out["loaded"]:
            break
        await asyncio.sleep(0.1)
    request = {"index": "kb/index.sqlite", "query": query, "k": 5, "mode": "hybrid"}
    out["answer"] = await worker.search(channel, request, 120)
    out["after"] = await servers()
    out["missing"] = await worker.search(channel, {**request, "index": "kb/missing.sqlite"}, 60)
    await worker.close()
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
    """A made-up code embeds like any other string; BM25 has it as a word of one passage."""
    for q in (q for q in CORPUS.questions if q.kind == "code"):
        bm25 = report["searches"][(q.text, "bm25")]["passages"]
        assert q.key in bm25[0]["text"], (q, bm25[:1])


def test_hybrid_keeps_what_bm25_is_sure_of_and_what_the_embeddings_are_sure_of(report) -> None:
    """Every passage shares a code question's other words, so only BM25's first stands out —
    by its score, not its rank: the fusion weighs how far each side's candidate stands out,
    and hybrid puts the coded passage first (a fusion of ranks let passages both sides put
    fairly high outscore it). And hybrid finds each question either side finds first."""
    for q in CORPUS.questions:
        hybrid = report["searches"][(q.text, "hybrid")]["passages"]
        if q.kind == "code":
            assert q.key in hybrid[0]["text"], (q, hybrid[:2])
        for mode in ("vector", "bm25"):
            if q.key in report["searches"][(q.text, mode)]["passages"][0]["text"]:
                assert any(q.key in p["text"] for p in hybrid), (q, mode, hybrid)


def test_the_vector_search_answers_sqlite_vec_s_exact_neighbours_in_the_same_order(
    report,
) -> None:
    """The worker's vector side is a matrix product over vectors read once; it must rank as
    sqlite-vec's exact cosine search does, with the same similarities."""
    assert report["nearest_50"]["ok"] is True, report["nearest_50"]
    for mine, theirs in zip(report["nearest_50"]["results"], report["sqlite_vec_50"], strict=True):
        assert [p["text"] for p in mine["passages"]] == [text for text, _ in theirs]
        for p, (_, similarity) in zip(mine["passages"], theirs, strict=True):
            assert p["score"] == pytest.approx(similarity, abs=1e-5)


def test_an_index_whose_vectors_are_not_numbers_is_refused_by_the_searching_worker(
    report,
) -> None:
    """What a compromised indexer wrote is checked where it is opened: vectors that are not
    finite numbers are refused, saying so, and its lexical side still answers."""
    assert report["poisoned"]["vector"] == {
        "ok": False,
        "error": "the index's vectors hold values that are not finite numbers",
    }
    assert report["poisoned"]["bm25"]["ok"] is True and report["poisoned"]["bm25"]["passages"]


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


def test_a_search_asked_for_its_timings_says_where_its_time_went_part_by_part(report) -> None:
    """With `timings`, a resident worker's answer carries the wall and CPU ms of each part its
    mode ran, in order, within the search's own time, and the same passages as untimed;
    without it, no parts."""
    resident = report["resident"]
    query = CORPUS.questions[0].text
    assert "parts" not in resident["answers"][0] and resident["answers"][0]["seconds"] > 0
    ran = {"hybrid": ["embed", "vector", "bm25", "fuse", "fetch"],
           "vector": ["embed", "vector", "fetch"], "bm25": ["bm25", "fetch"]}  # fmt: skip
    for mode, answer in resident["timed"].items():
        assert answer["ok"] is True, answer
        alone = report["searches"][(query, mode)]["passages"]
        assert [p["text"] for p in answer["passages"]] == [p["text"] for p in alone]
        wall, cpu = answer["parts"]["wall_ms"], answer["parts"]["cpu_ms"]
        assert list(wall) == list(cpu) == ran[mode], answer["parts"]
        assert all(v >= 0 for v in [*wall.values(), *cpu.values()]), answer["parts"]
        # The parts' clock starts a few microseconds before the search's own (`rag.search`
        # makes its `Parts` first): within 0.1 ms, the parts are the search's time.
        assert sum(wall.values()) <= answer["seconds"] * 1000 + 0.1, answer
    # The query was embedded by the untimed search before: its embedding is kept, so the
    # embedding part is a lookup, a sliver of the search.
    assert resident["timed"]["hybrid"]["parts"]["wall_ms"]["embed"] < 5


def test_a_resident_worker_reads_an_index_changed_under_its_path_afresh(report) -> None:
    answer = report["resident_after_reindex"]
    assert answer["ok"] is True, answer
    assert "The Pelican lighthouse is 88 m tall." in answer["passages"][0]["text"]


def test_a_worker_started_ahead_has_its_model_before_the_first_search(report) -> None:
    """`start` returns once the worker runs; it loads the model with no search asked (an
    index it cannot open ahead is left for the search that names it to say why), and the
    first search goes to that process."""
    started = report["started"]
    assert started["before"] == []
    assert len(started["loaded"]) == 1, started
    assert started["answer"]["ok"] is True and started["answer"]["passages"], started["answer"]
    assert started["after"] == started["loaded"]
    assert started["missing"]["ok"] is False
    assert "kb/missing.sqlite" in started["missing"]["error"], started["missing"]


def test_a_query_asked_again_is_not_embedded_again_and_gets_the_same_embedding(report) -> None:
    """The searcher keeps recent queries' embeddings (at most QUERY_CACHE, the oldest
    dropped): a query asked again is answered with the model's own embedding of it, and the
    same passages, without the model being asked."""
    searcher = report["searcher"]
    queries = [q.text for q in CORPUS.questions]
    assert searcher["asked"] == [queries[0], queries[1]]
    assert searcher["same_vector"] == [True, True, True]
    assert searcher["passages"][2] == searcher["passages"][0]
    assert searcher["passages"][0] == report["searches"][(queries[0], "hybrid")]["passages"]
    # Bounded to 2: the two new queries push out the others, so queries[0] is embedded again.
    assert searcher["asked_after_bound"] == [queries[2], queries[3], queries[0]]


def test_hybrid_never_hands_fts5_the_candidates_ids(report) -> None:
    """The candidates' BM25 is asked for with `+rowid IN (...)`, which SQLite checks itself;
    handed the ids, FTS5 would run the whole query once per id (13 times slower here). Both
    FTS5 statements of a hybrid search give FTS5 the MATCH alone."""
    plans = report["searcher"]["plans"]
    assert len(plans) == 2, plans
    for plan in plans:
        scans = [step for step in plan if "VIRTUAL TABLE" in step]
        # FTS5's plan string: "M" for the MATCH, "=" for a rowid handed to it.
        assert len(scans) == 1 and "=" not in scans[0].partition(" INDEX ")[2], plan
