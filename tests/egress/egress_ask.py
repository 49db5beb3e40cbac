"""The `default: ask` scenario: runs ONLY inside a test-made network namespace (egress_netns).

Fake outside hosts listen on 1.1.1.1 (public) and 10.0.0.5 (private). A proxy with
`default: ask` gets a scripted approver (a test double for the person answering: it answers
each host as ASK_ANSWERS says, after a short delay) and is exercised with raw requests. The
result records every status, every question the approver got and the ledger.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from egress_client import connect, get
from egress_upstream import UpstreamServer

from aamp.egress.approvals import Answer
from aamp.egress.ledger import JsonLinesSink
from aamp.egress.proxy import EgressContext, EgressProxy
from aamp.egress.resolver import StaticResolver
from aamp.egress.rules import EgressRules

NETNS_ADDRESSES = ["1.1.1.1", "10.0.0.5"]
RULES = EgressRules.from_lists("ask", allow=["known.test"], deny=["*.evil.test"])
NAMES = {
    "known.test": ["1.1.1.1"],
    "shop.test": ["1.1.1.1"],
    "refused.test": ["1.1.1.1"],
    "silent.test": ["1.1.1.1"],
    "intranet.test": ["10.0.0.5"],
    "x.evil.test": ["1.1.1.1"],
}
ASK_ANSWERS = {
    "shop.test": Answer("approved", "user:alice"),
    "intranet.test": Answer("approved", "user:alice"),
    "refused.test": Answer("denied", "user:bob", "not for this task"),
    "silent.test": Answer("expired", "nobody"),
}


class ScriptedApproverForTests:
    """Stands in for the person: answers after `delay` seconds, counting the questions."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.questions: list[str] = []

    async def __call__(self, host: str, port: int) -> Answer:
        self.questions.append(f"{host}:{port}")
        await asyncio.sleep(self.delay)
        return ASK_ANSWERS[host]


def _result(response) -> dict:
    return {"status": response.status, "rule": response.rule, "body": response.body.decode()}


async def run(args: dict) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="aamp-ns-", dir="/tmp"))
    servers = {
        "1.1.1.1": await UpstreamServer("1.1.1.1", 80).start(),
        "1.1.1.1:443": await UpstreamServer("1.1.1.1", 443).start(),
        "10.0.0.5": await UpstreamServer("10.0.0.5", 80).start(),
    }
    sink = JsonLinesSink(workdir / "ledger.jsonl")
    approver = ScriptedApproverForTests(0.3)
    out: dict = {}
    proxy = EgressProxy(
        "sb-00000000a5c0", workdir / "p.sock", RULES, EgressContext(StaticResolver(NAMES), sink)
    )
    async with proxy:
        sock = proxy.socket_path
        out["no-approver"] = _result(await get(sock, "http://shop.test/"))
        proxy.approvals.approver = approver
        out["allowed-by-rule"] = _result(await get(sock, "http://known.test/"))
        out["denied-by-rule"] = _result(await get(sock, "http://x.evil.test/"))
        concurrent = await asyncio.gather(*(get(sock, "http://shop.test/") for _ in range(5)))
        out["concurrent"] = [_result(r) for r in concurrent]
        out["again"] = _result(await get(sock, "http://shop.test/"))
        tunnel, _, writer = await connect(sock, "shop.test:443")
        writer.close()
        out["connect-other-port"] = {"status": tunnel.status, "rule": tunnel.rule}
        out["intranet"] = _result(await get(sock, "http://intranet.test/"))
        out["refused"] = _result(await get(sock, "http://refused.test/"))
        out["refused-again"] = _result(await get(sock, "http://refused.test/"))
        out["silent"] = _result(await get(sock, "http://silent.test/"))
        out["silent-again"] = _result(await get(sock, "http://silent.test/"))
        # A question still open when the sandbox goes away is withdrawn, not left hanging.
        approver.delay = 30
        pending = asyncio.create_task(get(sock, "http://shop.test:8080/"))
        await asyncio.sleep(0.2)
    await asyncio.wait([pending], timeout=5)
    out["closed-while-asking"] = {
        "done": pending.done(),
        "status": pending.result().status if pending.done() and not pending.exception() else None,
    }
    out["questions"] = approver.questions
    out["hits"] = {name: server.connections for name, server in servers.items()}
    out["ledger"] = [json.loads(e.to_json()) for e in sink.read()]
    return out
