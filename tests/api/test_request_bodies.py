"""Every request body the API reads refuses a field it does not know, at every depth: a
misspelt `memory` for `memory_bytes`, or a `ttl` for `ttl_seconds`, is a 422 naming it, never a
default applied in silence."""

from __future__ import annotations

import typing

from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import BaseModel


def _models_in(annotation: object) -> typing.Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        for field in annotation.model_fields.values():
            yield from _models_in(field.annotation)
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def test_every_request_body_forbids_unknown_fields(plane) -> None:
    bodies = {
        model
        for route in (context.original_route for context in iter_route_contexts(plane.app.routes))
        if isinstance(route, APIRoute) and route.body_field is not None
        for model in _models_in(route.body_field.field_info.annotation)
    }
    assert len(bodies) >= 20, bodies  # every JSON body of the API, with the nested ones
    lax = sorted(m.__name__ for m in bodies if m.model_config.get("extra") != "forbid")
    assert not lax, f"request bodies that ignore unknown fields: {lax}"


async def test_an_unknown_field_is_refused_naming_it(plane) -> None:
    body = {"image": "base", "resources": {"memory": "256MiB"}}
    async with plane.client(plane.admin_token) as c:
        refused = await c.post("/v1/sandboxes", json=body)
        assert refused.status_code == 422 and refused.json()["code"] == "invalid_request"
        assert "resources.memory" in refused.json()["message"]
        assert (await c.get("/v1/sandboxes")).json() == []


async def test_a_policy_and_the_fields_it_sets_are_not_both_accepted(plane) -> None:
    """A request naming a policy that also gives an image, lifetime or resources was created
    from the policy with those fields dropped in silence; now it is refused naming them."""
    inline = "name: inline\nimage: base\n"
    policy = {"name": "small", "image": "base", "lifetime": {"ttl": "5m", "idle": "2m"}}
    agent = await plane.runnable_agent("fin", policy)
    async with plane.client(plane.admin_token) as c:
        for body, named in (
            ({"policy_document": inline, "image": "browser"}, "image"),
            ({"policy_document": inline, "ttl_seconds": 60, "idle_seconds": 30}, "ttl_seconds"),
            ({"agent": agent, "policy": "small", "resources": {"cpus": 2}}, "resources"),
            ({"agent": agent, "policy": "small", "idle_seconds": 10}, "idle_seconds"),
        ):
            refused = await c.post("/v1/sandboxes", json=body)
            assert refused.status_code == 400, (body, refused.text)
            assert refused.json()["message"].startswith(f"{named}: the policy sets"), refused.text
        assert (await c.get("/v1/sandboxes")).json() == []
