"""What a sandbox create asks for (`SandboxIn`) and the `CreateRequest` it makes: from an
inline policy, a named one granted to the agent (`sandbox_from`, which a run's sandbox uses
too), or, for admins, neither; a request naming a policy and also setting what the policy
sets is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, ValidationError

from aamp.api.body import Body
from aamp.api.context import ControlPlane
from aamp.api.errors import ApiError
from aamp.catalog.catalog import AgentNeeds, Service, parse_policy_document
from aamp.egress.rules import EgressRules
from aamp.egress.services import ServiceSet
from aamp.errors import NotFound
from aamp.policy import DataPolicy, Policy, PolicyError, Resources, problems
from aamp.sandbox.requests import (
    DEFAULT_IDLE_SECONDS,
    DEFAULT_TTL_SECONDS,
    CreateRequest,
)


class ResourcesIn(Body):
    cpus: float = 1.0
    memory_bytes: int = Resources().memory_bytes
    pids: int = Resources().pids
    disk_bytes: int = Resources().disk_bytes


class SandboxIn(Body):
    """Admins may give image, lifetime and resources directly, or a whole policy document
    (`policy_document`, YAML as in PRODUCT.md; `aamp sandbox create --policy FILE`). Everyone
    else names an agent they can run and a policy granted to it; the policy then sets image,
    lifetime, resources, egress and services, so naming a policy and also giving `image`,
    `ttl_seconds`, `idle_seconds` or `resources` is refused rather than half-honoured."""

    agent: str | None = Field(None, min_length=1, max_length=32)
    policy: str | None = Field(None, min_length=1, max_length=64)
    policy_document: str | None = Field(None, min_length=1, max_length=64 * 1024)
    image: str = Field("base", min_length=1, max_length=64)
    driver: str | None = Field(None, max_length=32)
    ttl_seconds: float = DEFAULT_TTL_SECONDS
    idle_seconds: float = DEFAULT_IDLE_SECONDS
    resources: ResourcesIn | None = None


# What a policy decides, so a request naming one may not also give them.
POLICY_SETS = ("image", "ttl_seconds", "idle_seconds", "resources")


def _policy_conflict(body: SandboxIn) -> ApiError | None:
    if body.policy is None and body.policy_document is None:
        return None
    given = [name for name in POLICY_SETS if name in body.model_fields_set]
    if not given:
        return None
    message = (
        f"{given[0]}: the policy sets the sandbox's image, lifetime and resources; leave "
        f"{'these' if len(given) > 1 else 'it'} out ({', '.join(given)})"
    )
    return ApiError(400, "invalid_request", message)


@dataclass(frozen=True)
class SandboxPlan:
    """What the resolver found for a new sandbox: `allowed` decides on it, and the route then
    builds exactly that (never a second, possibly different, lookup). `named` is the named
    policy as the agent would use it; None when the policy is inline or not given."""

    named: AgentNeeds | None


def _from_policy(
    policy: Policy, driver: str | None, services: tuple[Service, ...]
) -> CreateRequest:
    return CreateRequest(
        image=policy.image,
        driver=driver,
        ttl=float(policy.lifetime.ttl_seconds),
        idle=float(policy.lifetime.idle_seconds),
        resources=policy.resources,
        egress=EgressRules.from_policy(policy.egress),
        services=ServiceSet([s.for_egress() for s in services]),
        packages=policy.packages,
    )


def sandbox_from(needs: AgentNeeds, driver: str | None = None) -> CreateRequest:
    """The sandbox a named policy makes (its grants were decided by `allowed`); a policy or
    service that does not exist is a 404/400 naming it."""
    if needs.policy is None:
        raise NotFound(f"no policy named {needs.policy_name!r}")
    if needs.unknown_services:
        raise ApiError(
            400, "invalid_request", f"services: no service named {needs.unknown_services[0]!r}"
        )
    return _from_policy(needs.policy.policy, driver, needs.services)


async def create_request(
    cp: ControlPlane, body: SandboxIn, plan: SandboxPlan
) -> tuple[CreateRequest, DataPolicy | None]:
    """Build what the guard allowed: an inline policy, a named one, or (admins) neither; with
    the policy's data rules, which the sandbox's files in and out are checked against."""
    if (conflict := _policy_conflict(body)) is not None:
        raise conflict
    if body.policy_document is not None:
        try:
            policy = parse_policy_document(body.policy_document, "yaml")
        except PolicyError as exc:
            raise ApiError(422, "invalid_policy", str(exc)) from None
        if policy.warm:
            message = "warm: only a stored policy keeps sandboxes warm (PUT /v1/policies/NAME)"
            raise ApiError(422, "invalid_policy", message)
        services = []
        for name in policy.services:
            try:
                services.append(await cp.store.run(cp.catalog.get_service, name))
            except NotFound:
                message = f"services: no service named {name!r}"
                raise ApiError(400, "invalid_request", message) from None
        return _from_policy(policy, body.driver, tuple(services)), policy.data
    if plan.named is not None:
        create = sandbox_from(plan.named, body.driver)
        assert plan.named.policy is not None  # else sandbox_from raised
        return create, plan.named.policy.policy.data
    try:
        resources = Resources(**body.resources.model_dump()) if body.resources else Resources()
    except ValidationError as exc:
        found = "; ".join(f"resources.{where}: {why}" for where, why in problems(exc, Resources))
        raise ApiError(400, "invalid_request", found) from None
    made = CreateRequest(
        image=body.image,
        driver=body.driver,
        ttl=body.ttl_seconds,
        idle=body.idle_seconds,
        resources=resources,
    )
    return made, None
