"""The guest's only way out: 127.0.0.1:3128, each connection carried byte for byte to the host's
egress proxy over a fresh connection; every command gets HTTP(S)_PROXY pointing at it."""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time

from aamp.guest.endpoint import CONNECT_TIMEOUT, Endpoint
from aamp.guest.errors import log

FORWARDER_ADDRESS = ("127.0.0.1", 3128)
FORWARDER_CHUNK = 256 * 1024
PROXY_URL = "http://127.0.0.1:3128"
PROXY_ENV = {
    "HTTP_PROXY": PROXY_URL,
    "HTTPS_PROXY": PROXY_URL,
    "http_proxy": PROXY_URL,
    "https_proxy": PROXY_URL,
    "NO_PROXY": "localhost,127.0.0.1",
    "no_proxy": "localhost,127.0.0.1",
}


class Forwarder:
    """Listens on 127.0.0.1:3128 in the guest; each accepted connection gets its own
    connection to the host's egress proxy and a thread copying bytes both ways (half-closes
    passed on). Nothing is parsed here: the host's proxy is where every decision is made."""

    def __init__(
        self,
        upstream: Endpoint,
        address: tuple[str, int] = FORWARDER_ADDRESS,
        listener_fd: int | None = None,
    ):
        """`listener_fd`: a socket already listening on `address` (the first stage binds it
        before the agent starts, so a first command's connections wait there)."""
        self.upstream = upstream
        if listener_fd is not None:
            self.listener = socket.socket(fileno=listener_fd)
        else:
            self.listener = socket.create_server(address, backlog=128)
        self.address = self.listener.getsockname()

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="egress-forwarder", daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.05)  # out of descriptors: let other connections finish
                    continue
                log(f"egress forwarder stopped: {exc}")
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.socket(self.upstream.family, socket.SOCK_STREAM)
        try:
            upstream.settimeout(CONNECT_TIMEOUT)
            upstream.connect(self.upstream.address)
            upstream.settimeout(None)
        except OSError:
            # The host's proxy is unreachable: the guest sees a closed connection.
            client.close()
            upstream.close()
            return
        peers = {client: upstream, upstream: client}
        open_reads = {client, upstream}
        buf = bytearray(FORWARDER_CHUNK)
        try:
            with selectors.DefaultSelector() as sel:
                for sock in open_reads:
                    sel.register(sock, selectors.EVENT_READ)
                while open_reads:
                    for key, _ in sel.select():
                        src: socket.socket = key.fileobj  # type: ignore[assignment]
                        try:
                            n = src.recv_into(buf)
                        except OSError:
                            n = 0
                        if n:
                            peers[src].sendall(memoryview(buf)[:n])
                            continue
                        sel.unregister(src)
                        open_reads.discard(src)
                        with contextlib.suppress(OSError):
                            peers[src].shutdown(socket.SHUT_WR)
        except OSError:
            pass  # either side reset: drop both
        finally:
            client.close()
            upstream.close()
