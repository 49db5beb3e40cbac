"""The API answers with the values the parts themselves return, not copies of them: a run is
`RunInfo`, an agent `AgentInfo`, a model endpoint `ModelEndpoint`, ... so a field added to one
is in the answer and its schema, and the two cannot drift apart."""

from __future__ import annotations

import dataclasses

from fastapi.routing import APIRoute, iter_route_contexts

from aamp.agents import AgentInfo
from aamp.api.catalog import ModelEndpointRegistered
from aamp.api.secrets import SecretOut
from aamp.api.users import NewTokenOut
from aamp.catalog import ModelEndpoint, Service
from aamp.identity import GrantInfo, TokenInfo
from aamp.runs import RunInfo
from aamp.vault import SecretMetadata

ANSWERS = {
    ("GET", "/v1/runs/{run_id}"): RunInfo,
    ("POST", "/v1/agents/{agent_id}/runs"): RunInfo,
    ("POST", "/v1/runs/{run_id}/cancel"): RunInfo,
    ("GET", "/v1/agents/{agent_id}"): AgentInfo,
    ("POST", "/v1/agents/{agent_id}/grants"): GrantInfo,
    ("GET", "/v1/services/{name}"): Service,
    ("GET", "/v1/model-endpoints/{name}"): ModelEndpoint,
    ("PUT", "/v1/model-endpoints/{name}"): ModelEndpointRegistered,
    ("DELETE", "/v1/tokens/{token_id}"): TokenInfo,
    ("POST", "/v1/tokens"): NewTokenOut,
    ("GET", "/v1/secrets/{name}"): SecretOut,
}
# What an answer adds to the value it is built on.
EXTENDS = {
    ModelEndpointRegistered: ModelEndpoint,
    NewTokenOut: TokenInfo,
    SecretOut: SecretMetadata,
}


def test_routes_answer_with_the_values_themselves(plane) -> None:
    models = {
        (method, context.path): context.original_route.response_model
        for context in iter_route_contexts(plane.app.routes)
        if isinstance(context.original_route, APIRoute)
        for method in context.original_route.methods
    }
    assert {key: models.get(key) for key in ANSWERS} == ANSWERS
    for answer, value in EXTENDS.items():
        assert issubclass(answer, value)
        added = {f.name for f in dataclasses.fields(answer)} - {
            f.name for f in dataclasses.fields(value)
        }
        assert added and len(added) <= 2, (answer, added)
