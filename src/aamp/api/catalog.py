"""Routes for policies (YAML or JSON, validated by `aamp.policy`) and services."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from aamp.api.errors import ApiError
from aamp.api.guard import cp_of, record_change, rule
from aamp.identity.catalog import MAX_POLICY_BYTES

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
    created_at: str
    created_by: str
    updated_at: str
    updated_by: str


class ServiceIn(BaseModel):
    upstream: Annotated[str, Field(min_length=1, max_length=512)]
    auth: Literal["bearer", "basic", "header"]
    secrets: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=2)]
    header_name: Annotated[str, Field(max_length=128)] | None = None


class ServiceOut(BaseModel):
    name: str
    upstream: str
    auth: str
    header_name: str | None
    secrets: list[str]
    created_at: str
    created_by: str
    updated_at: str
    updated_by: str


def _format(request: Request) -> str:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in ("application/json", ""):
        return "json"
    if ctype in ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"):
        return "yaml"
    raise ApiError(415, "unsupported_media_type", "send the policy as application/json or YAML")


def router() -> APIRouter:
    r = APIRouter(prefix="/v1")

    @r.get("/policies", response_model=list[PolicyOut], tags=["policies"])
    @rule("policy.list")
    async def list_policies(request: Request) -> list[dict[str, object]]:
        cp = cp_of(request)
        return [p.to_dict() for p in await cp.store.run(cp.catalog.list_policies)]

    @r.get("/policies/{name}", response_model=PolicyOut, tags=["policies"])
    @rule("policy.read")
    async def get_policy(name: Name, request: Request) -> dict[str, object]:
        cp = cp_of(request)
        return (await cp.store.run(cp.catalog.get_policy, name)).to_dict()

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
        stored = await cp.store.run(lambda: cp.catalog.put_policy(name, text, fmt, by=by))
        await record_change(request, "policy.written", f"policy:{name}", {"format": fmt})
        return stored.to_dict()

    @r.delete("/policies/{name}", status_code=204, tags=["policies"])
    @rule("policy.delete")
    async def delete_policy(name: Name, request: Request) -> None:
        cp = cp_of(request)
        await cp.store.run(cp.catalog.delete_policy, name)
        await record_change(request, "policy.deleted", f"policy:{name}", {})

    @r.get("/services", response_model=list[ServiceOut], tags=["services"])
    @rule("service.list")
    async def list_services(request: Request) -> list[dict[str, object]]:
        cp = cp_of(request)
        return [s.to_dict() for s in await cp.store.run(cp.catalog.list_services)]

    @r.get("/services/{name}", response_model=ServiceOut, tags=["services"])
    @rule("service.read")
    async def get_service(name: Name, request: Request) -> dict[str, object]:
        cp = cp_of(request)
        return (await cp.store.run(cp.catalog.get_service, name)).to_dict()

    @r.put("/services/{name}", response_model=ServiceOut, tags=["services"])
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
        cp = cp_of(request)
        await cp.store.run(cp.catalog.delete_service, name)
        await record_change(request, "service.deleted", f"service:{name}", {})

    return r
