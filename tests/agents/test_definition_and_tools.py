"""Agent definitions parse whole or not at all, naming each bad field; tool arguments are
checked against their schemas; observations are truncated with a note; the model client
retries transient errors with backoff and then fails with the reason (against the scripted
model double, a real HTTP server on loopback)."""

from __future__ import annotations

import json

import pytest
from scripted_model import ScriptedModelServerForTests

from aamp.agents.definition import (
    DefinitionError,
    ModelConfig,
    definition_from_dict,
    endpoint_problems,
    parse_definition,
    stored_form,
)
from aamp.agents.model import EndpointAccess, ModelClient, ModelError
from aamp.agents.tools import ToolSet, truncate
from aamp.egress.registered import AddressVerdict, CheckedTransport, RegisteredUrl
from aamp.egress.resolver import StaticResolver, SystemResolver
from aamp.policy import PolicyError, parse_policy

GOOD = """
name: fin
model: {endpoint: llm, name: qwen2.5}
tools: [shell, python, files, browser, "service:crm"]
policy: finance-reports
limits: {max_steps: 7, wall_time: 1h30m, observation_bytes: 4kB}
"""


def test_a_good_definition_round_trips_through_its_stored_form() -> None:
    d = parse_definition(GOOD)
    assert d.limits.max_steps == 7 and d.limits.wall_time_seconds == 5400
    assert d.limits.observation_bytes == 4000 and d.services == ("crm",)
    assert definition_from_dict(json.loads(stored_form(d))) == d


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("model: {base_url: ftp://x, name: m}\npolicy: p", "model.base_url"),
        ("model: {endpoint: llm, name: m}\npolicy: p\ntools: [bash]", "tools[0]"),
        ("model: {endpoint: llm, name: m}\npolicy: p\nlimits: {max_steps: 0}", "max_steps"),
        ("model: {endpoint: llm, name: m}\npolicy: p\nlimits: {wall_time: 5x}", "wall_time"),
        ("model: {endpoint: llm, name: m}\npolicy: p\nlimit: {}", "limit:"),
        ("model: {endpoint: llm, name: m}", "policy"),
        ("model: {endpoint: llm, name: m, api_key_secret: 'a b'}\npolicy: p", "api_key"),
        ("model: {endpoint: 'Not An Endpoint', name: m}\npolicy: p", "model.endpoint"),
        ("model: {name: m}\npolicy: p", "model.endpoint: required"),
        ("[1, 2]", "expected a mapping"),
    ],
)
def test_bad_definitions_name_the_field(text: str, field: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(text)
    assert field in str(caught.value)


def test_a_key_given_twice_is_refused() -> None:
    """A second `limits:` (or any repeated key) would silently replace the first; it is
    refused, as in policies."""
    text = (
        "model: {endpoint: llm, name: m}\npolicy: p\nlimits: {max_steps: 5}\n"
        "limits: {max_steps: 500}\n"
    )
    with pytest.raises(DefinitionError, match="duplicate key 'limits'"):
        parse_definition(text)
    with pytest.raises(DefinitionError, match="duplicate key 'name'"):
        parse_definition("model: {endpoint: llm, name: m, name: n}\npolicy: p")


def test_definitions_and_policies_are_read_alike() -> None:
    """One way of reading what people write: the same words for the same mistakes."""
    with pytest.raises(DefinitionError) as definition:
        parse_definition("model: {endpoint: llm, name: m}\npolicy: p\nlimit: {}")
    with pytest.raises(PolicyError) as policy:
        parse_policy("name: p\nlimit: {}")
    [(field, said)] = definition.value.problems
    assert field == "limit" and said.startswith("unknown key; expected one of: model, policy")
    [(field, said)] = policy.value.problems
    assert field == "limit" and said.startswith("unknown key; expected one of: name, egress")
    with pytest.raises(DefinitionError) as definition:
        parse_definition("model: {endpoint: llm, name: m}\npolicy: p\nlimits: [1]")
    assert definition.value.problems == [("limits", "expected a mapping, got a list")]


def test_an_agent_never_carries_a_url_or_a_secret() -> None:
    """A builder's agent naming a URL or a secret directly is refused naming the field and
    saying what to do instead; it is never read as an endpoint."""
    text = (
        "model: {base_url: 'http://169.254.169.254/v1', api_key_secret: crm_token, "
        "endpoint: llm, name: m}\npolicy: p"
    )
    with pytest.raises(DefinitionError) as caught:
        parse_definition(text)
    fields = dict(caught.value.problems)
    assert set(fields) == {"model.base_url", "model.api_key_secret"}
    assert "aamp model-endpoint put NAME --base-url URL" in fields["model.base_url"]
    assert "aamp grant attach AGENT model-endpoint NAME" in fields["model.base_url"]
    assert "the model endpoint holds its API key secret" in fields["model.api_key_secret"]


def test_the_model_name_must_be_one_the_endpoint_serves() -> None:
    model = parse_definition("model: {endpoint: llm, name: m}\npolicy: p").model
    assert endpoint_problems(model, ()) == []  # no declared models: any name
    assert endpoint_problems(model, ("m", "n")) == []
    [(field, message)] = endpoint_problems(model, ("qwen", "llama"))
    assert field == "model.name" and "serves qwen, llama; not 'm'" in message
    [(field, message)] = endpoint_problems(model, None)
    assert field == "model.endpoint" and "no model endpoint named 'llm'" in message


def access(url: str) -> EndpointAccess:
    """The scripted model double as an endpoint (an IP literal: reached exactly)."""
    owner = "model endpoint test"
    return EndpointAccess(
        "test", url, CheckedTransport(owner, RegisteredUrl.parse(url), SystemResolver())
    )


def test_tool_arguments_are_checked_against_the_schema() -> None:
    tools = ToolSet.build(("shell", "files", "browser", "service:crm"), {"crm": "https://crm"})
    assert tools.check_call("shell", '{"command": "ls"}') == ({"command": "ls"}, None)
    for name, raw, words in [
        ("shell", '{"command": 1}', "is not of type"),
        ("shell", "{oops", "not valid JSON"),
        ("shell", "[1]", "must be a JSON object"),
        ("files", '{"action": "write", "path": "a"}', "content"),
        ("browser", '{"action": "open"}', "url"),
        ("service_crm", '{"method": "GET", "path": "no-slash"}', "path"),
        ("python", '{"code": "1"}', "there is no tool 'python'"),
    ]:
        args, problem = tools.check_call(name, raw)
        assert args is None and problem is not None and words in problem, (name, problem)


def test_knowledge_bases_are_tools_that_make_one_rag_tool() -> None:
    text = GOOD.replace('"service:crm"]', '"knowledge-base:handbook", "knowledge-base:faq"]')
    d = parse_definition(text)
    assert d.knowledge_bases == ("handbook", "faq") and d.services == ()
    with pytest.raises(DefinitionError, match="does not name a knowledge base"):
        parse_definition(GOOD.replace('"service:crm"', '"knowledge-base:Bad Name"'))
    tools = ToolSet.build(("files", "knowledge-base:handbook", "knowledge-base:faq"), {})
    assert sorted(t["function"]["name"] for t in tools.openai()) == ["files", "rag"]
    ok = '{"kb": "faq", "query": "opening hours", "k": 3}'
    assert tools.check_call("rag", ok) == ({"kb": "faq", "query": "opening hours", "k": 3}, None)
    for raw, words in [
        ('{"kb": "secret-kb", "query": "x"}', "is not one of"),
        ('{"kb": "faq", "query": ""}', "shorter than"),
        ('{"kb": "faq", "query": "x", "k": 500}', "maximum"),
    ]:
        args, problem = tools.check_call("rag", raw)
        assert args is None and problem is not None and words in problem, (raw, problem)
    assert "rag" not in {t["function"]["name"] for t in ToolSet.build(("files",), {}).openai()}


def test_truncation_keeps_head_and_tail_and_says_so() -> None:
    text = "A" * 5000 + "Z" * 5000
    cut = truncate(text, 1000)
    assert cut.startswith("A") and cut.endswith("Z")
    assert "9000 bytes truncated by aamp; 10000 bytes in all" in cut
    assert truncate("short", 1000) == "short"


async def test_the_model_client_retries_then_fails_clearly() -> None:
    turns = [{"status": 500}, {"status": 429}, {"content": "hello"}]
    with ScriptedModelServerForTests(turns) as server:
        client = ModelClient(ModelConfig("test", "m", retries=2), access(server.base_url))
        reply = await client.complete([{"role": "user", "content": "hi"}], [], None)
        await client.close()
    assert reply.content == "hello" and reply.attempts == 3 and reply.prompt_tokens > 0
    with ScriptedModelServerForTests([{"status": 503}] * 3) as server:
        client = ModelClient(ModelConfig("test", "m", retries=1), access(server.base_url))
        with pytest.raises(ModelError, match="failed 2 times; last: HTTP 503"):
            await client.complete([{"role": "user", "content": "hi"}], [], None)
        await client.close()
    with ScriptedModelServerForTests([{"status": 400}]) as server:
        client = ModelClient(ModelConfig("test", "m", retries=3), access(server.base_url))
        with pytest.raises(ModelError, match="refused the request: HTTP 400"):
            await client.complete([{"role": "user", "content": "hi"}], [], None)
        await client.close()
        assert len(server.requests) == 1  # a refusal is not retried


async def test_the_model_client_waits_what_retry_after_asks_within_a_bound() -> None:
    """A 429's `Retry-After` is waited for (the SDK's retry, not a fixed backoff); one of more
    than 60 s is not (a server cannot hold a run for an hour): the exponential backoff, at
    most 8 s, is used instead."""
    turns = [{"status": 429, "retry_after": "2"}, {"content": "after the wait"}]
    with ScriptedModelServerForTests(turns) as server:
        client = ModelClient(ModelConfig("test", "m", retries=1), access(server.base_url))
        reply = await client.complete([{"role": "user", "content": "hi"}], [], None)
        await client.close()
    assert reply.content == "after the wait" and reply.attempts == 2
    first, second = server.arrived
    assert second - first >= 2.0
    turns = [{"status": 503, "retry_after": "3600"}, {"content": "soon"}]
    with ScriptedModelServerForTests(turns) as server:
        client = ModelClient(ModelConfig("test", "m", retries=1), access(server.base_url))
        reply = await client.complete([{"role": "user", "content": "hi"}], [], None)
        await client.close()
    first, second = server.arrived
    assert reply.content == "soon" and second - first <= 8.5


async def test_a_connection_the_host_refuses_is_never_tried_again() -> None:
    """An endpoint whose name now resolves to the metadata address is refused once, with the
    reason, however many retries the agent allows: another try would resolve it again."""
    connects: list[AddressVerdict | None] = []

    async def on_connect(_: list[AddressVerdict], used: AddressVerdict | None) -> None:
        connects.append(used)

    url = RegisteredUrl.parse("http://imds.test:8080/v1")
    resolver = StaticResolver({"imds.test": ["169.254.169.254"]})
    transport = CheckedTransport("model endpoint imds", url, resolver, on_connect=on_connect)
    endpoint = EndpointAccess("imds", url.url, transport)
    client = ModelClient(ModelConfig("imds", "m", retries=3), endpoint)
    with pytest.raises(ModelError, match=r"the host refused to connect: .* metadata address"):
        await client.complete([{"role": "user", "content": "hi"}], [], None)
    await client.close()
    assert connects == [None]


async def test_an_unreachable_or_slow_endpoint_fails_with_the_reason() -> None:
    with ScriptedModelServerForTests([{"sleep": 3, "content": "late"}] * 2) as server:
        config = ModelConfig("test", "m", timeout_seconds=1, retries=1)
        client = ModelClient(config, access(server.base_url))
        with pytest.raises(ModelError, match="timed out"):
            await client.complete([{"role": "user", "content": "hi"}], [], None)
        await client.close()
    with ScriptedModelServerForTests([]) as server:
        url = server.base_url
    client = ModelClient(ModelConfig("test", "m", retries=0), access(url))
    with pytest.raises(ModelError, match="could not connect"):
        await client.complete([{"role": "user", "content": "hi"}], [], None)
    await client.close()
