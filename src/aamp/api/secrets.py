"""Routes for secrets: values go in (to the vault) and never come out of the API.

Responses carry a secret's name, version, who set it, when, and where it is used — never the
value. The only reader of values is the egress proxy, inside the host process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import Field

from aamp.api.body import Body
from aamp.api.errors import ApiError
from aamp.api.guard import actor_of, cp_of, guarded_router, request_id, rule
from aamp.vault import MAX_VALUE_BYTES, SecretMetadata

Name = Annotated[str, Path(min_length=1, max_length=64)]


class SecretIn(Body):
    value: Annotated[str, Field(min_length=1, max_length=MAX_VALUE_BYTES)]


@dataclass(frozen=True, kw_only=True)
class SecretOut(SecretMetadata):
    used_by: list[str]


def router() -> APIRouter:
    r = guarded_router(prefix="/v1", tags=["secrets"])

    async def _with_usage(request: Request, metas: list) -> list[dict[str, object]]:  # type: ignore[type-arg]
        cp = cp_of(request)
        usage = await cp.store.run(cp.catalog.secret_usage)
        return [{**m.to_dict(), "used_by": usage.get(m.name, [])} for m in metas]

    @r.get("/secrets", response_model=list[SecretOut])
    @rule("secret.list")
    async def list_secrets(request: Request) -> list[dict[str, object]]:
        return await _with_usage(request, await cp_of(request).vault.list())

    @r.get("/secrets/{name}", response_model=SecretOut)
    @rule("secret.read")
    async def get_secret(name: Name, request: Request) -> dict[str, object]:
        """A secret's metadata (never its value)."""
        meta = await cp_of(request).vault.metadata(name)
        return (await _with_usage(request, [meta]))[0]

    @r.put("/secrets/{name}", response_model=SecretOut)
    @rule("secret.write")
    async def put_secret(name: Name, body: SecretIn, request: Request) -> dict[str, object]:
        """Set a secret's value (write-only: it is never shown again)."""
        meta = await cp_of(request).vault.put(
            name,
            body.value,
            actor=actor_of(request).audit_name,
            request_id=request_id(request),
            reason=request.state.decision.reason,
        )
        return (await _with_usage(request, [meta]))[0]

    @r.post("/vault/rotate")
    @rule("vault.rotate")
    async def rotate_master_key(request: Request) -> dict[str, object]:
        """Re-wrap every secret's data key under a new random master key, in one transaction;
        the values are unchanged and never leave the vault. Only for a master key kept in
        `$AAMP_HOME` (a key given by AAMP_MASTER_KEY is rotated by whoever sets that)."""
        vault = cp_of(request).vault
        if vault.master_key_path is None:
            raise ApiError(
                409,
                "master_key_from_environment",
                "the master key comes from AAMP_MASTER_KEY; rotate it there, not online",
            )
        new = await vault.rotate_master_key(
            actor=actor_of(request).audit_name, request_id=request_id(request)
        )
        return {"key_id": new.key_id}

    @r.delete("/secrets/{name}", status_code=204)
    @rule("secret.delete")
    async def delete_secret(name: Name, request: Request) -> None:
        await cp_of(request).vault.delete(
            name,
            actor=actor_of(request).audit_name,
            request_id=request_id(request),
            reason=request.state.decision.reason,
        )

    return r
