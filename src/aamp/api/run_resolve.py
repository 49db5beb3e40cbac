"""What a run of an agent's definition uses, resolved from its agent's grants: the policy, the
sandbox it makes, each service tool's upstream and each knowledge base's index, or the API
error that says what is missing. One rule for a new run (`runs.py`) and for one another
replica drove that this one takes over (`rebuilt_request`, which `aamp.server` gives the run
service).
"""

from __future__ import annotations

import asyncio
from pathlib import Path as FilePath

from aamp.agents.definition import AgentDefinition, DefinitionError, endpoint_problems
from aamp.agents.versions import AgentVersion, AgentVersions
from aamp.api.context import ControlPlane
from aamp.api.errors import ApiError
from aamp.api.sandbox_create import sandbox_from
from aamp.catalog import KnowledgeBases
from aamp.catalog.catalog import AgentNeeds
from aamp.errors import NotFound
from aamp.policy import Policy
from aamp.runs.service import RunRequest
from aamp.runs.store import RunInfo, RunStore
from aamp.sandbox.manager import CreateRequest


async def _indexes(
    cp: ControlPlane, names: tuple[str, ...], image: str
) -> dict[str, tuple[int, FilePath]]:
    """The index (version, file) of each knowledge base the agent searches — granted, which
    `allowed` decided — or the reason the run cannot use it."""
    if names and image != "rag":
        raise ApiError(
            400,
            "invalid_request",
            f"tools: knowledge-base:{names[0]} needs a policy with image: rag, not {image!r}",
        )
    kbs = KnowledgeBases(cp.settings, cp.manager)
    found = {}
    for name in names:
        current = await asyncio.to_thread(kbs.current_index, name)
        if current is None:
            raise ApiError(
                400, "invalid_request", f"knowledge base {name!r} has no document indexed yet"
            )
        found[name] = current
    return found


async def resolve_definition(
    cp: ControlPlane, d: AgentDefinition, needs: AgentNeeds
) -> tuple[Policy, CreateRequest, dict[str, str], dict[str, tuple[int, FilePath]]]:
    """What a run of definition `d` uses, as its agent's grants (`needs`) give it: the policy,
    the sandbox it makes, each service tool's upstream, each knowledge base's index; or the
    error saying what is missing. One rule for a new run and for one taken over."""
    if needs.policy is None:
        raise ApiError(400, "invalid_request", f"policy: no policy named {d.policy!r}")
    problems = endpoint_problems(
        d.model, needs.endpoint.models if needs.endpoint is not None else None
    )
    if problems or needs.endpoint is None:
        raise ApiError(400, "invalid_definition", str(DefinitionError(problems)))
    policy = needs.policy.policy
    create = sandbox_from(needs)  # every service of the policy exists
    upstreams = {s.name: s.upstream for s in needs.services}
    services: dict[str, str] = {}
    for name in d.services:
        if name not in policy.services:
            raise ApiError(
                400,
                "invalid_request",
                f"tools: service:{name} is not among the services of policy {d.policy!r}",
            )
        services[name] = upstreams[name]
    indexes = await _indexes(cp, d.knowledge_bases, policy.image)
    return policy, create, services, indexes


async def rebuilt_request(cp: ControlPlane, run: RunInfo) -> RunRequest:
    """A run another replica drove, resolved again for this one to go on with (its version,
    its inputs, what its agent is granted now): refused, naming what, when the agent no
    longer has a grant it needs or its model endpoint is no longer confirmed."""

    def plan() -> tuple[AgentVersion | None, AgentNeeds | None, tuple[tuple[str, bytes], ...]]:
        version = AgentVersions(cp.store).find(run.agent_id, run.version)
        if version is None:
            return None, None, ()
        d = version.definition
        needs = cp.catalog.agent_needs(
            run.agent_id, d.policy, endpoint=d.model.endpoint, knowledge_bases=d.knowledge_bases
        )
        return version, needs, RunStore(cp.store).inputs(run.id)

    version, needs, inputs = await cp.store.run(plan)
    if version is None or needs is None:
        raise NotFound(f"agent {run.agent_id} has no version {run.version} any more")
    if needs.ungranted:
        raise ApiError(
            403, "forbidden", f"the agent is no longer granted {', '.join(needs.ungranted)}"
        )
    if needs.endpoint is not None and not needs.endpoint.confirmed:
        raise ApiError(
            403, "forbidden", f"model endpoint {needs.endpoint.name} is no longer confirmed"
        )
    d = version.definition
    policy, create, services, indexes = await resolve_definition(cp, d, needs)
    return RunRequest(
        run, d, policy, create, inputs, services, f"user:{run.owner}", needs.endpoint, indexes
    )
