"""`ScriptedHttpServerForTests`: a real TCP server on 127.0.0.1 that answers each HTTP request
with what a test scripts, byte by byte: the control plane's side of what a client must survive
(refusals, slow streams, unread uploads, answers broken off, silence, idle closes)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable

# Answers one request: (connection, the request's head) -> whether to close the connection.
Script = Callable[[socket.socket, bytes], bool | None]


class ScriptedHttpServerForTests:
    """Accepts connections on 127.0.0.1 and answers every request on them with `script`."""

    def __init__(self, script: Script):
        self.script = script
        self.connections = 0
        self.heads: list[bytes] = []
        # What arrived after the last head, already read off its connection (a body's start).
        self.after_head = b""
        self.closed_by_client = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            buffered = b""
            while True:
                while b"\r\n\r\n" not in buffered:
                    data = conn.recv(65536)
                    if not data:
                        self.closed_by_client.set()
                        return
                    buffered += data
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                self.heads.append(head)
                self.after_head = buffered
                if self.script(conn, head):
                    return

    def close(self) -> None:
        self._listener.close()


def answer(status: str, body: bytes, *, extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def json_answer(value: object, status: str = "200 OK", *, extra_close: bool = False) -> bytes:
    extra = "content-type: application/json\r\n" + ("connection: close\r\n" if extra_close else "")
    return answer(status, json.dumps(value).encode(), extra=extra)
