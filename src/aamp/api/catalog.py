"""Routes for policies (YAML or JSON, validated by `aamp.policy`), services and model endpoints.

Registering (or confirming) a model endpoint resolves its host once with the installation's
resolver and judges every address as the run's connections will (`aamp.egress.registered`):
a name resolving to a link-local, metadata, multicast, unspecified, broadcast or reserved
address is refused, naming the address and its class; the audit record of the registration
states the addresses and classes it resolved to (or that it did not resolve yet).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from aamp.api.body import Body
from aamp.api.context import ControlPlane
from aamp.api.errors import ApiError
from aamp.api.guard import cp_of, guarded_router, record_change, record_refusal, rule
from aamp.catalog.catalog import (
    MAX_POLICY_BYTES,
    Catalog,
    Service,
    StoredPolicy,
    parse_policy_document,
)
from aamp.catalog.model_endpoints import MAX_MODELS, ModelEndpoint, check_base_url
from aamp.egress.registered import ConnectionRefused, resolve_and_check
from aamp.errors import Conflict
from aamp.policy import PolicyError
from aamp.sandbox.wheelhouse import WheelhouseError

Name = Annotated[str, Path(min_length=1, max_length=64)]

POLICY_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}


class PolicyOut(BaseModel):
    name: str
    format: str
    source: str
    image: str
    services: list[str]
    packages: list[str]
    warm: int
    created_at: str
    created_by: str
    updated_at: str
    updated_by: str


class ServiceIn(Body):
    upstream: Annotated[str, Field(min_length=1, max_length=512)]
    auth: Literal["bearer", "basic", "header"]
    secrets: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=2)]
    header_name: Annotated[str, Field(max_length=128)] | None = None


class ModelEndpointIn(Body):
    base_url: Annotated[str, Field(min_length=1, max_length=512)]
    api_key_secret: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    models: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=200)]], Field(max_length=MAX_MODELS)
    ] = Field(default_factory=list)


class ResolvedAddress(BaseModel):
    address: str
    address_class: str


@dataclass(frozen=True, kw_only=True)
class ModelEndpointRegistered(ModelEndpoint):
    """As registered, with what its host resolved to just now (`resolved`: None when it did
    not resolve; the reason is in `unresolved`)."""

    resolved: list[ResolvedAddress] | None
    unresolved: str | None


async def _addresses(cp: ControlPlane, name: str, base_url: str) -> dict[str, object]:
    """Resolve the endpoint's host once and judge every address; 400 naming the first one a
    name may not reach. Returns what was found, for the audit record and the answer."""
    url = check_base_url(base_url)
    owner = f"model endpoint {name}"
    try:
        verdicts = await resolve_and_check(owner, url, cp.manager.resolver)
    except ConnectionRefused as exc:
        return {"resolved": None, "unresolved": str(exc)}
    for verdict in verdicts:
        if not verdict.allowed:
            raise ApiError(400, "address_refused", f"base_url: {verdict.reason}")
    found = [{"address": str(v.address), "address_class": v.kind.value} for v in verdicts]
    return {"resolved": found, "unresolved": None}


async def _registered(
    request: Request, action: str, endpoint: ModelEndpoint, found: dict[str, object]
) -> dict[str, object]:
    await record_change(
        request, action, f"model-endpoint:{endpoint.name}", {**endpoint.to_dict(), **found}
    )
    return {**endpoint.to_dict(), **found}


def _format(request: Request) -> str:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in ("application/json", ""):
        return "json"
    if ctype in ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"):
        return "yaml"
    raise ApiError(415, "unsupported_media_type", "send the policy as application/json or YAML")


async def delete_unless_in_use(
    request: Request,
    kind: str,
    name: str,
    remove: Callable[[], None],
    details: dict[str, Any] | None = None,
) -> None:
    """Delete a catalog entry, or record why not (it is in use) and answer 409."""
    action, resource = f"{kind.replace('-', '_')}.deleted", f"{kind}:{name}"
    try:
        await cp_of(request).store.run(remove)
    except Conflict as refused:
        await record_refusal(request, f"{kind.replace('-', '_')}.delete", resource, str(refused))
        raise
    await record_change(request, action, resource, details or {})


async def keep_policies_warm(cp: ControlPlane) -> None:
    """At start, every stored policy's `warm` sandboxes are kept ready; policies asking for
    more than the installation keeps (AAMP_WARM_POOL_MAX lowered since) refuse the start,
    named, rather than some of them being ignored."""
    stored = await cp.store.run(cp.catalog.list_policies)
    cp.manager.pool_targets.check({p.name: p.policy.warm for p in stored})
    for p in stored:
        if p.policy.warm:
            await cp.manager.keep_warm(p.name, p.policy)


def _readable(
    r: APIRouter,
    kind: str,
    plural: str,
    shown: Any,
    list_all: Callable[[Catalog], Callable[[], list[Any]]],
    get_one: Callable[[Catalog], Callable[[str], Any]],
) -> None:
    """The two routes that read a kind of catalog entry (`kind` as the actions say it, e.g.
    `model_endpoint`; `plural` as the routes' names do): `GET /v1/{plural}` lists every entry
    (`{kind}.list`) with the catalog's `list_all(catalog)`, `GET /v1/{plural}/{name}` answers
    one (`{kind}.read`) with its `get_one(catalog)`."""
    path, tags = f"/{plural.replace('_', '-')}", [plural.replace("_", " ")]

    @r.get(path, response_model=list[shown], tags=tags, name=f"list_{plural}")
    @rule(f"{kind}.list")
    async def list_entries(request: Request) -> list[dict[str, object]]:
        cp = cp_of(request)
        return [entry.to_dict() for entry in await cp.store.run(list_all(cp.catalog))]

    @r.get(f"{path}/{{name}}", response_model=shown, tags=tags, name=f"get_{kind}")
    @rule(f"{kind}.read")
    async def get_entry(name: Name, request: Request) -> dict[str, object]:
        cp = cp_of(request)
        return (await cp.store.run(get_one(cp.catalog), name)).to_dict()


def router() -> APIRouter:
    r = guarded_router(prefix="/v1")

    _readable(r, "policy", "policies", PolicyOut, lambda c: c.list_policies, lambda c: c.get_policy)

    @r.put(
        "/policies/{name}", response_model=PolicyOut, tags=["policies"], openapi_extra=POLICY_BODY
    )
    @rule("policy.write")
    async def put_policy(name: Name, request: Request) -> dict[str, object]:
        """Create or replace a policy; every invalid field is named in the error."""
        cp = cp_of(request)
        fmt = _format(request)
        raw = await request.body()
        if len(raw) > MAX_POLICY_BYTES:
            raise ApiError(413, "too_large", f"a policy is at most {MAX_POLICY_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "invalid_policy", "the policy is not UTF-8 text") from None
        by = request.state.actor.audit_name

        def write() -> StoredPolicy:
            policy = parse_policy_document(text, fmt)
            try:  # a `packages:` entry the wheelhouse cannot provide is a bad policy
                cp.images.check_packages(policy.image, policy.packages)
            except WheelhouseError as exc:
                raise PolicyError([("", str(exc))]) from None
            check_warm = cp.manager.pool_targets.check
            return cp.catalog.put_policy(name, text, fmt, by=by, check_warm=check_warm)

        stored = await cp.store.run(write)
        await record_change(request, "policy.written", f"policy:{name}", {"format": fmt})
        await cp.manager.keep_warm(name, stored.policy)
        return stored.to_dict()

    @r.delete("/policies/{name}", status_code=204, tags=["policies"])
    @rule("policy.delete")
    async def delete_policy(name: Name, request: Request) -> None:
        """Delete a policy; refused (409, on record) while an agent is granted it."""
        cp = cp_of(request)
        await delete_unless_in_use(request, "policy", name, lambda: cp.catalog.delete_policy(name))
        await cp.manager.keep_warm(name, None)

    _readable(r, "service", "services", Service, lambda c: c.list_services, lambda c: c.get_service)

    @r.put("/services/{name}", response_model=Service, tags=["services"])
    @rule("service.write")
    async def put_service(name: Name, body: ServiceIn, request: Request) -> dict[str, object]:
        """Define a service: upstream origin, auth kind and the secret names it injects."""
        cp = cp_of(request)
        by = request.state.actor.audit_name
        service = await cp.store.run(
            lambda: cp.catalog.put_service(
                name,
                upstream=body.upstream,
                auth=body.auth,
                secrets=list(body.secrets),
                header_name=body.header_name,
                by=by,
            )
        )
        await record_change(request, "service.written", f"service:{name}", service.to_dict())
        return service.to_dict()

    @r.delete("/services/{name}", status_code=204, tags=["services"])
    @rule("service.delete")
    async def delete_service(name: Name, request: Request) -> None:
        """Delete a service; refused (409, on record) while a policy names it or an agent is
        granted it."""
        cp = cp_of(request)
        await delete_unless_in_use(
            request, "service", name, lambda: cp.catalog.delete_service(name)
        )

    _readable(
        r,
        "model_endpoint",
        "model_endpoints",
        ModelEndpoint,
        lambda c: c.list_model_endpoints,
        lambda c: c.get_model_endpoint,
    )

    @r.put(
        "/model-endpoints/{name}",
        response_model=ModelEndpointRegistered,
        tags=["model endpoints"],
    )
    @rule("model_endpoint.write")
    async def put_model_endpoint(
        name: Name, body: ModelEndpointIn, request: Request
    ) -> dict[str, object]:
        """Register (or replace) a model endpoint: an OpenAI-compatible base URL, the vault
        secret holding its API key, the model names it serves (none: any). An admin's put
        confirms it. Its host is resolved and every address checked (see the module)."""
        cp = cp_of(request)
        found = await _addresses(cp, name, body.base_url)
        by = request.state.actor.audit_name
        endpoint = await cp.store.run(
            lambda: cp.catalog.put_model_endpoint(
                name,
                base_url=body.base_url,
                api_key_secret=body.api_key_secret,
                models=body.models,
                by=by,
            )
        )
        return await _registered(request, "model_endpoint.written", endpoint, found)

    @r.post(
        "/model-endpoints/{name}/confirm",
        response_model=ModelEndpointRegistered,
        tags=["model endpoints"],
    )
    @rule("model_endpoint.confirm")
    async def confirm_model_endpoint(name: Name, request: Request) -> dict[str, object]:
        """Confirm an endpoint as it stands — one migration 0005 made from an agent's former
        inline URL and secret; until then runs that use it are refused."""
        cp = cp_of(request)
        current = await cp.store.run(cp.catalog.get_model_endpoint, name)
        found = await _addresses(cp, name, current.base_url)
        by = request.state.actor.audit_name
        endpoint = await cp.store.run(lambda: cp.catalog.confirm_model_endpoint(name, by=by))
        return await _registered(request, "model_endpoint.confirmed", endpoint, found)

    @r.delete("/model-endpoints/{name}", status_code=204, tags=["model endpoints"])
    @rule("model_endpoint.delete")
    async def delete_model_endpoint(name: Name, request: Request) -> None:
        """Delete a model endpoint; refused (409, on record) while an agent is granted it."""
        cp = cp_of(request)
        await delete_unless_in_use(
            request, "model-endpoint", name, lambda: cp.catalog.delete_model_endpoint(name)
        )

    return r
