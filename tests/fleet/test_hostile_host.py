"""A replica's end of the link (`link_client.py`) against a hostile sandbox host: a real TLS
link server in the test (`HostileHostDouble`, the certificate the installation's link CA
issued for it, only replica certificates admitted) that speaks the link protocol badly —
answers larger than any the link sends, announced or streamed, exec lines without end or of
the wrong shape, sandbox ids against the id rule or not the one asked for, statuses the link
never uses, error bodies with made-up codes and control characters.

Each is refused with the product's own error (502 `host_misbehaved`, never the host's status),
audited (`host.answer_refused`, actor `host:ID`), and the link goes on serving the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import os
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import brotli
import pytest
from db_fixtures import audit  # noqa: F401  (fixture)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from aamp.audit import export
from aamp.fleet.link_ca import LinkCA
from aamp.fleet.link_client import (
    MAX_ANSWER,
    MAX_EXEC_LINE,
    MAX_LIST_ANSWER,
    HostMisbehaved,
    LinkAnswer,
)
from aamp.fleet.link_server import link_server
from aamp.fleet.links import HostLinks
from aamp.sandbox.manager import CreateRequest
from aamp.store import Store, time_at
from aamp.store.tables import SandboxRow

HOST = "evil"
WRONG_TYPES = b'{"exit_code": "zero", "signal": null, "timed_out": false, "duration": 1}\n'
GOOD = "sb-0123456789ab"
# 64 MiB of spaces in a few hundred bytes: decoded, far past every cap of the link.
BOMB = brotli.compress(b" " * 2**26, quality=1)
HUGE = "sb-00000000000f"  # a valid id whose description is too large
MANY = 600  # records in one collect answer: more than a host ever hands over
QUESTION = {"sandbox": "sb-0123456789ab", "host": "x.test", "port": 80}
QUESTIONS: list[dict] = []  # the answers the double's egress question got


def _describe(sandbox_id: str) -> dict[str, object]:
    return {"id": sandbox_id, "image": "base", "driver": "gvisor"}


async def _chunks(total: int, piece: bytes = b"x" * 65536) -> AsyncIterator[bytes]:
    while total > 0:
        yield piece[:total]
        total -= len(piece)


def hostile_app(proof: list[str | None]) -> Starlette:
    """The link's routes, each answering as the sandbox id asked for says."""

    async def hello(request: Request) -> Response:
        return JSONResponse({"id": HOST, "epoch": 1, "proof": proof[0]})

    async def describe(request: Request) -> Response:
        how = request.path_params["sandbox_id"]
        answers: dict[str, Response] = {
            GOOD: JSONResponse(_describe(GOOD)),
            "streamed-huge": StreamingResponse(_chunks(MAX_ANSWER + 65536)),
            "announced-huge": Response(b"{}", headers={"content-length": str(2**40)}),
            "bad-id": JSONResponse(_describe("../../etc/passwd")),
            "other-id": JSONResponse(_describe("sb-ffffffffffff")),
            "not-json": Response(b"<html>", status_code=200),
            "brotli-bomb": Response(BOMB, headers={"content-encoding": "br"}),
            "gzip-bomb-404": Response(
                gzip.compress(b" " * 2**24), 404, headers={"content-encoding": "gzip"}
            ),
            "a-list": JSONResponse([_describe(GOOD)]),
            "status-500": JSONResponse({"code": "boom", "message": "x"}, status_code=500),
            "status-302": Response(status_code=302, headers={"location": "https://example"}),
            "status-418": JSONResponse({"code": "teapot", "message": "x"}, status_code=418),
            "status-299": Response(b"?", status_code=299),
            "status-401": JSONResponse({"code": "unauthorised", "message": "x"}, 401),
            "bad-code": JSONResponse({"code": "Not A Code!", "message": "x"}, status_code=404),
            "no-error-body": Response(b"nothing", status_code=404),
            "guest-kind-404": JSONResponse(
                {"code": "x", "message": "x", "kind": "guest"}, status_code=404
            ),
            HUGE: StreamingResponse(_chunks(MAX_ANSWER + 65536)),
            "loud-404": JSONResponse(
                {"code": "unknown_sandbox", "message": "gone\x1b[31m\n" + "y" * 5000},
                status_code=404,
            ),
        }
        return answers[how]

    async def listing(request: Request) -> Response:
        if request.query_params.get("huge"):
            return StreamingResponse(_chunks(MAX_LIST_ANSWER + 1))
        return JSONResponse([_describe(GOOD), _describe("sb-NOT-AN-ID")])

    async def create(request: Request) -> Response:
        return JSONResponse(_describe("sb-../../x"), status_code=201)

    async def exec_(request: Request) -> Response:
        how = request.path_params["sandbox_id"]
        lines = {
            "endless-line": _chunks(MAX_EXEC_LINE + 65536),
            "wrong-types": _one(WRONG_TYPES),
            "brotli-bomb": _one(BOMB),
            "wrong-stream": _one(b'{"stream": "stdin", "data": "eA=="}\n'),
            "bad-base64": _one(b'{"stream": "stdout", "data": "!!!"}\n'),
            "good": _one(
                b'{"stream": "stdout", "data": "NDIK"}\n'
                b'{"exit_code": 0, "signal": null, "timed_out": false, "duration": 0.1}\n'
            ),
        }
        headers = {"content-encoding": "br"} if how == "brotli-bomb" else None
        return StreamingResponse(lines[how], media_type="application/x-ndjson", headers=headers)

    collected = [0]

    async def collect(request: Request) -> Response:
        """What a replica collects: records it must not choke on, then too many at once."""
        collected[0] += 1
        if collected[0] == 1:
            return JSONResponse(
                {
                    "items": [
                        {"id": "1", "kind": "k" * 70_000, "body": {"sandbox_id": GOOD}},
                        {"id": "2", "kind": "egress", "body": {"sandbox_id": "sb-\x00"}},
                        {"id": "3", "kind": "egress", "body": {"sandbox_id": [1] * 9}},
                        # An egress question for a sandbox that is not its own: denied.
                        {"id": "4", "kind": "approve", "body": QUESTION},
                    ]
                }
            )
        if collected[0] == 2:
            items = [{"id": str(i), "kind": "egress", "body": {}} for i in range(MANY)]
            return JSONResponse({"items": items})
        await asyncio.sleep(0.5)
        return JSONResponse({"items": [], "idle": True})

    async def answer(request: Request) -> Response:
        QUESTIONS.append(json.loads(await request.body()))
        return Response(status_code=204)

    async def browser(request: Request) -> Response:
        body = json.loads(await request.body())
        return Response(b"{" + b" " * int(body["max_answer"]) + b"}")

    sb = "/link/sandboxes/{sandbox_id:str}"
    return Starlette(
        routes=[
            Route("/link/hello", hello),
            Route("/link/sandboxes", listing, methods=["GET"]),
            Route("/link/sandboxes", create, methods=["POST"]),
            Route(sb, describe, methods=["GET"]),
            Route(sb + "/exec", exec_, methods=["POST"]),
            Route(sb + "/browser", browser, methods=["POST"]),
            Route("/link/collect", collect, methods=["POST"]),
            Route("/link/asks/{ask_id:str}", answer, methods=["POST"]),
        ]
    )


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


