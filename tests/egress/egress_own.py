"""The installation's own listeners, attacked: runs ONLY inside a test-made network namespace.

A fake control-plane API (it answers `/v1/health` like the real one) listens on 127.0.0.1 at
the port the proxy is told is the installation's API; a second "installation" listener is on
0.0.0.0, and a plain web server on another loopback port is the positive control. The rules
name every way to spell "this host" a guest could try; each attempt's answer, its ledger
events and which fake server saw a connection are returned as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path

from egress_client import exchange
from egress_upstream import UpstreamServer

from aamp.egress.ca import InstallationCA
from aamp.egress.installation import InstallationListeners, Listener, announce
from aamp.egress.ledger import JsonLinesSink
from aamp.egress.proxy import EgressContext, EgressProxy
from aamp.egress.resolver import StaticResolver
from aamp.egress.rules import EgressRules
from aamp.egress.services import Header, Service, ServiceSet

NETNS_ADDRESSES = ["1.1.1.1"]  # an address of "this host" that is not loopback
API_PORT, WILDCARD_PORT, MODEL_PORT, PLAIN_PORT = 8700, 9100, 8080, 9200
NAMES = {
    "api.test": ["127.0.0.1"],  # a DNS name for this host, as an admin might add for a model
    "public.test": ["1.1.1.1"],
    "v6.test": ["::ffff:127.0.0.1"],
}
RULES = EgressRules.from_lists(
    "block",
    # Portless, exact rules: they open every port of these hosts, but never the installation's.
    allow=["api.test", "public.test", "v6.test", "0.0.0.0", "127.0.0.2", "[::ffff:127.0.0.1]"],
)


class FakeApi(UpstreamServer):
    """Poses as the control plane: `/v1/health` answers `{"status": "ok"}`."""

    async def _respond(self, method, target, headers, body, reader, writer) -> bool:
        payload = b'{"status": "ok"}'
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        return True


def _get(url: str) -> bytes:
    authority = url.split("/", 3)[2]
    return f"GET {url} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()


def _connect(target: str) -> bytes:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


ATTEMPTS = {
    "api-by-name": _get(f"http://api.test:{API_PORT}/v1/health"),
    "api-by-name-connect": _connect(f"api.test:{API_PORT}"),
    "api-via-unspecified-address": _get(f"http://0.0.0.0:{API_PORT}/v1/health"),
    "api-via-another-loopback-address": _get(f"http://127.0.0.2:{API_PORT}/v1/health"),
    "api-via-mapped-ipv6-literal": _get(f"http://[::ffff:127.0.0.1]:{API_PORT}/v1/health"),
    "api-via-name-with-mapped-aaaa": _get(f"http://v6.test:{API_PORT}/v1/health"),
    "wildcard-listener-via-local-address": _get(f"http://public.test:{WILDCARD_PORT}/"),
    "wildcard-listener-via-loopback": _get(f"http://api.test:{WILDCARD_PORT}/"),
    "announced-model-server": _get(f"http://api.test:{MODEL_PORT}/v1/models"),
}
CONTROLS = {
    "other-port-by-name": _get(f"http://api.test:{PLAIN_PORT}/"),
    "other-port-via-local-address": _get(f"http://public.test:{PLAIN_PORT}/"),
}


class SecretReaderDouble:
    """Stands in for the vault: the proxy must refuse before it reads any secret."""

    def __init__(self) -> None:
        self.read: list[str] = []

    async def reveal(self, name: str, *, purpose: str) -> str:
        self.read.append(name)
        return "never-used"

    def changes(self, name: str) -> int:
        return 0

    async def record_use(self, service: str, *, purpose: str, details: dict) -> None:
        self.read.append(f"use of {service}")


async def run(args: dict) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="aamp-own-", dir="/tmp"))
    api = await FakeApi("127.0.0.1", API_PORT).start()
    wildcard = await FakeApi("0.0.0.0", WILDCARD_PORT).start()
    model = await FakeApi("127.0.0.1", MODEL_PORT).start()
    plain = [await UpstreamServer(h, PLAIN_PORT).start() for h in ("127.0.0.1", "1.1.1.1")]
    servers = {"api": [api], "wildcard": [wildcard], "model": [model], "plain": plain}

    def hits() -> dict[str, int]:
        return {name: sum(s.connections for s in group) for name, group in servers.items()}

    listeners = InstallationListeners(
        [
            Listener("the control plane's API", "127.0.0.1", API_PORT),
            Listener("a wildcard listener", "0.0.0.0", WILDCARD_PORT),
        ],
        announced=workdir / "listeners",
    )
    sink = JsonLinesSink(workdir / "ledger.jsonl")
    proxy = EgressProxy(
        "sb-0000000000ow",
        workdir / "p.sock",
        RULES,
        EgressContext(StaticResolver(NAMES), sink, listeners=listeners),
    )
    # An admin's service definition whose upstream is the API: its grant cannot open it.
    secrets = SecretReaderDouble()
    service_proxy = EgressProxy(
        "sb-0000000000ox",
        workdir / "s.sock",
        EgressRules.from_lists("block"),
        EgressContext(
            StaticResolver(NAMES),
            sink,
            listeners=listeners,
            secrets=secrets,
            ca=InstallationCA.load_or_create(workdir / "ca"),
        ),
        services=ServiceSet(
            [Service("cp", f"http://api.test:{API_PORT}", Header("X-K", "{{secret:k}}"))]
        ),
    )
    results: dict[str, dict] = {}

    async def attempt(name: str, via: EgressProxy, data: bytes) -> None:
        before, seen = hits(), len(sink.read())
        outcome = await exchange(via.socket_path, data)
        await asyncio.sleep(0.02)
        await via.flush()
        outcome["events"] = [json.loads(e.to_json()) for e in sink.read()[seen:]]
        outcome["hits"] = {k: v - before[k] for k, v in hits().items() if v - before[k]}
        results[name] = outcome

    async with proxy, service_proxy:
        model_listener = Listener("the local model server", "127.0.0.1", MODEL_PORT)
        with announce(workdir / "listeners", model_listener) as announced:
            results["announcement"] = {"file": announced.name, "pid": os.getpid()}
            for name, data in ATTEMPTS.items():
                await attempt(name, proxy, data)
            await attempt(
                "service-whose-upstream-is-the-api",
                service_proxy,
                _get(f"http://api.test:{API_PORT}/v1/agents"),
            )
            for name, data in CONTROLS.items():
                await attempt(name, proxy, data)
        # The model server has stopped (its announcement with it): an ordinary port again.
        await attempt(
            "model-after-its-announcement-ended", proxy, ATTEMPTS["announced-model-server"]
        )
    results["secrets-read"] = {"names": secrets.read}
    for group in servers.values():
        for server in group:
            await server.close()
    return results
