"""Searching a knowledge-base index (`aamp.guest.rag_index`) inside a sandbox: by vector
(exact nearest neighbours on the e5 embeddings, cosine), by BM25 (FTS5), or hybrid — the
two scored over the union of their candidates and fused by how far each candidate stands out
in each ranking (`fuse`). The index is opened read-only and immutable: a search never writes.

The vector side does not go through sqlite-vec's scan: an `OpenIndex` reads the index's
vectors once into one normalised float32 matrix (`Vectors`), and a search is a
matrix-vector product and a partial sort — the same neighbours, in the same order, as
sqlite-vec's exact cosine search (tests/sandbox/test_rag_worker.py compares them), without
re-reading 10,000 rows through SQLite on each query.
"""

from __future__ import annotations

import re
import sqlite3
from statistics import fmean, pstdev

from aamp.guest.rag_index import DIM, NotAnIndex

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    import numpy as np

MODES = ("hybrid", "vector", "bm25")
MAX_K = 50
# Each ranking contributes this many candidates to the fusion.
CANDIDATES = 50
_WORD = re.compile(r"\w+", re.UNICODE)


def fts_query(query: str) -> str | None:
    """The query's words as an FTS5 OR of quoted terms: no operator of the user's reaches FTS5's
    query syntax. None if the query has no word."""
    words = list(dict.fromkeys(w.lower() for w in _WORD.findall(query)))[:64]
    return " OR ".join(f'"{w}"' for w in words) or None


def bm25(
    db: sqlite3.Connection, query: str, limit: int, among: list[int] | None = None
) -> list[tuple[int, float]]:
    """The best `limit` passages by BM25, higher is better; with `among`, only those ids (a
    passage that matches no word of the query is not among the answers)."""
    match = fts_query(query)
    if match is None:
        return []
    where, params = "chunks_fts MATCH ?", [match]
    if among is not None:
        # `+rowid`: SQLite filters the matches itself. A bare `rowid IN` is handed to FTS5,
        # which runs the whole query once per id: 3.7 against 0.3 ms for 50 ids on 10,000
        # passages, 79 against 6 ms when a word of the query is in all of them.
        where += f" AND +rowid IN ({','.join('?' * len(among))})"
        params += among
    rows = db.execute(
        f"SELECT rowid, bm25(chunks_fts) FROM chunks_fts WHERE {where} "
        "ORDER BY bm25(chunks_fts) LIMIT ?",
        (*params, limit),
    )
    return [(int(r), -float(s)) for r, s in rows]  # FTS5's bm25 is lower-is-better


class Vectors:
    """An index's passage embeddings as one matrix: row i is passage `ids[i]`, L2-normalised,
    so a dot product with a normalised query is the cosine similarity."""

    def __init__(self, ids: np.ndarray, matrix: np.ndarray) -> None:
        self.ids = ids
        self.matrix = matrix

    @classmethod
    def read(cls, db: sqlite3.Connection) -> Vectors:
        """The vectors of `chunks_vec`, each checked: DIM float32 values, all finite."""
        import numpy as np

        count = db.execute("SELECT count(*) FROM chunks_vec").fetchone()[0]
        ids = np.empty(count, dtype=np.int64)
        matrix = np.empty((count, DIM), dtype=np.float32)
        n = -1
        rows = db.execute("SELECT rowid, embedding FROM chunks_vec ORDER BY rowid")
        for n, (rowid, blob) in enumerate(rows):
            if n >= count or not isinstance(blob, bytes) or len(blob) != DIM * 4:
                raise NotAnIndex(f"the index's vector {rowid} is not {DIM} float32 values")
            ids[n] = rowid
            matrix[n] = np.frombuffer(blob, dtype=np.float32)
        if n + 1 != count:
            raise NotAnIndex(f"the index counts {count} vectors and holds {n + 1}")
        if not np.isfinite(matrix).all():
            raise NotAnIndex("the index's vectors hold values that are not finite numbers")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        matrix /= np.where(norms > 0, norms, 1)  # a zero vector stays zero: similarity 0
        return cls(ids, matrix)

    def similarities(self, query: np.ndarray) -> np.ndarray:
        """Every passage's cosine similarity to `query`, in the order of `ids`."""
        import numpy as np

        query = np.asarray(query, dtype=np.float32)
        norm = float(np.linalg.norm(query))
        return self.matrix @ (query / norm if norm > 0 else query)

    def nearest(self, similarities: np.ndarray, limit: int) -> list[tuple[int, float]]:
        """The `limit` most similar passages, best first."""
        import numpy as np

        limit = min(limit, len(self.ids))
        if limit <= 0:
            return []
        top = np.argpartition(-similarities, limit - 1)[:limit]
        top = top[np.argsort(-similarities[top], kind="stable")]
        return [(int(self.ids[i]), float(similarities[i])) for i in top]

    def of(self, similarities: np.ndarray, chunk_ids: list[int]) -> dict[int, float]:
        """The similarities of these passages (a passage without a vector is left out)."""
        import numpy as np

        wanted = np.asarray(chunk_ids, dtype=np.int64)
        at = np.searchsorted(self.ids, wanted).clip(0, max(len(self.ids) - 1, 0))
        found = {}
        for chunk_id, i in zip(chunk_ids, at.tolist(), strict=True):
            if len(self.ids) and self.ids[i] == chunk_id:
                found[chunk_id] = float(similarities[i])
        return found


