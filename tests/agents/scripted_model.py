"""`ScriptedModelServerForTests`: a test double of an OpenAI-compatible chat-completions server.

A real HTTP server on a loopback address that answers `POST /v1/chat/completions` by replaying
a script, one turn per request, so the agent loop can be tested deterministically without a
model. It keeps every request it received (the messages, so tests can see the observations the
loop sent back), its headers (`headers`: what credentials arrived) and when it arrived
(`arrived`, `time.monotonic()`). Turns:

- `{"tool_calls": [{"name": "python", "arguments": {...}}]}` — arguments may also be a raw
  string (to send invalid JSON); in arguments, `{"$ref": ["button", "Save"]}` becomes the ref
  of that element (exact role and name) in the latest browser snapshot the loop sent, as a
  model reading the snapshot would pick it (snapshot_refs.py);
- `{"content": "the final answer"}`;
- `{"status": 500}` — an HTTP error (the client retries 5xx); with `"retry_after": "2"` the
  answer carries that `Retry-After` header;
- `{"sleep": 2.5, ...}` — wait before answering (timeouts);
- when the script runs out, every further request gets `{"content": "script exhausted"}`.

Usable in-process (`with ScriptedModelServerForTests(turns) as s: s.base_url`) or as a
process: `python scripted_model.py SCRIPT.json PORTFILE [HOST]` writes the port it bound.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from snapshot_refs import fill_refs


class ScriptedModelServerForTests:
    def __init__(self, turns: list[dict[str, Any]], host: str = "127.0.0.1", port: int = 0):
        self.turns = list(turns)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.arrived: list[float] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def __enter__(self) -> ScriptedModelServerForTests:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def _next(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.requests.append(request)
            return self.turns.pop(0) if self.turns else {"content": "script exhausted"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                double.headers.append({k.lower(): v for k, v in self.headers.items()})
                double.arrived.append(time.monotonic())
                if not self.path.endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                turn = double._next(request)
                if turn.get("sleep"):
                    time.sleep(float(turn["sleep"]))
                if turn.get("status"):
                    failure = {"error": {"message": "scripted failure"}}
                    self._send(int(turn["status"]), failure, turn.get("retry_after"))
                    return
                answer = completion(request, turn, len(double.requests))
                self._send(200, answer, trickle=float(turn.get("trickle", 0)))

            def _send(
                self,
                status: int,
                body: dict[str, Any],
                retry_after: str | None = None,
                trickle: float = 0,
            ) -> None:
                """The answer; with `trickle`, its body in ten pieces over that many seconds."""
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    if retry_after is not None:
                        self.send_header("Retry-After", retry_after)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    step = -(-len(data) // 10) if trickle else len(data)
                    for at in range(0, len(data), step):
                        self.wfile.write(data[at : at + step])
                        self.wfile.flush()
                        time.sleep(trickle / 10)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def _latest_snapshot(request: dict[str, Any]) -> str:
    for m in reversed(request.get("messages", [])):
        if m.get("role") == "tool" and "\nsnapshot:\n" in str(m.get("content")):
            return str(m["content"])
    return ""


def completion(request: dict[str, Any], turn: dict[str, Any], n: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.get("content")}
    calls = []
    for i, call in enumerate(turn.get("tool_calls", [])):
        args = call.get("arguments", {})
        if not isinstance(args, str):
            args = fill_refs(args, _latest_snapshot(request))
        calls.append(
            {
                "id": f"call_{n}_{i}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    if calls:
        message["tool_calls"] = calls
    prompt = sum(len(str(m.get("content") or "")) for m in request.get("messages", []))
    completion_chars = len(json.dumps(message))
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "scripted"),
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt // 4 + 1,
            "completion_tokens": completion_chars // 4 + 1,
            "total_tokens": prompt // 4 + completion_chars // 4 + 2,
        },
    }


def main() -> None:
    turns = json.loads(Path(sys.argv[1]).read_text())
    host = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"
    server = ScriptedModelServerForTests(turns, host=host)
    Path(sys.argv[2]).write_text(str(server.port))
    server.serve_forever()


if __name__ == "__main__":
    main()
