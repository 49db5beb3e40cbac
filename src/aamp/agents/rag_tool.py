"""The `rag` tool on the host: `search(kb, query, k)` over a knowledge base granted to the
agent, run by the knowledge-base worker inside the run's own sandbox (`aamp.guest.rag`, rag
image) against the index the run was given at its start (`KB_DIR/NAME.sqlite`, mounted
read-only, opened read-only and immutable; one version for the whole run). The worker is a
resident one (`SearchWorker`), started with the run's sandbox (`start`: it loads the model
and reads each index's vectors while the run's first model call is made) and kept for the
run's searches, so a search costs the query's embedding and the lookups only. Its answer is
untrusted: each passage's fields are type-checked and cut to length before the model sees
them, with its citation (document, page or section) and score."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from aamp.agents.observation import Observation
from aamp.sandbox import GuestChannel, SearchWorker, WorkerFailed

Borrow = Callable[[], AbstractAsyncContextManager[GuestChannel]]

# Where a run's knowledge-base indexes are put in its sandbox (outside /workspace/out, so
# they never become artifacts).
KB_DIR = "/workspace/.knowledge-bases"
MAX_PASSAGE_CHARS = 2000
SCHEMA_K_MAX = 20


def schema(knowledge_bases: tuple[str, ...]) -> dict[str, Any]:
    return {
        "description": "Search a knowledge base granted to you; returns the best passages, "
        "each with its document, page or section and score. Cite them in your answer.",
        "parameters": {
            "type": "object",
            "properties": {
                "kb": {"enum": list(knowledge_bases)},
                "query": {"type": "string", "minLength": 1, "maxLength": 2000},
                "k": {"type": "integer", "minimum": 1, "maximum": SCHEMA_K_MAX},
            },
            "required": ["kb", "query"],
            "additionalProperties": False,
        },
    }


def rag_index_path(name: str) -> str:
    """Where knowledge base `name`'s index is in a run's sandbox."""
    return f"{KB_DIR}/{name}.sqlite"


def _in_workspace(path: str) -> str:
    """`path` as the worker takes it: relative to /workspace."""
    return path.removeprefix("/workspace/")


def _text(value: object, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def citation(passage: dict[str, Any]) -> str:
    where = _text(passage.get("document"), 200) or "?"
    page = passage.get("page")
    if isinstance(page, int) and not isinstance(page, bool):
        where += f", page {page}"
    section = _text(passage.get("section"), 200)
    if section:
        where += f", section {section!r}"
    return where


class RagTool:
    def __init__(self, borrow: Borrow, timeout_cap: int, knowledge_bases: tuple[str, ...]):
        self.borrow = borrow
        self.timeout_cap = timeout_cap
        self.knowledge_bases = knowledge_bases
        warm = tuple(_in_workspace(rag_index_path(kb)) for kb in knowledge_bases)
        self.worker = SearchWorker(warm=warm)

    async def start(self) -> None:
        """Start the search worker in the run's sandbox, without waiting for its model; one
        that cannot start is started again by the first search, which says why it failed."""
        try:
            async with self.borrow() as channel:
                await self.worker.start(channel, float(self.timeout_cap))
        except WorkerFailed:
            pass

    async def run(self, args: dict[str, Any]) -> Observation:
        kb = args["kb"]
        if kb not in self.knowledge_bases:  # the schema's enum already says so; never trust
            return Observation(f"error: knowledge base {kb!r} is not granted to this agent", False)
        index = _in_workspace(rag_index_path(kb))
        k = int(args.get("k", 5))
        request = {"index": index, "query": args["query"], "k": k}
        try:
            async with self.borrow() as channel:
                answer = await self.worker.search(channel, request, float(self.timeout_cap))
        except WorkerFailed as exc:
            return Observation(f"error: {exc}", False)
        if answer.get("ok") is not True:
            return Observation(
                f"error: {_text(answer.get('error'), 2000) or 'search failed'}", False
            )
        passages = [p for p in answer.get("passages") or [] if isinstance(p, dict)][:SCHEMA_K_MAX]
        lines, cited = [], []
        for n, passage in enumerate(passages, 1):
            score = passage.get("score")
            score = float(score) if isinstance(score, int | float) else 0.0
            lines.append(f"[{n}] {citation(passage)} (score {score:.4f})")
            lines.append(_text(passage.get("text"), MAX_PASSAGE_CHARS))
            cited.append({"document": _text(passage.get("document"), 200),
                          "page": passage.get("page") if isinstance(passage.get("page"), int)
                          else None, "section": _text(passage.get("section"), 200),
                          "score": score})  # fmt: skip
        if not lines:
            lines.append(f"no passage of {kb} matches")
        return Observation("\n".join(lines), True, {"kb": kb, "passages": cited})