@contextlib.asynccontextmanager
async def HostileHostDouble(
    credentials: tuple[bytes, bytes, bytes],
    directory: Path,
    proof: list[str | None],
    app: Starlette | None = None,
) -> AsyncIterator[str]:
    """The hostile host's link on a loopback port (its address), with its real certificate,
    key and CA (`credentials`); its hello serves `proof[0]`, as a registering host does.
    `app` serves other hostile answers than `hostile_app`'s."""
    cert, key, ca_pem = credentials
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = []
    for name, data in (("host.crt", cert), ("host.key", key), ("ca.crt", ca_pem)):
        (directory / name).write_bytes(data)
        os.chmod(directory / name, 0o600)
        files.append(directory / name)
    server = link_server(app or hostile_app(proof), *files, "127.0.0.1", 0)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not serving.done(), "the hostile link server did not start"
            await asyncio.sleep(0.01)
        yield f"127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        with contextlib.suppress(BaseException):
            await serving


@contextlib.asynccontextmanager
async def replica_and_admin(
    tmp_path: Path, postgres_server: object, **extra: str
) -> AsyncIterator[tuple]:
    """A real replica (of two, on the real PostgreSQL) and its admin's client, for a hostile
    host to register with: hosts are lost only after 600 s, the fleet ticks every second."""
    from api_plane import running_replicas

    async with (
        running_replicas(
            tmp_path,
            postgres_server,
            AAMP_FLEET_LOST_SECONDS="600",
            AAMP_FLEET_HEARTBEAT_SECONDS="1",
            **extra,
        ) as (a, _),
        a.client(a.admin_token) as admin,
    ):
        yield a, admin


