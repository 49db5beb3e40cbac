"""Searching a knowledge-base index (`aamp.guest.rag_index`) inside a sandbox: by vector
(sqlite-vec's exact k-nearest neighbours on the e5 embeddings, cosine), by BM25 (FTS5), or
hybrid — the two rankings fused by reciprocal rank (RRF, k=60), which needs no score
calibration between them. The index is opened read-only and immutable: a search never writes.
"""

from __future__ import annotations

import re
import sqlite3

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MODES = ("hybrid", "vector", "bm25")
MAX_K = 50
# Each ranking contributes this many candidates to the fusion.
CANDIDATES = 50
RRF_K = 60
_WORD = re.compile(r"\w+", re.UNICODE)


def fts_query(query: str) -> str | None:
    """The query's words as an FTS5 OR of quoted terms: no operator of the user's reaches FTS5's
    query syntax. None if the query has no word."""
    words = list(dict.fromkeys(w.lower() for w in _WORD.findall(query)))[:64]
    return " OR ".join(f'"{w}"' for w in words) or None


def bm25(db: sqlite3.Connection, query: str, limit: int) -> list[tuple[int, float]]:
    match = fts_query(query)
    if match is None:
        return []
    rows = db.execute(
        "SELECT rowid, bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ? "
        "ORDER BY bm25(chunks_fts) LIMIT ?",
        (match, limit),
    )
    return [(int(r), -float(s)) for r, s in rows]  # FTS5's bm25 is lower-is-better


def vector(db: sqlite3.Connection, embedding: bytes, limit: int) -> list[tuple[int, float]]:
    rows = db.execute(
        "SELECT rowid, distance FROM chunks_vec WHERE embedding MATCH ? AND k = ?",
        (embedding, limit),
    )
    return [(int(r), 1.0 - float(d)) for r, d in rows]


def fuse(*rankings: list[tuple[int, float]]) -> list[tuple[int, float]]:
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, (chunk_id, _) in enumerate(ranking, 1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(scores.items(), key=lambda item: -item[1])


def search(
    db: sqlite3.Connection, embedder: object, query: str, k: int, mode: str
) -> list[dict[str, Any]]:
    """The k best passages for `query`, each with its document, page, section and score."""
    k = max(1, min(int(k), MAX_K))
    ranked: list[tuple[int, float]]
    if mode == "bm25":
        ranked = bm25(db, query, k)
    else:
        embedding = embedder.query(query).astype("float32").tobytes()  # type: ignore[attr-defined]
        if mode == "vector":
            ranked = vector(db, embedding, k)
        else:
            ranked = fuse(vector(db, embedding, CANDIDATES), bm25(db, query, CANDIDATES))[:k]
    passages = []
    for chunk_id, score in ranked:
        row = db.execute(
            "SELECT d.name, c.doc_id, c.page, c.section, c.text FROM chunks c "
            "JOIN documents d ON d.doc_id = c.doc_id WHERE c.id = ?",
            (chunk_id,),
        ).fetchone()
        if row is not None:
            name, doc_id, page, section, text = row
            passage = {"document": name, "doc_id": doc_id, "page": page, "section": section}
            passages.append({**passage, "text": text, "score": round(score, 6)})
    return passages
