"""The one rule for what names an agent (`aamp.cli.refs.agent_id`), against a real HTTP server
that lists two agents, one of them named like the other's id."""

from __future__ import annotations

import pytest
from scripted_http import ScriptedHttpServerForTests, json_answer

from aamp.cli.refs import agent_id
from aamp.client import Client

# Listed first (the API lists by name): an agent a builder named after another agent's id.
AGENTS = [
    {"id": "ag-aaaaaaaaaaaa", "name": "ag-bbbbbbbbbbbb", "owner": "mallory"},
    {"id": "ag-bbbbbbbbbbbb", "name": "reports", "owner": "alice"},
]


@pytest.fixture
def client():
    server = ScriptedHttpServerForTests(lambda conn, head: conn.sendall(json_answer(AGENTS)))
    with Client(server.url, "t") as c:
        yield c
    server.close()


def test_an_id_is_only_ever_an_id(client) -> None:
    assert agent_id(client, "ag-bbbbbbbbbbbb") == "ag-bbbbbbbbbbbb"  # not mallory's agent


def test_a_name_is_matched_exactly(client) -> None:
    assert agent_id(client, "reports") == "ag-bbbbbbbbbbbb"
    with pytest.raises(ValueError, match="no agent named 'report' that you can see"):
        agent_id(client, "report")


def test_an_id_nobody_lets_you_see_is_refused_as_an_id(client) -> None:
    with pytest.raises(ValueError, match="no agent with id 'ag-cccccccccccc' that you can see"):
        agent_id(client, "ag-cccccccccccc")