class OpenIndex:
    """An index opened for searching: its connection, and its `Vectors`, read on the first
    search that needs them and kept for the others."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self._vectors: Vectors | None = None

    def vectors(self) -> Vectors:
        if self._vectors is None:
            self._vectors = Vectors.read(self.db)
        return self._vectors

    def close(self) -> None:
        self._vectors = None
        self.db.close()


def _standardised(scores: dict[int, float], ids: list[int]) -> dict[int, float]:
    """Each id's score as standard deviations from the mean of these ids' scores."""
    values = [scores[i] for i in ids]
    spread = pstdev(values) if len(values) > 1 else 0.0
    if spread == 0:
        return dict.fromkeys(ids, 0.0)
    mean = fmean(values)
    return {i: (scores[i] - mean) / spread for i in ids}


def fuse(similarity: dict[int, float], lexical: dict[int, float]) -> list[tuple[int, float]]:
    """Hybrid ranking of the candidates (the union of both sides' best): each side's score of
    every candidate, standardised over the candidates, summed. A side that is sure — one
    passage far ahead of the rest, as BM25 is for a rare token such as a register code, or the
    embeddings for a paraphrase — moves the fused order by as much as it stands out, which a
    fusion of ranks alone cannot see. A candidate that matches no word of the query has BM25
    score 0; every candidate has a similarity."""
    ids = list(similarity)
    vector_z = _standardised(similarity, ids)
    lexical_z = _standardised({i: lexical.get(i, 0.0) for i in ids}, ids)
    fused = {i: vector_z[i] + lexical_z[i] for i in ids}
    return sorted(fused.items(), key=lambda item: -item[1])


def search(
    index: OpenIndex,
    embed: Callable[[str], np.ndarray] | None,
    query: str,
    k: int,
    mode: str,
) -> list[dict[str, Any]]:
    """The k best passages for `query`, each with its document, page, section and score;
    `embed` gives a query's embedding (not needed for BM25)."""
    db = index.db
    k = max(1, min(int(k), MAX_K))
    ranked: list[tuple[int, float]]
    if mode == "bm25":
        ranked = bm25(db, query, k)
    else:
        vectors = index.vectors()
        similarities = vectors.similarities(embed(query))  # type: ignore[misc]
        if mode == "vector":
            ranked = vectors.nearest(similarities, k)
        else:
            nearest = vectors.nearest(similarities, CANDIDATES)
            lexical = dict(bm25(db, query, CANDIDATES))
            candidates = list(dict.fromkeys([i for i, _ in nearest] + list(lexical)))
            unscored = [i for i in candidates if i not in lexical]
            lexical.update(bm25(db, query, len(unscored), unscored) if unscored else [])
            ranked = fuse(vectors.of(similarities, candidates), lexical)[:k]
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
