"""The `documents` tool on the host: one call becomes one run of the documents worker inside
the sandbox (`aamp.guest.documents`, from the docs image), and its answer the observation.

No document is parsed or rendered here: the host sends the checked arguments as JSON and
reads back a JSON answer, which is untrusted — size-capped, type-checked, cut to length.
What the host adds is what only the host knows: the requests the egress proxy refused while
the worker ran (a page's remote image, say), read from the ledger (`aamp.egress.recent`), so a
refusal is reported with the proxy's rule and a page cannot claim or hide one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from aamp.agents import guest_scripts
from aamp.agents.observation import Observation
from aamp.egress.recent import EgressView
from aamp.sandbox import GuestChannel, run_worker

Borrow = Callable[[], AbstractAsyncContextManager[GuestChannel]]

MAX_ANSWER = 8_000_000
_REFUSED = ("refused", "cut")


def _text(value: object, limit: int = 2000) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class DocumentsTool:
    def __init__(self, borrow: Borrow, timeout_cap: int, egress: EgressView | None = None):
        self.borrow = borrow
        self.timeout_cap = timeout_cap
        self.egress = egress

    async def run(self, args: dict[str, Any]) -> Observation:
        timeout = float(min(int(args.get("timeout", self.timeout_cap)), self.timeout_cap))
        request = {k: v for k, v in args.items() if k != "timeout"}
        mark = await self.egress.mark() if self.egress is not None else 0
        async with self.borrow() as channel:
            result, out, err = await run_worker(channel, "documents", request, timeout, MAX_ANSWER)
        await asyncio.sleep(0)  # the proxy's last ledger events are handed on in the loop
        refused = []
        if self.egress is not None:
            refused = [e for e in await self.egress.since(mark) if e.decision in _REFUSED]
        if result.timed_out:
            return Observation(f"error: {args['action']} took longer than {timeout:g} s", False)
        answer = guest_scripts.answer(out)
        if answer is None:
            why = err.decode("utf-8", "replace")[-1500:] or f"exit code {result.exit_code}"
            if result.signal:
                why = f"the worker was killed by signal {result.signal} (a sandbox limit?)"
            return Observation(f"error: the documents worker gave no answer: {why}", False)
        lines: list[str] = []
        detail: dict[str, Any] = {"action": args["action"]}
        ok = answer.get("ok") is True
        if not ok:
            lines.append(f"error: {_text(answer.get('error')) or 'the action failed'}")
        output = _text(answer.get("output"), 4096)
        if ok and output:
            detail["output"] = output
            facts = [f"{_int(answer.get('size'))} bytes"]
            pages = _int(answer.get("pages"))
            if pages is not None:
                facts.append(f"{pages} page" + ("" if pages == 1 else "s"))
            if isinstance(answer.get("sheets"), list):
                facts.append("sheets " + ", ".join(_text(s, 40) for s in answer["sheets"][:50]))
            if isinstance(answer.get("filled"), list):
                facts.append("filled " + ", ".join(_text(s, 100) for s in answer["filled"][:200]))
            lines.append(f"wrote /workspace/{output} ({'; '.join(facts)})")
        lines += _pages(answer.get("pages"))
        lines += _not_loaded(answer.get("refused"), refused, detail)
        return Observation("\n".join(lines), ok, detail)


def _pages(pages: object) -> list[str]:
    if not isinstance(pages, list):
        return []
    lines = []
    for page in pages[:10_000]:
        if not isinstance(page, dict):
            continue
        sheet = f" (sheet {_text(page.get('sheet'), 40)!r})" if page.get("sheet") else ""
        lines.append(f"--- page {_int(page.get('page'))}{sheet}")
        if _text(page.get("text"), 2_000_000):
            lines.append(page["text"][:2_000_000])
        tables = page.get("tables")
        for n, table in enumerate(tables if isinstance(tables, list) else [], 1):
            rows = [r for r in table if isinstance(r, list)] if isinstance(table, list) else []
            lines.append(f"table {n}: {len(rows)} rows")
            lines += [json.dumps([_text(c) for c in row], ensure_ascii=False) for row in rows]
    return lines


def _not_loaded(told: object, refused: list[Any], detail: dict[str, Any]) -> list[str]:
    """What the rendering did not load: the proxy's refusals (the truth), then what the worker
    says it refused itself (file URLs outside /workspace, other schemes)."""
    lines = []
    if refused:
        detail["blocked"] = [{"host": e.host, "port": e.port, "rule": e.rule} for e in refused]
        lines.append("blocked by the egress policy:")
        lines += [f"- {e.host}:{e.port} (rule: {e.rule}; {e.reason})" for e in refused[:10]]
    items = [t for t in told[:50] if isinstance(t, dict)] if isinstance(told, list) else []
    if items:
        lines.append("not loaded:")
        lines += [f"- {_text(t.get('url'), 300)}: {_text(t.get('reason'), 300)}" for t in items]
    return lines