def _records(store: Store, action: str) -> list[dict]:
    out = io.StringIO()
    export(store, out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    return [r for r in records if r.get("action") == action]


def _refusals(store: Store) -> list[dict]:
    return _records(store, "host.answer_refused")


async def test_a_hostile_hosts_answers_are_refused_recorded_and_the_link_goes_on(
    tmp_path: Path,
    store: Store,
    audit,  # noqa: F811
) -> None:
    ca = LinkCA.load_or_create(tmp_path / "link-ca")
    assert isinstance(ca, LinkCA)
    links = HostLinks(ca, audit)
    credentials = (*ca.issue_host(HOST), ca.cert_path.read_bytes())
    async with HostileHostDouble(credentials, tmp_path / "evil", [None]) as address:
        link = links.client(HOST, address)
        refused = 0

        async def refuses(call, *words: str) -> HostMisbehaved:  # type: ignore[no-untyped-def]
            nonlocal refused
            with pytest.raises(HostMisbehaved) as caught:
                await call
            assert caught.value.status == 502 and caught.value.code == "host_misbehaved"
            for word in words:
                assert word in str(caught.value), caught.value
            refused += 1
            # The link goes on: the next request is served as usual.
            assert (await link.describe(GOOD))["id"] == GOOD
            return caught.value

        await refuses(link.describe("streamed-huge"), f"more than {MAX_ANSWER} bytes")
        await refuses(link.describe("announced-huge"), f"{2**40} bytes announced")
        await refuses(link.describe("bad-id"), "does not follow the id rule")
        await refuses(link.describe("other-id"), "asked for sandbox other-id")
        await refuses(link.describe("not-json"), "not JSON")
        # A few KB that would decode to GBs: refused before a byte is decoded.
        await refuses(link.describe("brotli-bomb"), "content-encoding 'br'")
        await refuses(link.describe("gzip-bomb-404"), "content-encoding 'gzip'")
        await refuses(link.describe("a-list"), "not a JSON object")
        for status in ("500", "302", "418", "299", "401"):
            await refuses(link.describe(f"status-{status}"), f"status {status}")
        await refuses(link.describe("bad-code"), "without an error")
        await refuses(link.describe("no-error-body"), "without an error")
        await refuses(link.describe("guest-kind-404"))  # a guest error is 502, never 404
        await refuses(link.list(), "id rule")
        await refuses(link.request("GET", "/link/sandboxes?huge=1", MAX_LIST_ANSWER))
        await refuses(link.create(CreateRequest(image="base"), 1, "user:t"), "id rule")
        await refuses(
            link.channel(GOOD).browser({"op": "x"}, timeout=5, max_answer=1000), "over 1000"
        )
        await refuses(link.channel("brotli-bomb").exec(["true"]), "content-encoding 'br'")
        for how in ("endless-line", "wrong-types", "wrong-stream", "bad-base64"):
            session = await link.channel(how).exec(["true"])

            async def drain(session=session) -> None:  # type: ignore[no-untyped-def]
                async for _ in session:
                    pass

            await refuses(drain(), "exec line")

        # An error the link uses passes as the product's, its message cut and printable.
        with pytest.raises(LinkAnswer) as answer:
            await link.describe("loud-404")
        assert (answer.value.status, answer.value.code) == (404, "unknown_sandbox")
        assert len(str(answer.value)) <= 500 and str(answer.value).isprintable()
        # A well-formed exec still streams and ends with its result.
        session = await link.channel("good").exec(["echo", "42"])
        out = [o.data async for o in session]
        assert out == [b"42\n"] and session.result is not None and session.result.exit_code == 0
        await links.close()  # as a replica does at shutdown
        assert link.closed

    recorded = _refusals(store)
    assert len(recorded) == refused, [r["reason"] for r in recorded]
    assert {(r["actor"], r["resource"], r["decision"]) for r in recorded} == {
        (f"host:{HOST}", f"host:{HOST}", "deny")
    }


async def test_a_replica_serves_on_while_a_registered_host_answers_badly(
    tmp_path: Path, postgres_server
) -> None:
    """The same double registered with a real replica (in process, real PostgreSQL): the API
    answers its bad answer with 502 `host_misbehaved` and audits it; a list leaves its
    sandboxes out; the replica goes on answering."""
    async with replica_and_admin(tmp_path, postgres_server) as (a, admin):
        added = (await admin.post("/v1/hosts", json={"id": HOST})).json()
        cert, key, ca_pem = (added[k].encode() for k in ("link_cert", "link_key", "link_ca"))
        proof: list[str | None] = [secrets.token_urlsafe(32)]
        async with HostileHostDouble((cert, key, ca_pem), tmp_path / "evil", proof) as address:
            facts = {"drivers": ["gvisor"], "cpus": 4, "memory_mb": 8192, "sandboxes": 4,
                     "images": [], "link": address, "proof": proof[0]}  # fmt: skip
            token = {"x-aamp-host-token": added["token"]}
            r = await admin.post(f"/v1/hosts/{HOST}/register", json=facts, headers=token)
            assert r.status_code == 200, r.text
            with a.cp.store.write_session() as s:
                s.add(SandboxRow(id=HUGE, host_id=HOST, host_epoch=r.json()["epoch"],
                                 state="live", millicpus=1000, memory_mb=512,
                                 created_at=time_at(time.time()),
                                 expires_at=time_at(time.time() + 600)))  # fmt: skip
            got = await admin.get(f"/v1/sandboxes/{HUGE}")
            assert got.status_code == 502 and got.json()["code"] == "host_misbehaved", got.text
            listed = await admin.get("/v1/sandboxes")  # its list has an id against the rule
            assert listed.status_code == 200 and listed.json() == []
            assert (await admin.get("/v1/health")).status_code == 200
            # Its collect answers: odd records are refused in one record, not a crash (a
            # 70 KB kind, a NUL in an id, an id that is a list); too many at once are refused.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                _records(a.cp.store, "host.report_refused")
                and any("items" in r["reason"] for r in _refusals(a.cp.store))
            ):
                await asyncio.sleep(0.2)
            while time.monotonic() < deadline and len(QUESTIONS) < 1:
                await asyncio.sleep(0.2)
            reported = _records(a.cp.store, "host.report_refused")
            batch = next(r for r in reported if len(r["details"]["records"]) == 3)
            assert batch["details"]["records"][0].startswith("k" * 32 + " of")
            assert [r["details"]["records"] for r in reported if r is not batch] == [
                ["a question of sb-0123456789ab"]
            ]
            assert QUESTIONS == [{"status": "denied", "by": "system",
                                  "note": "not a question of yours"}]  # fmt: skip
            assert any(f"a collect answer of {MANY} items" in r["reason"]
                       for r in _refusals(a.cp.store))  # fmt: skip
            assert (await admin.get("/v1/health")).status_code == 200
            await a.cp.links.close()  # what its shutdown does; the double then stops at once
        recorded = [r for r in _refusals(a.cp.store) if "collect" not in r["reason"]]
        assert [r["actor"] for r in recorded] == [f"host:{HOST}"] * 2, recorded
