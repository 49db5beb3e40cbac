"""Routes for agents (as grant targets), their grants, and the resources granted to them."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from aamp.agents.definition import DefinitionError, definition_from_dict, endpoint_problems
from aamp.agents.registry import AgentInfo
from aamp.agents.versions import AgentVersions
from aamp.api.body import Body
from aamp.api.context import ControlPlane
from aamp.api.errors import ApiError
from aamp.api.guard import (
    actor_of,
    check,
    cp_of,
    guarded_router,
    json_body,
    record_change,
    record_refusal,
    rule,
)
from aamp.catalog import KnowledgeBases
from aamp.errors import InvalidInput, NotFound, found
from aamp.identity.directory import GrantInfo
from aamp.identity.model import Actor, Resource

AgentId = Annotated[str, Path(min_length=1, max_length=32)]
LevelName = Literal["view", "run", "edit"]
KindName = Literal["policy", "service", "image", "model-endpoint", "knowledge-base"]
VERSION_PATTERN = r"^(draft|latest|[0-9]{1,9})$"
_UNREAD = object()


class AgentIn(Body):
    name: Annotated[str, Field(min_length=1, max_length=64)]


class VersionOut(BaseModel):
    agent_id: str
    version: int
    status: Literal["draft", "published"]
    definition: dict[str, object]
    created_at: str
    created_by: str
    updated_at: str
    published_at: str | None
    published_by: str | None


class GrantIn(Body):
    user: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    role: Literal["admin", "builder", "operator"] | None = None
    level: LevelName


class AgentResourceIn(Body):
    kind: KindName
    name: Annotated[str, Field(min_length=1, max_length=64)]


class AgentResourceOut(BaseModel):
    agent_id: str
    kind: str
    name: str
    created_at: str
    created_by: str


async def _agent(request: Request, _: ControlPlane, __: Actor) -> Resource:
    agent_id = str(request.path_params.get("agent_id", ""))
    return Resource("agent", agent_id, agent=agent_id)


async def _read_agent(request: Request, cp: ControlPlane, __: Actor) -> Resource:
    """`_agent`, and the agent itself for the route on `request.state.agent` (None if there
    is none): read by the guard with a bearer token (`rule(..., reads_agent=True)`), else
    here."""
    agent_id = str(request.path_params.get("agent_id", ""))
    row = getattr(request.state, "agent_row", _UNREAD)
    if row is _UNREAD:
        request.state.agent = await cp.store.run(cp.agents.find, agent_id)
    else:
        request.state.agent = None if row is None else AgentInfo(*row)
    return Resource("agent", agent_id, agent=agent_id)


async def _version(request: Request, cp: ControlPlane, __: Actor) -> Resource:
    """The agent, and the version asked for if it is not a published one."""
    agent_id = str(request.path_params.get("agent_id", ""))
    which = str(request.path_params.get("version", ""))
    unpublished: str | None = None
    if which == "draft":
        unpublished = which
    elif re.fullmatch(VERSION_PATTERN, which) and which != "latest":
        found = await cp.store.run(AgentVersions(cp.store).find, agent_id, int(which))
        unpublished = None if found is not None and found.status == "published" else which
    return Resource("agent", agent_id, agent=agent_id, unpublished=unpublished)


async def _grant_subject(request: Request, _: ControlPlane, __: Actor) -> Resource:
    agent_id = str(request.path_params.get("agent_id", ""))
    body = await json_body(request)
    user, role = body.get("user"), body.get("role")
    return Resource(
        "agent",
        agent_id,
        agent=agent_id,
        subject_user=user if isinstance(user, str) else None,
        subject_role=role if isinstance(role, str) else None,
    )


def router() -> APIRouter:
    r = guarded_router(prefix="/v1", tags=["agents"])

    @r.get("/agents", response_model=list[AgentInfo])
    @rule("agent.list")
    async def list_agents(request: Request) -> list[dict[str, object]]:
        """The agents you can view (all of them for an admin)."""
        cp = cp_of(request)
        agents = await cp.store.run(cp.agents.list)
        return [
            a.to_dict()
            for a in agents
            if await check(request, "agent.view", Resource("agent", a.id, agent=a.id))
        ]

    @r.post("/agents", status_code=201, response_model=AgentInfo)
    @rule("agent.create")
    async def create_agent(body: AgentIn, request: Request) -> dict[str, object]:
        """Create an agent; its creator owns it (which counts as `edit` on it)."""
        cp, actor = cp_of(request), actor_of(request)
        agent = await cp.store.run(lambda: cp.agents.create(body.name, owner=actor.username or ""))
        await record_change(request, "agent.created", f"agent:{agent.id}", {"name": agent.name})
        return agent.to_dict()

    @r.get("/agents/{agent_id}", response_model=AgentInfo)
    @rule("agent.view", _read_agent, reads_agent=True)
    async def get_agent(agent_id: AgentId, request: Request) -> dict[str, object]:
        agent: AgentInfo | None = request.state.agent  # read before the decision (_read_agent)
        return found(agent, f"no agent {agent_id!r}").to_dict()

    @r.delete("/agents/{agent_id}", status_code=204)
    @rule("agent.delete", _agent)
    async def delete_agent(agent_id: AgentId, request: Request) -> None:
        cp = cp_of(request)
        await cp.store.run(cp.agents.delete, agent_id)
        await record_change(request, "agent.deleted", f"agent:{agent_id}", {})

    @r.get("/agents/{agent_id}/grants", response_model=list[GrantInfo])
    @rule("grant.list", _agent)
    async def list_grants(agent_id: AgentId, request: Request) -> list[dict[str, object]]:
        cp = cp_of(request)
        await cp.store.run(cp.agents.get, agent_id)
        return [g.to_dict() for g in await cp.store.run(cp.directory.list_grants, agent_id)]

    @r.post("/agents/{agent_id}/grants", status_code=201, response_model=GrantInfo)
    @rule("grant.create", _grant_subject)
    async def create_grant(agent_id: AgentId, body: GrantIn, request: Request) -> dict[str, object]:
        """Give a user or a whole role `view`, `run` or `edit` on the agent (never yourself)."""
        cp, by = cp_of(request), actor_of(request).audit_name
        user, role = body.user, body.role
        if (user is None) == (role is None):
            raise InvalidInput("a grant names exactly one of user or role")
        if user is not None:
            grant = await cp.store.run(
                lambda: cp.directory.grant_user(agent_id, user, level=body.level, by=by)
            )
        else:
            grant = await cp.store.run(
                lambda: cp.directory.grant_role(agent_id, role, level=body.level, by=by)
            )
        await record_change(request, "grant.created", f"agent:{agent_id}", grant.to_dict())
        return grant.to_dict()

    @r.delete("/agents/{agent_id}/grants/{grant_id}", status_code=204)
    @rule("grant.delete", _agent)
    async def delete_grant(
        agent_id: AgentId, grant_id: Annotated[int, Path(ge=1, le=2**62)], request: Request
    ) -> None:
        cp = cp_of(request)
        await cp.store.run(cp.directory.revoke_grant, agent_id, grant_id)
        await record_change(request, "grant.deleted", f"agent:{agent_id}", {"grant_id": grant_id})

    @r.get("/agents/{agent_id}/resources", response_model=list[AgentResourceOut])
    @rule("agent_resource.list", _agent)
    async def list_resources(agent_id: AgentId, request: Request) -> list[dict[str, object]]:
        """The policies, services, images and model endpoints this agent is granted."""
        cp = cp_of(request)
        await cp.store.run(cp.agents.get, agent_id)
        return await cp.store.run(cp.catalog.list_resources, agent_id)

    @r.post("/agents/{agent_id}/resources", status_code=201, response_model=AgentResourceOut)
    @rule("agent_resource.grant", _agent)
    async def grant_resource(
        agent_id: AgentId, body: AgentResourceIn, request: Request
    ) -> dict[str, object]:
        """Grant a policy, service, image, model endpoint or knowledge base that exists (a
        404 naming the one that does not, on record as a refusal)."""
        cp, actor = cp_of(request), actor_of(request)
        kbs = KnowledgeBases(cp.settings, cp.manager)
        try:
            granted = await cp.store.run(
                lambda: cp.catalog.grant_resource(
                    agent_id, body.kind, body.name, by=actor.audit_name, kept_outside=kbs.summary
                )
            )
        except NotFound as missing:
            await record_refusal(request, "agent_resource.grant", f"agent:{agent_id}", str(missing))
            raise
        await record_change(request, "agent_resource.granted", f"agent:{agent_id}", granted)
        return granted

    @r.delete("/agents/{agent_id}/resources/{kind}/{name}", status_code=204)
    @rule("agent_resource.revoke", _agent)
    async def revoke_resource(
        agent_id: AgentId,
        kind: KindName,
        name: Annotated[str, Path(min_length=1, max_length=64)],
        request: Request,
    ) -> None:
        cp = cp_of(request)
        await cp.store.run(cp.catalog.revoke_resource, agent_id, kind, name)
        await record_change(
            request, "agent_resource.revoked", f"agent:{agent_id}", {"kind": kind, "name": name}
        )

    @r.get("/agents/{agent_id}/versions", response_model=list[VersionOut])
    @rule("agent_version.list", _agent)
    async def list_versions(agent_id: AgentId, request: Request) -> list[dict[str, object]]:
        """Published versions; the draft too for users with `edit` on the agent."""
        cp = cp_of(request)
        await cp.store.run(cp.agents.get, agent_id)
        drafts = await check(
            request, "agent_version.edit", Resource("agent", agent_id, agent=agent_id)
        )
        versions = await cp.store.run(lambda: AgentVersions(cp.store).list(agent_id, drafts=drafts))
        return [v.to_dict() for v in versions]

    @r.get("/agents/{agent_id}/versions/{version}", response_model=VersionOut)
    @rule("agent_version.read", _version)
    async def get_version(
        agent_id: AgentId,
        version: Annotated[str, Path(pattern=VERSION_PATTERN)],
        request: Request,
    ) -> dict[str, object]:
        """One version by number, `latest` (published) or `draft`; the draft and unpublished
        numbers only with `edit`."""
        cp = cp_of(request)
        return (await cp.store.run(AgentVersions(cp.store).get, agent_id, version)).to_dict()

    @r.put("/agents/{agent_id}/draft", response_model=VersionOut)
    @rule("agent_version.edit", _agent)
    async def save_draft(
        agent_id: AgentId, body: dict[str, object], request: Request
    ) -> dict[str, object]:
        """Create or replace the draft from a definition (model, system_prompt, tools, policy,
        limits); errors name the field. The model names a model endpoint and, once it is
        registered, one of the models it serves; running it needs the endpoint granted.
        Published versions never change."""
        cp, actor = cp_of(request), actor_of(request)
        try:
            definition = definition_from_dict(body)
            # Like the policy, the endpoint may be registered (and granted) later; once it
            # exists, the model must be one it serves.
            endpoint = await cp.store.run(cp.catalog.find_model_endpoint, definition.model.endpoint)
            if endpoint is not None and (
                problems := endpoint_problems(definition.model, endpoint.models)
            ):
                raise DefinitionError(problems)
        except DefinitionError as exc:
            raise ApiError(400, "invalid_definition", str(exc)) from None
        saved = await cp.store.run(
            lambda: AgentVersions(cp.store).save_draft(agent_id, definition, by=actor.audit_name)
        )
        await record_change(
            request, "agent.draft_saved", f"agent:{agent_id}", {"version": saved.version}
        )
        return saved.to_dict()

    @r.post("/agents/{agent_id}/publish", response_model=VersionOut)
    @rule("agent_version.publish", _agent)
    async def publish(agent_id: AgentId, request: Request) -> dict[str, object]:
        """Freeze the draft as the next published version; operators run published ones."""
        cp, actor = cp_of(request), actor_of(request)
        published = await cp.store.run(
            lambda: AgentVersions(cp.store).publish(agent_id, by=actor.audit_name)
        )
        await record_change(
            request, "agent.published", f"agent:{agent_id}", {"version": published.version}
        )
        return published.to_dict()

    return r
