"""The host's end of the link: what a control-plane replica may ask of the sandboxes this host
runs — create (with its egress rules and services, never a secret; its packages: the
wheels offered by SHA-256 first, `POST /link/wheels`, those lacking sent, `PUT
/link/wheels/SHA256`, and the layer built here from them: `received_wheels.py`; and the
read-only files it mounts, sent ahead by hash: `files/SHA/hold`, `files/SHA`;
`host_files.py`), describe, list, destroy, exec, files in and out, the browser,
knowledge-base searches (`search`: by a resident worker the host keeps per sandbox, since a
link exec keeps no stdin open), who answers a sandbox's `default: ask` questions
(`approver`: the replica whose run drives it), new egress rules and services for a sandbox
(`PUT egress`) and its proxy's recent events (`GET egress`: a mark, or the events after one,
at most `KEPT_PER_SANDBOX`; the replica checks them, `link_egress.py`) — and what it
collects from the host (`collect`: egress records for the audit chain, credential asks, leaf
certificate requests and egress questions, which it answers at `asks/{id}`;
`host_outbox.py`).

Served over TLS with the host's link certificate, and only to clients holding a replica's
certificate from the installation's link CA (`link_ca.py`; the handshake refuses anyone
else, so no route here checks a credential). A replica never reaches a guest directly: every
byte goes through this app to the host's own `SandboxManager`.

A create names the host epoch its placement reserved capacity under; a create for another
life of this host (the host registered again since, its reservations gone) is refused with
409 `stale_epoch` and boots nothing.

Errors leave as JSON `{code, message, kind}` with their status; `kind` says which exception
the replica raises again (`link_client.py`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from aamp.egress.rules import EgressRules
from aamp.egress.services import Service, ServiceError, ServiceSet
from aamp.errors import AampError
from aamp.fleet.host_files import HostFiles
from aamp.fleet.host_outbox import HostOutbox, LinkApprover
from aamp.policy import Resources
from aamp.policy.hosts import HostError
from aamp.sandbox.channel.errors import ChannelError, GuestError, GuestTimeout
from aamp.sandbox.channel.exec_stream import exec_lines
from aamp.sandbox.driver import ReadOnlyFile
from aamp.sandbox.held_download import open_download
from aamp.sandbox.image_commands import ImageBuildError
from aamp.sandbox.manager import CreateRequest, SandboxManager, block_everything
from aamp.sandbox.rag_worker import SearchWorker, WorkerFailed
from aamp.sandbox.received_wheels import MAX_OFFERED, ReceivedWheels, WheelRef, WheelRefused
from aamp.sandbox.wheelhouse import WheelhouseError

MAX_BODY = 24 * 1024 * 1024
STOP_GRACE_SECONDS = 3  # how long a stopping link lets open connections finish
log = logging.getLogger("aamp.fleet")


def error_answer(exc: Exception) -> JSONResponse:
    if isinstance(exc, AampError):
        body = {"code": exc.code, "message": str(exc), "kind": "aamp"}
        return JSONResponse(body, status_code=exc.status)
    if isinstance(exc, GuestTimeout):
        return JSONResponse({"code": "guest_timeout", "message": str(exc), "kind": "timeout"}, 504)
    code = exc.code if isinstance(exc, GuestError) else "guest_error"
    return JSONResponse({"code": code, "message": str(exc), "kind": "guest"}, 502)


def link_app(
    manager: SandboxManager,
    epoch: Callable[[], int],
    host_id: str,
    proof: Callable[[], str | None],
    outbox: HostOutbox | None = None,
    files: HostFiles | None = None,
) -> Starlette:
    """The link's routes over `manager`; `epoch()` is the host's current life, `proof()` the
    nonce of its registration in flight (None between registrations), `outbox` what its
    egress proxies have for the control plane (`host_outbox.py`; None: nothing), `files`
    where the read-only files of its creates are kept (None: it takes none)."""

    # Each sandbox's resident knowledge-base worker (`search`), ended with its sandbox.
    workers: dict[str, SearchWorker] = {}

    async def end_workers() -> None:
        live = {s.id for s in manager.list()}
        for sandbox_id in [i for i in workers if i not in live]:
            with contextlib.suppress(Exception):  # its sandbox, and the process, are gone
                await workers.pop(sandbox_id).close()

    async def search(request: Request) -> Response:
        sandbox_id, body = request.path_params["sandbox_id"], await _json(request)
        manager.get(sandbox_id)
        await end_workers()
        warm, asked, timeout = body.get("warm") or [], body.get("request"), body.get("timeout")
        if not (isinstance(warm, list) and len(warm) <= 16 and all(
                isinstance(w, str) and 0 < len(w) <= 300 for w in warm)):  # fmt: skip
            raise _Refused(400, "invalid_request", "warm is a list of index paths")
        if asked is not None and not isinstance(asked, dict):
            raise _Refused(400, "invalid_request", "request is a search request or null")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise _Refused(400, "invalid_request", "timeout is a number of seconds")
        if not 0 < timeout <= 3600:
            raise _Refused(400, "invalid_request", "timeout is 0 to 3600 seconds")
        worker = workers.get(sandbox_id)
        if worker is None or worker.warm != tuple(warm):
            if worker is not None:
                await worker.close()
            worker = workers[sandbox_id] = SearchWorker(warm=tuple(warm))
        try:
            async with manager.use(sandbox_id) as channel:
                if asked is None:
                    await worker.start(channel, float(timeout))
                    return JSONResponse({})
                answer = await worker.search(channel, asked, float(timeout))
        except WorkerFailed as exc:
            body = {"code": "worker_failed", "message": str(exc), "kind": "guest"}
            return JSONResponse(body, status_code=502)
        return JSONResponse(answer)

    def host_files() -> HostFiles:
        if files is None:
            raise _Refused(400, "invalid_request", "this host takes no read-only files")
        return files

    async def hold_file(request: Request) -> Response:
        body = await _json(request)
        store = host_files()
        store.sweep({s.id for s in manager.list()})
        sha, hold = request.path_params["sha"], str(body.get("hold", ""))
        return JSONResponse({"present": await store.hold(sha, body.get("size"), hold)})

    async def put_host_file(request: Request) -> Response:
        raw = request.headers.get("content-length", "")
        if not raw.isdigit():
            raise _Refused(411, "length_required", "a file sent over the link needs its length")
        hold = request.query_params.get("hold", "")
        await host_files().put(request.path_params["sha"], hold, int(raw), request.stream())
        return Response(status_code=204)

    async def claimed(body: dict[str, Any]) -> tuple[str, tuple[ReadOnlyFile, ...]]:
        """The create's hold id and its files, each claimed (held and present here)."""
        wanted = body.get("files") or []
        if not wanted:
            return "", ()
        if not isinstance(wanted, list) or not all(isinstance(f, dict) for f in wanted):
            raise _Refused(400, "invalid_request", "files is a list of {sha256, target}")
        hold = str(body.get("hold", ""))
        paths = await host_files().claim(hold, [str(f.get("sha256")) for f in wanted])
        try:
            pairs = zip(paths, wanted, strict=True)
            mounts = tuple(ReadOnlyFile(p, str(f.get("target"))) for p, f in pairs)
        except ValueError as exc:
            host_files().forget(hold)
            raise _Refused(400, "invalid_request", f"files: {exc}") from None
        return hold, mounts

    def received() -> ReceivedWheels:  # the wheels replicas sent this host
        return ReceivedWheels(manager.settings.home)

    async def hello(request: Request) -> Response:
        # Only replicas get here (the handshake): one checking a registration compares
        # `proof` with what the registration carried (`HostLinks.verify`).
        return JSONResponse({"id": host_id, "epoch": epoch(), "proof": proof()})

    async def create(request: Request) -> Response:
        body = await _json(request)
        if body.get("epoch") != epoch():
            return JSONResponse(
                {
                    "code": "stale_epoch",
                    "message": f"host {host_id} is in epoch {epoch()}, the placement was for "
                    f"epoch {body.get('epoch')!r}; place the sandbox again",
                    "kind": "aamp",
                },
                status_code=409,
            )
        resources = Resources(**body.get("resources", {}))
        egress, services = egress_of(body)
        packages = body.get("packages", [])
        if (
            not isinstance(packages, list)
            or len(packages) > MAX_OFFERED
            or not all(isinstance(p, str) and 0 < len(p) <= 300 for p in packages)
        ):
            raise _Refused(400, "invalid_request", "packages is a list of name==version")
        wanted = CreateRequest(
            image=body["image"],
            driver=body.get("driver"),
            ttl=body["ttl"],
            idle=body["idle"],
            resources=resources,
            egress=egress,
            services=services,
            packages=tuple(packages),
        )
        wheels = await _layer(body["image"], tuple(packages), body.get("wheels", []))
        hold, mounts = await claimed(body)
        try:
            sandbox = await manager.create(
                replace(wanted, read_only_files=mounts),
                actor=str(body.get("actor", "system")),
                placed_on=host_id,  # the replica that sent it placed it and records it
                wheels=wheels,
            )
        except BaseException:
            if mounts:
                host_files().forget(hold)
            raise
        if mounts:
            host_files().attach(hold, sandbox.id)
        return JSONResponse(sandbox.describe(), status_code=201)

    def egress_of(body: dict[str, Any]) -> tuple[EgressRules, ServiceSet]:
        """A create's or an update's egress rules and services, checked; services only
        where this host can have their credentials."""
        try:
            egress = EgressRules.from_dict(body.get("egress", block_everything().to_dict()))
            services = ServiceSet(Service.from_dict(d) for d in body.get("services") or [])
        except (HostError, ServiceError) as exc:
            raise _Refused(400, "invalid_request", f"egress: {exc}") from None
        if services and outbox is None and manager.secrets is None:
            # A host's proxies ask over the link (`outbox`); a replica's own read its vault.
            raise _Refused(400, "invalid_request", "this host cannot inject service credentials")
        return egress, services

    async def update_egress(request: Request) -> Response:
        sandbox_id, body = request.path_params["sandbox_id"], await _json(request)
        egress, services = egress_of(body)
        # Applied here and recorded by the replica that asked (`SandboxManager.update_egress`).
        unchanged = body.get("services") is None
        manager.apply_egress(sandbox_id, egress, None if unchanged else services)
        return Response(status_code=204)

    async def egress_view(request: Request) -> Response:
        # The host's own view (kept from the first ask on); `after` absent: only its mark.
        sandbox = manager.get(request.path_params["sandbox_id"])
        view = manager.recent_egress.view(sandbox.id)
        after = request.query_params.get("after")
        events = [e.to_dict() for e in await view.since(int(after))] if after is not None else []
        return JSONResponse({"mark": await view.mark(), "events": events})

    async def _layer(
        image_name: str, packages: tuple[str, ...], offered: object
    ) -> list[tuple[Path, str]] | None:
        """The received wheels of a create's packages, their layer built here (so that what
        this host cannot do is answered as its refusal of the packages: `wheel_refused`,
        `packages_refused`); None for a create without packages."""
        if not packages:
            return None
        try:
            wheels = received().paths(WheelRef.listed(offered))
        except WheelRefused as exc:
            raise _Refused(exc.status, "wheel_refused", str(exc)) from None
        try:
            image = manager.images.get(image_name)
        except (ValueError, LookupError):
            return wheels  # the create says which image this host lacks
        try:
            await asyncio.to_thread(manager.images.with_wheels, image, packages, wheels)
        except WheelhouseError as exc:
            raise _Refused(400, "packages_refused", str(exc)) from None
        except ImageBuildError as exc:
            message = f"the image with packages could not be built here: {exc}"
            raise _Refused(503, "packages_refused", message) from None
        return wheels

    async def offer_wheels(request: Request) -> Response:
        # Which of the wheels a create needs this host does not keep yet.
        try:
            offered = WheelRef.listed((await _json(request)).get("wheels"))
        except WheelRefused as exc:
            raise _Refused(exc.status, "wheel_refused", str(exc)) from None
        return JSONResponse({"lacking": received().lacking(offered)})

    async def put_wheel(request: Request) -> Response:
        raw = request.headers.get("content-length", "")
        if not raw.isdigit():
            raise _Refused(411, "length_required", "a wheel sent over the link needs its length")
        try:
            ref = WheelRef(request.path_params["sha256"], request.query_params.get("filename"))
            await received().keep(ref, request.stream(), int(raw))
        except WheelRefused as exc:
            log.warning("host %s: a wheel was refused: %s", host_id, exc)
            raise _Refused(exc.status, "wheel_refused", str(exc)) from None
        return Response(status_code=204)

    async def collect(request: Request) -> Response:
        body = await _json(request)
        if outbox is None:  # a replica's own host: its proxies write their records there
            return JSONResponse({"items": [], "idle": True})
        ack = [str(i) for i in body.get("ack", [])][:1000]
        replica = body.get("replica")
        replica = str(replica)[:64] if replica is not None else None
        items = await outbox.collect(ack, float(body.get("wait", 0)), replica=replica)
        return JSONResponse({"items": items})

    async def answer(request: Request) -> Response:
        body = await _json(request)
        if outbox is None or not outbox.answer(request.path_params["ask_id"], body):
            raise _Refused(404, "unknown_ask", "no such credential ask waits")
        return Response(status_code=204)

    async def approver(request: Request) -> Response:
        # The replica whose run drives this sandbox answers its `default: ask` questions
        # from now on (`replica` None: nobody, they are refused), each within `timeout`.
        sandbox_id, body = request.path_params["sandbox_id"], await _json(request)
        manager.get(sandbox_id)
        if outbox is None:  # a replica's own host: questions reach only its own replica
            raise _Refused(
                400,
                "invalid_request",
                "this host is a replica's own: its sandboxes' egress questions reach only that "
                "replica, so a run with `egress.default: ask` is driven there or on an "
                "`aamp host` machine",
            )
        replica, timeout = body.get("replica"), float(body.get("timeout", 300))
        if replica is not None and not (isinstance(replica, str) and 0 < len(replica) <= 64):
            raise _Refused(400, "invalid_request", "replica names the replica that answers")
        if not 0 < timeout <= 86400:
            raise _Refused(400, "invalid_request", "timeout is 0 to 86400 seconds")
        ask = LinkApprover(outbox, sandbox_id, timeout) if replica is not None else None
        await manager.set_egress_approver(sandbox_id, ask)
        outbox.answer_for(sandbox_id, replica)
        return Response(status_code=204)

    async def listing(request: Request) -> Response:
        return JSONResponse([s.describe() for s in manager.list()])

    async def describe(request: Request) -> Response:
        return JSONResponse(manager.get(request.path_params["sandbox_id"]).describe())

    async def destroy(request: Request) -> Response:
        reason = request.query_params.get("reason", "requested")[:200]
        actor = request.query_params.get("actor", "system")[:300]
        await manager.destroy(request.path_params["sandbox_id"], reason=reason, actor=actor)
        if outbox is not None:
            outbox.answer_for(request.path_params["sandbox_id"], None)
        if files is not None:  # the files only it mounted go now
            files.sweep({s.id for s in manager.list()})
        await end_workers()
        return Response(status_code=204)

    async def exec_(request: Request) -> Response:
        sandbox_id = request.path_params["sandbox_id"]
        body = await _json(request)
        manager.get(sandbox_id)
        stdin = _stdin(body.get("stdin_b64"))
        use = manager.use(sandbox_id)
        channel = await use.__aenter__()
        try:
            session = await channel.exec(
                list(body["argv"]),
                env=dict(body.get("env") or {}),
                cwd=body.get("cwd"),
                stdin=stdin,
                timeout=body.get("timeout"),
            )
        except BaseException:
            await use.__aexit__(None, None, None)
            raise

        async def lines() -> AsyncIterator[bytes]:
            try:
                async for line in exec_lines(session):
                    yield line
            finally:
                await use.__aexit__(None, None, None)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def put_file(request: Request) -> Response:
        sandbox_id, path = request.path_params["sandbox_id"], request.query_params["path"]
        raw = request.headers.get("content-length", "")
        if not raw.isdigit():
            raise _Refused(411, "length_required", "a file sent over the link needs its length")
        async with manager.use(sandbox_id) as channel:
            await channel.put(path, request.stream(), int(raw))
        return Response(status_code=204)

    async def get_file(request: Request) -> Response:
        sandbox_id, path = request.path_params["sandbox_id"], request.query_params["path"]
        stream = await open_download(manager, sandbox_id, path)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                await stream.aclose()

        return StreamingResponse(
            chunks(),
            media_type="application/octet-stream",
            headers={"content-length": str(stream.size)},
        )

    async def browser(request: Request) -> Response:
        body = await _json(request)
        async with manager.use(request.path_params["sandbox_id"]) as channel:
            answer = await channel.browser(
                body["request"], timeout=float(body["timeout"]), max_answer=int(body["max_answer"])
            )
        return Response(answer, media_type="application/json")

    def guarded(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except _Refused as exc:
                return JSONResponse(
                    {"code": exc.code, "message": exc.message, "kind": "aamp"}, exc.status
                )
            except (AampError, ChannelError) as exc:
                return error_answer(exc)
            except (KeyError, TypeError, ValueError) as exc:
                message = f"a malformed link request: {exc!r}"
                return JSONResponse({"code": "invalid_request", "message": message}, 400)

        return run

    sb = "/link/sandboxes/{sandbox_id:str}"
    return Starlette(
        routes=[
            Route("/link/hello", guarded(hello)),
            Route("/link/collect", guarded(collect), methods=["POST"]),
            Route("/link/asks/{ask_id:str}", guarded(answer), methods=["POST"]),
            Route("/link/files/{sha:str}/hold", guarded(hold_file), methods=["POST"]),
            Route("/link/files/{sha:str}", guarded(put_host_file), methods=["PUT"]),
            Route("/link/wheels", guarded(offer_wheels), methods=["POST"]),
            Route("/link/wheels/{sha256:str}", guarded(put_wheel), methods=["PUT"]),
            Route("/link/sandboxes", guarded(create), methods=["POST"]),
            Route("/link/sandboxes", guarded(listing), methods=["GET"]),
            Route(sb, guarded(describe), methods=["GET"]),
            Route(sb, guarded(destroy), methods=["DELETE"]),
            Route(sb + "/exec", guarded(exec_), methods=["POST"]),
            Route(sb + "/files", guarded(put_file), methods=["PUT"]),
            Route(sb + "/files", guarded(get_file), methods=["GET"]),
            Route(sb + "/browser", guarded(browser), methods=["POST"]),
            Route(sb + "/search", guarded(search), methods=["POST"]),
            Route(sb + "/approver", guarded(approver), methods=["POST"]),
            Route(sb + "/egress", guarded(update_egress), methods=["PUT"]),
            Route(sb + "/egress", guarded(egress_view), methods=["GET"]),
        ]
    )


def link_server(
    app: Starlette, cert: Path, key: Path, ca: Path, host: str, port: int
) -> uvicorn.Server:
    """The server of a host's link: TLS with the host's certificate, and only a client
    certificate from the link CA (`ca`) gets through the handshake."""
    return uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            ssl_certfile=str(cert),
            ssl_keyfile=str(key),
            ssl_ca_certs=str(ca),
            ssl_cert_reqs=ssl.CERT_REQUIRED,  # only a replica's certificate gets through
            log_level="warning",
            access_log=False,
            lifespan="off",
            # Closing a replica's idle pooled connection sends TLS close_notify and waits for
            # the peer's, which an idle client never sends: asyncio gives up only after its
            # 30 s ssl_shutdown_timeout, and stopping a host (or `aamp up` with its own
            # host's link) waited that long. Past this grace the stop goes on.
            timeout_graceful_shutdown=STOP_GRACE_SECONDS,
        )
    )


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


async def _json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise _Refused(413, "too_large", f"a link request is limited to {MAX_BODY} bytes")
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise _Refused(400, "invalid_request", "a link request is a JSON object")
    return body


def _stdin(value: object) -> bytes | None:
    if value is None:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise _Refused(400, "invalid_request", "stdin_b64 is not valid base64") from None
