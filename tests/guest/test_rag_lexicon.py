"""The lexical side of the knowledge-base search (`aamp.guest.rag_search.Lexicon`), on the host
over an FTS5 table of the index's own schema (the host's SQLite has FTS5; the vector table,
sqlite-vec's, is left out): the phrases that at least half the passages hold are left out of
what FTS5 is asked, which changes no BM25 score by more than FTS5's 1e-6 IDF floor allows,
and a query of nothing else is asked whole."""

from __future__ import annotations

import sqlite3

import pytest

from aamp.guest import rag_index
from aamp.guest.rag_search import Lexicon, bm25


def _index() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    for statement in rag_index._SCHEMA.split(";"):
        if statement.strip() and "vec0" not in statement:
            db.execute(statement)
    texts = [f"The harbour ledger {n} lists the copper lanterns of the valley." for n in range(32)]
    texts += [f"The harbour ferry {n} carries {40 + n} passengers across the valley."
              for n in range(8)]  # fmt: skip
    texts += ["A passengers' guide to the harbour ferry timetable."]
    for n, text in enumerate(texts):
        db.execute("INSERT INTO chunks VALUES (?, 'd', NULL, '', ?)", (n + 1, text))
        db.execute("INSERT INTO chunks_fts(rowid, section, text) VALUES (?, '', ?)", (n + 1, text))
    return db


def test_phrases_most_passages_hold_are_not_asked_and_the_ranking_stays() -> None:
    db = _index()
    lexicon = Lexicon(db)
    query = "How many passengers can the harbour ferry carry across the valley?"
    match = lexicon.match(query)
    assert match == '"how" OR "many" OR "passengers" OR "can" OR "ferry" OR "carry" OR "across"'
    whole = " OR ".join(f'"{w}"' for w in dict.fromkeys(query.lower().rstrip("?").split()))
    fewer, full = bm25(db, match, 9), bm25(db, whole, 9)
    assert [i for i, _ in fewer] == [i for i, _ in full]
    for (_, mine), (_, theirs) in zip(fewer, full, strict=True):
        assert mine == pytest.approx(theirs, abs=1e-5)
    # A passage that held only the common words is no longer a match: it scored ~0 anyway.
    assert len(bm25(db, whole, 100)) == 41 and len(bm25(db, match, 100)) == 9


def test_a_query_of_common_words_only_is_asked_whole_and_counts_are_kept() -> None:
    db = _index()
    lexicon = Lexicon(db)
    assert lexicon.match("the harbour") == '"the" OR "harbour"'
    assert lexicon.match("Harbour") == '"harbour"'
    assert lexicon.match("?!") is None
    asked: list[str] = []
    db.set_trace_callback(asked.append)
    assert lexicon.match("the Harbour ferry") == '"ferry"'
    assert [sql for sql in asked if "count" in sql] == [
        "SELECT count(*) FROM chunks_fts('\"ferry\"')"  # the other two were counted before
    ]
