"""What a hostile sandbox host says about its sandboxes, against a real replica (in process,
real PostgreSQL) and the hostile host's double (`test_hostile_host.HostileHostDouble`, with its
real link certificate): the host keeps a sandbox past its ttl, hands over egress and secret-use
records with made-up kinds, decisions, types, fields and services, asks for a credential of
the expired sandbox, and describes its sandboxes with keys no description has.

- the expired sandbox gets no credential (`secret.refused`, the rule "expired at"), none of
  its records are written, and the sweep reaps it (its host told to destroy it, its row
  forgotten, `sandbox.destroy` reason `ttl` naming the host);
- each record with a field not of its type, size or set, or a service the sandbox was not
  granted, is dropped into the one `host.report_refused` record with why; the well-formed
  ones of the live sandbox are written;
- a description keeps only the keys a sandbox's description has (the rest left out and
  recorded as `host.answer_refused`); one with a key of the wrong type is refused (502);
- a sandbox created there: its `sandbox.create` record holds only a description's keys; its
  new egress rules and services reach its host over the link (its row's granted services
  change with them; `sandbox.update_egress` recorded, naming the host; a host that refuses
  them leaves the grant as it was, recorded as "error"); its egress view is the host's,
  and a view past 4 MiB, with more than 1000 events, with an event of the wrong type, set,
  size, sandbox or service, or not JSON, is refused (502 `host_misbehaved`) and recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from driver_double import DriverDouble
from install_layout import shared_image_dir
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from test_hostile_host import HostileHostDouble, _records, replica_and_admin

import aamp.fleet.sandboxes as sandboxes
from aamp.egress.rules import EgressRules
from aamp.egress.services import Service, ServiceSet
from aamp.fleet.link_client import HostMisbehaved, LinkAnswer
from aamp.fleet.link_egress import MAX_VIEW_ANSWER, MAX_VIEW_EVENTS
from aamp.sandbox.manager import CreateRequest
from aamp.store import time_at
from aamp.store.tables import SandboxRow

HOST = "evil"
LIVE = "sb-0000000000a1"
EXPIRED = "sb-0000000000e1"  # past its ttl, still within the reap grace
REAPED = "sb-0000000000e2"  # long past it: the sweep reaps it
WRONG_TYPE = "sb-0000000000b1"  # described with `warm` as text
CREATED = "sb-0000000000c1"  # what its create answers


def _event(sandbox_id: str, **changed: object) -> dict[str, object]:
    event = {"sandbox_id": sandbox_id, "time": time.time(), "connection": 1, "kind": "http",
             "host": "a.test", "port": 80, "address": "127.0.0.1", "decision": "refused",
             "rule": "default: block", "reason": "not allowed", "status": 403, "bytes_up": 0,
             "bytes_down": 0, "duration": 0.01, "service": None, "secrets": []}  # fmt: skip
    return {**event, **changed}


def _use(sandbox_id: str, service: str = "crm", **details: object) -> dict[str, object]:
    counts = {"service": service, "secrets": ["crm_token"], "requests": 1,
              "methods": {"GET": 1}, "reads": 1}  # fmt: skip
    return {"sandbox": sandbox_id, "service": service, "purpose": f"host evil: {sandbox_id}",
            "details": {**counts, **details}}  # fmt: skip


# Each refused record and a word its refusal must name.
REFUSED = {
    "e-kind": ("egress", _event(LIVE, kind="exfiltrate"), "is not one of"),
    "e-decision": ("egress", _event(LIVE, decision="maybe"), "is not one of"),
    "e-service": ("egress", _event(LIVE, service="erp", secrets=["erp_token"]), "not granted"),
    "e-port": ("egress", _event(LIVE, port="80"), "port is not a whole number"),
    "e-bool": ("egress", _event(LIVE, status=True), "status is not a whole number"),
    "e-field": ("egress", {**_event(LIVE), "value": "s3cret"}, "fields no such record has"),
    "e-long": ("egress", _event(LIVE, rule="r" * 5000), "rule is not text"),
    "e-escape": ("egress", _event(LIVE, host="a.test\x1b[2J"), "without control characters"),
    "e-expired": ("egress", _event(EXPIRED), "expired at"),
    "u-service": ("secret_use", _use(LIVE, "erp"), "not granted"),
    "u-detail": ("secret_use", _use(LIVE, value="s3cret"), "fields no such record has"),
    "u-expired": ("secret_use", _use(EXPIRED), "expired at"),
}
WRITTEN = {"e-good": ("egress", _event(LIVE)), "u-good": ("secret_use", _use(LIVE))}
ASKS = {
    "a-expired": {"sandbox": EXPIRED, "service": "crm", "secret": "crm_token"},
    "a-live": {"sandbox": LIVE, "service": "crm", "secret": "crm_token"},
}


def _described(sandbox_id: str) -> dict[str, object]:
    """A description with keys no sandbox's description has (or, for WRONG_TYPE, a key of
    the wrong type)."""
    info = {"id": sandbox_id, "image": "base", "driver": "gvisor", "warm": False,
            "ttl_seconds": 600, "resources": {"cpus": 1.0, "memory_bytes": 2**29,
            "pids": 256, "disk_bytes": 2**30}}  # fmt: skip
    if sandbox_id == WRONG_TYPE:
        return {**info, "warm": "yes"}
    return {**info, "note": "<script>" + "x" * 9000, "env": {"TOKEN": "t"}, "host": "elsewhere",
            "\x00x": 1}  # fmt: skip


def _view(*events: dict[str, object], mark: object = 9) -> bytes:
    return json.dumps({"mark": mark, "events": list(events)}).encode()


async def _chunks(total: int, piece: bytes = b" " * 65536):  # type: ignore[no-untyped-def]
    yield b'{"mark": 1, "events": ['
    while total > 0:
        yield piece[:total]
        total -= len(piece)


# The egress views a hostile host answers (`seen["view"]`), and a word each refusal names.
VIEWS = {
    "good": _view(_event(CREATED), _event(CREATED, service="crm", secrets=["crm_token"])),
    "many": _view(*[_event(CREATED)] * (MAX_VIEW_EVENTS + 1)),
    "bad-kind": _view(_event(CREATED, kind="exfiltrate")),
    "escape": _view(_event(CREATED, reason="refused\x1b[2J")),
    "long": _view(_event(CREATED, rule="r" * 5000)),
    "other-sandbox": _view(_event(LIVE)),
    "not-granted": _view(_event(CREATED, service="erp", secrets=["erp_token"])),
    "bad-mark": _view(mark="9"),
    "extra-field": json.dumps({"mark": 1, "events": [], "note": "x"}).encode(),
    "not-json": b"<html>",
}
VIEW_REFUSED = {
    "huge": f"more than {MAX_VIEW_ANSWER} bytes",
    "many": f"at most {MAX_VIEW_EVENTS}",
    "bad-kind": "is not one of",
    "escape": "without control characters",
    "long": "rule is not text",
    "other-sandbox": f"an event of sandbox '{LIVE}'",
    "not-granted": "not granted",
    "bad-mark": "mark is not a whole number",
    "extra-field": "fields no such record has",
    "not-json": "GET /link/sandboxes",
}


def reporting_app(proof: list[str | None], ready: asyncio.Event, seen: dict) -> Starlette:
    """A host that, once `ready`, hands over every record above in one collect answer."""
    handed = [False]

    async def hello(request: Request) -> Response:
        return JSONResponse({"id": HOST, "epoch": 1, "proof": proof[0]})

    async def collect(request: Request) -> Response:
        seen.setdefault("acks", []).extend(json.loads(await request.body())["ack"])
        if ready.is_set() and not handed[0]:
            handed[0] = True
            items = [{"id": k, "kind": kind, "body": body}
                     for k, (kind, body, _) in REFUSED.items()]  # fmt: skip
            items += [{"id": k, "kind": kind, "body": body} for k, (kind, body) in WRITTEN.items()]
            items += [{"id": k, "kind": "ask", "body": body} for k, body in ASKS.items()]
            return JSONResponse({"items": items})
        await asyncio.sleep(0.3)
        return JSONResponse({"items": []})

    async def answer(request: Request) -> Response:
        seen.setdefault("answers", {})[request.path_params["ask_id"]] = json.loads(
            await request.body()
        )
        return Response(status_code=204)

    async def describe(request: Request) -> Response:
        return JSONResponse(_described(request.path_params["sandbox_id"]))

    async def create(request: Request) -> Response:
        seen.setdefault("created", []).append(await request.json())
        return JSONResponse(_described(CREATED), status_code=201)

    async def destroy(request: Request) -> Response:
        seen.setdefault("destroyed", []).append(
            (request.path_params["sandbox_id"], request.query_params.get("reason"))
        )
        return Response(status_code=204)

    async def listing(request: Request) -> Response:
        return JSONResponse([])

    async def put_egress(request: Request) -> Response:
        seen.setdefault("egress_put", []).append(json.loads(await request.body()))
        if seen.get("refuse_put"):
            return JSONResponse({"code": "unknown_sandbox", "message": "no"}, status_code=404)
        return Response(status_code=204)

    async def egress_view(request: Request) -> Response:
        """The view that `seen["view"]` names (a mark alone while none is named)."""
        after = request.query_params.get("after")
        how = seen.get("view") if after is not None else None
        if how == "huge":
            return StreamingResponse(_chunks(MAX_VIEW_ANSWER + 65536))
        return Response(VIEWS.get(how, b'{"mark": 7, "events": []}'))

    sb = "/link/sandboxes/{sandbox_id:str}"
    return Starlette(
        routes=[
            Route("/link/hello", hello),
            Route("/link/collect", collect, methods=["POST"]),
            Route("/link/asks/{ask_id:str}", answer, methods=["POST"]),
            Route("/link/sandboxes", listing, methods=["GET"]),
            Route("/link/sandboxes", create, methods=["POST"]),
            Route(sb, describe, methods=["GET"]),
            Route(sb, destroy, methods=["DELETE"]),
            Route(sb + "/egress", put_egress, methods=["PUT"]),
            Route(sb + "/egress", egress_view, methods=["GET"]),
        ]
    )


@contextlib.asynccontextmanager
async def registered(
    admin: object, tmp_path: Path, ready: asyncio.Event, seen: dict
) -> AsyncIterator[int]:
    """The reporting host added and registered (its link proven) with the replica; its epoch."""
    added = (await admin.post("/v1/hosts", json={"id": HOST})).json()  # type: ignore[attr-defined]
    cert, key, ca_pem = (added[k].encode() for k in ("link_cert", "link_key", "link_ca"))
    proof: list[str | None] = [secrets.token_urlsafe(32)]
    app = reporting_app(proof, ready, seen)
    async with HostileHostDouble((cert, key, ca_pem), tmp_path / "evil", proof, app) as at:
        facts = {"drivers": ["gvisor", DriverDouble.name], "cpus": 4, "memory_mb": 8192,
                 "sandboxes": 8, "images": [], "link": at, "proof": proof[0]}  # fmt: skip
        token = {"x-aamp-host-token": added["token"]}
        r = await admin.post(f"/v1/hosts/{HOST}/register", json=facts, headers=token)  # type: ignore[attr-defined]
        assert r.status_code == 200, r.text
        yield r.json()["epoch"]


async def test_a_hostile_hosts_reports_are_checked_field_by_field_and_expiry_holds(
    tmp_path: Path, postgres_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long enough that EXPIRED is still recorded while its records and ask are judged.
    monkeypatch.setattr(sandboxes, "REAP_GRACE_SECONDS", 300.0)
    ready, seen = asyncio.Event(), {}
    async with replica_and_admin(tmp_path, postgres_server) as (a, admin):
        a.cp.catalog.put_service("crm", upstream="http://crm.test", auth="bearer",
                                 secrets=["crm_token"], header_name=None, by="test")  # fmt: skip
        await a.cp.vault.put("crm_token", "crm-value-1", "test")
        async with registered(admin, tmp_path, ready, seen) as epoch:
            now = time.time()
            with a.cp.store.write_session() as s:
                for sandbox_id, ends in ((LIVE, now + 600), (WRONG_TYPE, now + 600),
                                         (EXPIRED, now - 1), (REAPED, now - 3600)):  # fmt: skip
                    s.add(SandboxRow(id=sandbox_id, host_id=HOST, host_epoch=epoch,
                                     state="live", millicpus=100, memory_mb=64,
                                     created_at=time_at(now - 60), expires_at=time_at(ends),
                                     services=json.dumps(["crm"])))  # fmt: skip
            ready.set()
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not (
                len(seen.get("answers", {})) == len(ASKS)
                and {"e-good", "u-good"} <= set(seen.get("acks", []))
                and seen.get("destroyed")
            ):
                await asyncio.sleep(0.2)

            # Described: only a description's keys reach the client; the rest is recorded.
            got = await admin.get(f"/v1/sandboxes/{LIVE}")
            assert got.status_code == 200, got.text
            assert not {"note", "env"} & set(got.json()) and got.json()["host"] == HOST
            # Expired: gone for API clients, whatever its host would describe.
            ended = await admin.get(f"/v1/sandboxes/{EXPIRED}")
            assert ended.status_code == 410 and "expired at" in ended.json()["message"]
            wrong = await admin.get(f"/v1/sandboxes/{WRONG_TYPE}")
            assert wrong.status_code == 502 and wrong.json()["code"] == "host_misbehaved"
            await a.cp.links.close()

        # The expired sandbox: no credential, the live one's granted.
        assert seen["answers"]["a-expired"].keys() == {"refused"}
        assert "expired at" in seen["answers"]["a-expired"]["refused"]
        assert seen["answers"]["a-live"] == {"value": "crm-value-1"}
        denied = _records(a.cp.store, "secret.refused")
        assert [d["details"]["sandbox"] for d in denied] == [EXPIRED]
        # Every odd record in the one refusal record, each with why; every record acknowledged.
        reported = [x for r in _records(a.cp.store, "host.report_refused")
                    for x in r["details"]["records"]]  # fmt: skip
        assert len(reported) == len(REFUSED), reported
        for kind, body, why in REFUSED.values():
            sandbox_id = body.get("sandbox_id") or body.get("sandbox")
            assert any(x.startswith(f"{kind} of {sandbox_id}") and why in x for x in reported), (
                why,
                reported,
            )
        assert set(REFUSED) | set(WRITTEN) <= set(seen["acks"])
        # The well-formed ones of the live sandbox are written, and nothing else.
        egress = _records(a.cp.store, "egress.http")
        assert [(r["actor"], r["details"]["sandbox_host"]) for r in egress] == [
            (f"sandbox:{LIVE}", HOST)
        ]
        uses = [r for r in _records(a.cp.store, "secret.use") if r["actor"] == f"host:{HOST}"]
        assert [(u["resource"], u["details"]["sandbox"]) for u in uses] == [("service:crm", LIVE)]
        # Reaped: its host told, its row gone, recorded as a ttl's end; EXPIRED not yet.
        assert (REAPED, "ttl") in seen["destroyed"]
        with a.cp.store.session() as s:
            assert s.get(SandboxRow, REAPED) is None and s.get(SandboxRow, EXPIRED) is not None
        ends = [r for r in _records(a.cp.store, "sandbox.destroy")
                if r["resource"] == f"sandbox:{REAPED}"]  # fmt: skip
        assert [(r["reason"], r["details"]) for r in ends] == [("ttl", {"host": HOST})]
        # The description's extra keys were left out, and said so.
        left_out = [r["reason"] for r in _records(a.cp.store, "host.answer_refused")
                    if "left out" in r["reason"]]  # fmt: skip
        # (named escaped: a key with a NUL could not be recorded as it is)
    assert left_out and all("\\x00x, env, note" in r for r in left_out), left_out


async def test_a_remote_sandboxs_egress_rules_go_over_the_link_and_its_view_is_checked(
    tmp_path: Path, postgres_server
) -> None:
    """A sandbox created on the hostile host (the replicas' own hosts drained): its create's
    description reaches the `sandbox.create` record only with a description's keys; its new
    egress rules and services reach its host and are recorded; its egress view is its host's,
    checked, and every hostile view is refused and recorded."""
    images = {"AAMP_IMAGE_DIR": str(shared_image_dir())}  # a create checks its image first
    seen: dict = {}
    async with replica_and_admin(tmp_path, postgres_server, **images) as (a, admin):
        async with registered(admin, tmp_path, asyncio.Event(), seen):
            for own in ("replica-a", "replica-b"):
                assert (await admin.post(f"/v1/hosts/{own}/drain")).status_code == 200
            sandbox = await a.cp.manager.create(CreateRequest(image="base"), actor="user:t")
            assert (sandbox.id, sandbox.host) == (CREATED, HOST)
            # The driver placement reserved for, named: not left to the host's own default.
            assert [c["driver"] for c in seen["created"]] == [a.cp.manager.default_driver]
            auth = {"type": "bearer", "secret": "crm_token"}
            crm = Service.from_dict({"name": "crm", "upstream": "http://crm.test", "auth": auth})
            rules = EgressRules.from_lists("block", allow=["a.test"])
            await a.cp.manager.update_egress(CREATED, rules, ServiceSet([crm]), actor="user:t")
            assert seen["egress_put"] == [
                {"egress": rules.to_dict(), "services": [crm.to_dict()], "actor": "user:t"}
            ]
            with a.cp.store.session() as s:
                assert json.loads(s.get(SandboxRow, CREATED).services) == ["crm"]
            # A host that refuses them: the grant stays as it was, and that is recorded.
            seen["refuse_put"] = True
            with pytest.raises(LinkAnswer):
                await a.cp.manager.update_egress(CREATED, rules, ServiceSet(), actor="user:t")
            with a.cp.store.session() as s:
                assert json.loads(s.get(SandboxRow, CREATED).services) == ["crm"]
            # The view: the host's mark, then the events after it, each checked.
            view = await a.cp.manager.egress_view(CREATED)
            assert await view.mark() == 7
            seen["view"] = "good"
            events = await view.since(7)
            assert [(e.sandbox_id, e.host, e.service) for e in events] == [
                (CREATED, "a.test", None), (CREATED, "a.test", "crm")
            ]  # fmt: skip
            for how, word in VIEW_REFUSED.items():
                seen["view"] = how
                with pytest.raises(HostMisbehaved) as refused:
                    await view.since(7)
                assert refused.value.status == 502 and word in str(refused.value), (how, refused)
            await a.cp.links.close()
        created = [r for r in _records(a.cp.store, "sandbox.create")
                   if r["resource"] == f"sandbox:{CREATED}"]  # fmt: skip
        assert len(created) == 1 and created[0]["details"]["host"] == HOST
        assert not {"note", "env"} & set(created[0]["details"])
        updates = _records(a.cp.store, "sandbox.update_egress")
        assert [(u["decision"], u["resource"], u["actor"]) for u in updates] == [
            ("allow", f"sandbox:{CREATED}", "user:t"), ("error", f"sandbox:{CREATED}", "user:t")
        ]  # fmt: skip
        assert updates[0]["details"] == {
            "egress": rules.to_dict(), "services": ["crm"], "host": HOST
        }  # fmt: skip
        views = [r["reason"] for r in _records(a.cp.store, "host.answer_refused")
                 if "/egress" in r["reason"]]  # fmt: skip
        assert len(views) == len(VIEW_REFUSED), views
