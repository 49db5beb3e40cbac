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

import math
import re
import sqlite3
import time

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


def _phrases(query: str) -> list[str]:
    """The query's distinct words (at most 64), each an FTS5 quoted phrase: no operator of
    the user's reaches FTS5's query syntax."""
    words = list(dict.fromkeys(w.lower() for w in _WORD.findall(query)))[:64]
    return [f'"{w}"' for w in words]


# Phrases whose passage counts a `Lexicon` keeps; past this many it starts afresh.
KNOWN_PHRASES = 100_000


class Lexicon:
    """The lexical side of one opened (immutable) index: the query it gives FTS5 leaves out
    the phrases that at least half the passages hold — "the", "of" in any English text —
    because FTS5's BM25 gives such a phrase an IDF of 1e-6 (its log((N - n + 0.5) / (n +
    0.5)) is not positive there), so it changes no score by more than about 1e-5, while
    FTS5 would still score every passage holding it: 20 against 1 ms for a query with one
    word that 96% of 10,000 passages hold. A query whose every phrase is that common is
    asked whole. Each phrase's count of passages is asked once (FTS5's own count of its
    matches) and kept: the index does not change under it."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self._passages: int | None = None
        self._holding: dict[str, int] = {}

    def passages(self) -> int:
        if self._passages is None:
            self._passages = int(self.db.execute("SELECT count(*) FROM chunks").fetchone()[0])
        return self._passages

    def holding(self, phrase: str) -> int:
        """How many passages hold `phrase` (a quoted phrase of `_phrases`)."""
        count = self._holding.get(phrase)
        if count is None:
            if len(self._holding) >= KNOWN_PHRASES:
                self._holding.clear()
            row = self.db.execute("SELECT count(*) FROM chunks_fts(?)", (phrase,)).fetchone()
            count = self._holding[phrase] = int(row[0])
        return count

    def match(self, query: str) -> str | None:
        """The FTS5 query for `query`'s words, the common ones left out; None if no word."""
        phrases = _phrases(query)
        if len(phrases) > 1:
            half = self.passages() / 2
            telling = [p for p in phrases if self.holding(p) < half]
            phrases = telling or phrases
        return " OR ".join(phrases) or None


def bm25(
    db: sqlite3.Connection, match: str | None, limit: int, among: list[int] | None = None
) -> list[tuple[int, float]]:
    """The best `limit` passages by BM25 for an FTS5 query of `Lexicon.match`, higher is
    better; with `among`, only those ids (a passage that matches no word of the query is not
    among the answers)."""
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
    """An index opened for searching: its connection, its `Lexicon`, and its `Vectors`, read
    on the first search that needs them and kept for the others."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.lexicon = Lexicon(db)
        self._vectors: Vectors | None = None

    def vectors(self) -> Vectors:
        if self._vectors is None:
            self._vectors = Vectors.read(self.db)
        return self._vectors

    def close(self) -> None:
        self._vectors = None
        self.db.close()


def _standardised(scores: dict[int, float], ids: list[int]) -> dict[int, float]:
    """Each id's score as standard deviations from the mean of these ids' scores. (In floats:
    `statistics.pstdev`'s exact fractions cost 0.25 ms for 100 scores, half the fusion.)"""
    values = [scores[i] for i in ids]
    if not values or min(values) == max(values):  # no spread (nor its rounding noise)
        return dict.fromkeys(ids, 0.0)
    mean = math.fsum(values) / len(values)
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    if spread == 0:  # differences too small to square
        return dict.fromkeys(ids, 0.0)
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


class Parts:
    """Where one search's time goes: per part (`PARTS`), the wall and the CPU milliseconds
    from the end of the part before. CPU is this process's, threads included, as its kernel
    counts it — inside a sandbox that is gVisor's own count, which the host does not vouch
    for (the benchmark also reads the sandbox's host cgroup)."""

    def __init__(self) -> None:
        self.wall_ms: dict[str, float] = {}
        self.cpu_ms: dict[str, float] = {}
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def done(self, part: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.wall_ms[part] = self.wall_ms.get(part, 0.0) + (wall - self._wall) * 1000
        self.cpu_ms[part] = self.cpu_ms.get(part, 0.0) + (cpu - self._cpu) * 1000
        self._wall, self._cpu = wall, cpu

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {"wall_ms": self.wall_ms, "cpu_ms": self.cpu_ms}


# A search's parts, in the order they run (a mode skips what it does not need).
PARTS = ("embed", "vector", "bm25", "fuse", "fetch")


def search(
    index: OpenIndex,
    embed: Callable[[str], np.ndarray] | None,
    query: str,
    k: int,
    mode: str,
    parts: Parts | None = None,
) -> list[dict[str, Any]]:
    """The k best passages for `query`, each with its document, page, section and score;
    `embed` gives a query's embedding (not needed for BM25). With `parts`, each part of the
    search is timed into it."""
    done = parts.done if parts is not None else _untimed
    db = index.db
    k = max(1, min(int(k), MAX_K))
    ranked: list[tuple[int, float]]
    if mode == "bm25":
        ranked = bm25(db, index.lexicon.match(query), k)
        done("bm25")
    else:
        embedded = embed(query)  # type: ignore[misc]
        done("embed")
        vectors = index.vectors()  # read on a first search (a worker reads them ahead)
        similarities = vectors.similarities(embedded)
        if mode == "vector":
            ranked = vectors.nearest(similarities, k)
            done("vector")
        else:
            nearest = vectors.nearest(similarities, CANDIDATES)
            done("vector")
            match = index.lexicon.match(query)
            lexical = dict(bm25(db, match, CANDIDATES))
            candidates = list(dict.fromkeys([i for i, _ in nearest] + list(lexical)))
            unscored = [i for i in candidates if i not in lexical]
            lexical.update(bm25(db, match, len(unscored), unscored) if unscored else [])
            done("bm25")
            ranked = fuse(vectors.of(similarities, candidates), lexical)[:k]
            done("fuse")
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
    done("fetch")
    return passages


def _untimed(part: str) -> None:
    pass
