"""CONNECT: decide, then either relay a byte tunnel until both sides end, or intercept.

`Tunnels.serve` handles one `CONNECT host:port`: the target must carry a port and agree with
any Host header; the destination goes through the one decision (`decision.py`); a granted
service's origin is intercepted (`intercept.start_interception`: the proxy becomes the TLS
server and the request loop serves the requests inside); anything else is connected to a
checked address and relayed. On Linux the relay takes both sockets out of their asyncio
transports and moves bytes with splice(2) through a pipe, never entering Python — what makes a
tunnel nearly as fast as a direct connection; elsewhere stream pumps do the same job. Half-
closes are passed on; `max_bytes_out` is enforced to the byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from aamp.egress import splice
from aamp.egress.bodies import Bodies
from aamp.egress.ca import LeafSource
from aamp.egress.decision import Decider
from aamp.egress.http1 import Refusal, RequestHead, check_host_header, parse_authority
from aamp.egress.intercept import Intercepted, start_interception
from aamp.egress.limits import ProxyLimits
from aamp.egress.meter import Attempt, CapReached, Meter
from aamp.egress.upstream import Connector, Upstream


async def _first_failure(*coroutines) -> None:
    """Run the coroutines until all end; the first exception ends the others and is raised."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Tunnels:
    """CONNECT for one sandbox (`bodies` brings its limits and meter; `leaves` gives the
    leaves for intercepted service origins)."""

    def __init__(
        self, decider: Decider, connector: Connector, bodies: Bodies, leaves: LeafSource | None
    ):
        self.decider, self.connector, self.bodies = decider, connector, bodies
        self.leaves = leaves
        self.limits: ProxyLimits = bodies.limits
        self.meter: Meter = bodies.meter

    async def serve(
        self,
        head: RequestHead,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        attempt: Attempt,
    ) -> Intercepted | None:
        """Serve a CONNECT. A plain tunnel is relayed here until it ends (returns None); a
        service origin's tunnel is intercepted and returned for the request loop to serve."""
        host, port = parse_authority(head.target, None)
        attempt.host, attempt.port = str(host), port
        check_host_header(head, host, port, port)
        verdict = await self.decider.decide(host, port)
        attempt.decision = verdict.decision
        if not verdict.allowed:
            if verdict.address is not None:
                attempt.address = str(verdict.address)
            raise Refusal(verdict.status, verdict.decision.rule, verdict.decision.reason)
        if verdict.service is not None:
            assert self.leaves is not None
            attempt.service = verdict.service.name
            return await start_interception(
                host, port, verdict.service.name, self.leaves, reader, writer, attempt, self.limits
            )
        upstream = await self.connector.open(host, port, verdict.addresses, attempt)
        try:
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
            attempt.status = 200
            await self._relay(reader, writer, upstream, attempt)
        finally:
            await upstream.close()
        return None

    async def _relay(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        upstream: Upstream,
        attempt: Attempt,
    ) -> None:
        """Copy both ways until both sides are done; half-closes are passed on."""
        client = splice.detach(client_r, client_w) if splice.available() else None
        remote = splice.detach(upstream.reader, upstream.writer) if client else None
        if client is not None and remote is not None:
            await self._splice_relay(client, remote, attempt)
            return
        if client is not None:  # pragma: no cover - detaching the second side failed
            client[0].close()
            raise ConnectionResetError("could not take over the tunnel")
        pump = self.bodies.pump
        await _first_failure(
            pump(client_r, upstream.writer, attempt, up=True),
            pump(upstream.reader, client_w, attempt, up=False),
        )

    async def _splice_relay(
        self,
        client: tuple[socket.socket, bytes],
        remote: tuple[socket.socket, bytes],
        attempt: Attempt,
    ) -> None:
        client_sock, client_left = client
        remote_sock, remote_left = remote
        loop = asyncio.get_running_loop()
        meter = self.meter
        try:
            if client_left:
                room = meter.room_up(len(client_left))
                await loop.sock_sendall(remote_sock, client_left[:room])
                meter.count(attempt, room, up=True)
                if room < len(client_left):
                    raise CapReached()
            if remote_left:
                await loop.sock_sendall(client_sock, remote_left)
                meter.count(attempt, len(remote_left), up=False)
            await _first_failure(
                self._splice(client_sock, remote_sock, attempt, up=True),
                self._splice(remote_sock, client_sock, attempt, up=False),
            )
        finally:
            client_sock.close()
            remote_sock.close()

    async def _splice(
        self, src: socket.socket, dst: socket.socket, attempt: Attempt, *, up: bool
    ) -> None:
        """Move bytes src → dst with splice(2) until src ends, then pass the half-close on."""
        meter = self.meter
        await splice.move(
            src.fileno(),
            dst.fileno(),
            length=None,
            room=meter.room(up=up),
            count=lambda n: meter.count(attempt, n, up=up),
        )
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
