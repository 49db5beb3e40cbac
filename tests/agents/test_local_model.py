"""The local model (optional extra): the `aamp-tools` chat format shows tools and tool results to
the model and shapes calls by grammar; the launcher finds the packaged GGUF, listens on loopback
only, and serves real tool-calling completions that aamp's own model client and argument checks
accept. The server tests are skipped, saying what is missing, when the extra is not installed
(`scripts/install-local-model`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from aamp.agents import local_model
from aamp.agents.definition import ModelConfig
from aamp.agents.local_model import (
    LocalModelServer,
    LocalModelUnavailable,
    choice_grammar,
    grammar_schema,
    render_prompt,
)
from aamp.agents.model import EndpointAccess, ModelClient
from aamp.agents.tools import SCHEMAS, ToolSet
from aamp.egress.registered import CheckedTransport, RegisteredUrl
from aamp.egress.resolver import SystemResolver

MISSING = local_model.missing_parts()
needs_extra = pytest.mark.skipif(
    bool(MISSING),
    reason=f"local model extra not installed (missing: {', '.join(MISSING)}); "
    "run scripts/install-local-model",
)


def test_the_prompt_shows_tools_calls_and_their_results() -> None:
    tools = ToolSet.build(("shell",), {}).openai()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "How many files?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "exit 0\n3 files"},
    ]
    prompt = render_prompt(messages, tools)
    assert prompt.startswith("<|im_start|>system\nBe brief.")
    assert "functions.shell: Run a shell command" in prompt
    assert "<|im_start|>assistant\nfunctions.shell:\n{}<|im_end|>" in prompt
    assert "Result of functions.shell:\nexit 0\n3 files<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_without_tools_the_prompt_is_plain_chatml() -> None:
    prompt = render_prompt([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], [])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_the_grammar_schema_keeps_shape_and_drops_bounds() -> None:
    shaped = grammar_schema(SCHEMAS["files"]["parameters"])
    assert shaped["required"] == ["action", "path"]
    assert shaped["properties"]["action"] == {"enum": ["list", "read", "write"]}
    assert shaped["properties"]["path"] == {"type": "string"}
    assert "if" not in shaped and "additionalProperties" not in shaped
    assert choice_grammar(["shell", "python"]) == (
        'root ::= "message:" | "functions.shell:" | "functions.python:"\n'
    )


def test_null_content_of_a_tool_calling_turn_is_dropped_and_nothing_else() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}
    body = json.dumps({"messages": [{"role": "user", "content": "x"}, call]}).encode()
    fixed = json.loads(local_model.openai_nulls(body))
    assert fixed["messages"][1] == {"role": "assistant", "tool_calls": [{"id": "c"}]}
    untouched = json.dumps({"messages": [{"role": "user", "content": None}]}).encode()
    assert local_model.openai_nulls(untouched) == untouched
    assert local_model.openai_nulls(b"not json") == b"not json"


def test_the_server_listens_on_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback address only"):
        LocalModelServer(host="0.0.0.0").start()
    assert local_model.main(["serve", "--host", "192.168.1.1"]) == 2


def test_a_missing_model_package_is_named() -> None:
    with pytest.raises(LocalModelUnavailable, match="no-such-model-package is not installed"):
        local_model.find_model_file("no-such-model-package")


@pytest.fixture(scope="module")
def server() -> Iterator[LocalModelServer]:
    with LocalModelServer(n_ctx=4096) as s:
        yield s
    assert s._proc is None


@needs_extra
def test_the_packaged_model_file_is_a_gguf() -> None:
    path = local_model.find_model_file()
    assert path.suffix == ".gguf" and path.stat().st_size > 10_000_000
    assert path.read_bytes()[:4] == b"GGUF"


@needs_extra
async def test_a_real_tool_call_passes_aamps_own_checks(server: LocalModelServer) -> None:
    tools = ToolSet.build(("shell", "python", "files"), {})
    url = RegisteredUrl.parse(server.base_url)
    client = ModelClient(
        ModelConfig(endpoint="local", name=local_model.MODEL_ALIAS, temperature=0.0),
        EndpointAccess(
            "local",
            server.base_url,
            CheckedTransport("model endpoint local", url, SystemResolver()),
        ),
    )
    messages = [
        {"role": "system", "content": "You are a precise assistant. Use the tools."},
        {"role": "user", "content": "List the files in /workspace/in with the shell tool."},
    ]
    try:
        reply = await client.complete(messages, tools.openai(), 256)
        assert reply.prompt_tokens > 100 and reply.completion_tokens > 0
        assert reply.tool_calls, f"expected a tool call, got {reply.content!r}"
        call = reply.tool_calls[0]
        assert reply.finish_reason == "tool_calls" and call.name in tools.specs
        args, problem = tools.check_call(call.name, call.arguments)
        assert problem is None, problem
        assert isinstance(args, dict)
        # The observation goes back and the model answers or calls again, never an error.
        messages += [
            reply.raw_message,
            {"role": "tool", "tool_call_id": call.id, "content": "a.csv"},
        ]
        again = await client.complete(messages, tools.openai(), 128)
        assert again.prompt_tokens > reply.prompt_tokens
        assert again.content or again.tool_calls
        for c in again.tool_calls:
            assert tools.check_call(c.name, c.arguments)[1] is None
    finally:
        await client.close()


@needs_extra
async def test_a_forced_tool_choice_yields_schema_shaped_arguments(
    server: LocalModelServer,
) -> None:
    import httpx

    tools = ToolSet.build(("files",), {})
    body = {
        "model": local_model.MODEL_ALIAS,
        "messages": [{"role": "user", "content": "Read the file notes.txt."}],
        "tools": tools.openai(),
        "tool_choice": {"type": "function", "function": {"name": "files"}},
        "temperature": 0,
        "max_tokens": 128,
    }
    async with httpx.AsyncClient(timeout=120) as c:
        r = await c.post(f"{server.base_url}/chat/completions", json=body)
    assert r.status_code == 200, r.text
    call = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "files"
    args = json.loads(call["arguments"])
    assert args["action"] in ("list", "read", "write") and isinstance(args["path"], str)


def test_aamp_model_names_the_install_step_or_the_model(tmp_path):
    """`aamp model path` either prints the packaged GGUF file or says how to install it."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "aamp", "model", "path"], capture_output=True, text=True, timeout=60
    )
    if done.returncode == 0:
        assert done.stdout.strip().endswith(".gguf")
    else:
        assert "install-local-model" in done.stderr, done.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "aamp", "model", "serve", "--host", "10.0.0.1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "loopback" in refused.stderr
