"""`Catalog`: what an admin defines and grants to agents — policies, services, images, model
endpoints (`model_endpoints.py`: the value and its validation).

Policies are kept as the document the admin wrote (YAML or JSON), validated with
`aamp.policy` on the way in so a stored policy always parses. Services name an upstream
origin, an auth kind and the vault secret names holding its credentials (never values).
`agent_resources` records which of them each agent may use; `agent_needs` reads a policy
(and a run's model endpoint) with what of it an agent is not granted, the facts `allowed`
decides a sandbox or run on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from sqlalchemy import delete, select
from sqlalchemy import text as sql

from aamp.catalog.model_endpoints import (
    ModelEndpoint,
    check_base_url,
    check_endpoint_name,
    check_models,
    check_secret_name,
)
from aamp.egress.services import Auth, Basic, Bearer, Header
from aamp.egress.services import Service as EgressService
from aamp.errors import Conflict, InvalidInput, NotFound, found, matching
from aamp.policy import Policy, PolicyError, load_json, parse_policy, policy_from_dict
from aamp.policy.model import IMAGE_RE, NAME_RE, SERVICE_RE
from aamp.store import Store, added, existing, locked, locked_or_new, value_of
from aamp.store.tables import (
    AgentResourceRow,
    AgentRow,
    ModelEndpointRow,
    PolicyRow,
    ServiceRow,
)
from aamp.store.timestamps import now
from aamp.values import Shown
from aamp.vault.vault import NAME_RE as SECRET_NAME_RE

# Names "the policies' warm counts" among PostgreSQL advisory locks: two policy writes that
# each fit the bound alone must not both pass it.
WARM_LOCK_KEY = 0x61616D7077
RESOURCE_KINDS = ("policy", "service", "image", "model-endpoint", "knowledge-base")
AUTH_KINDS = ("bearer", "basic", "header")
# How many secrets each auth kind takes: bearer a token, basic a username and a password,
# header the header's value.
SECRETS_PER_KIND = {"bearer": 1, "basic": 2, "header": 1}
HEADER_NAME_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}\Z")
MAX_POLICY_BYTES = 64 * 1024


@dataclass(frozen=True)
class StoredPolicy:
    name: str
    source: str
    format: str
    policy: Policy
    created_at: str
    created_by: str
    updated_at: str
    updated_by: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "format": self.format,
            "source": self.source,
            "image": self.policy.image,
            "services": list(self.policy.services),
            "packages": list(self.policy.packages),
            "warm": self.policy.warm,
            "created_at": self.created_at,
            "created_by": self.created_by,
            "updated_at": self.updated_at,
            "updated_by": self.updated_by,
        }


@dataclass(frozen=True)
class Service(Shown):
    name: str
    upstream: str
    auth: str
    header_name: str | None
    secrets: tuple[str, ...]
    created_at: str
    created_by: str
    updated_at: str
    updated_by: str

    def for_egress(self) -> EgressService:
        """The form the egress proxy injects credentials from (basic: user, then password)."""
        auth: Auth
        if self.auth == "bearer":
            auth = Bearer(self.secrets[0])
        elif self.auth == "basic":
            auth = Basic(user_secret=self.secrets[0], password_secret=self.secrets[1])
        else:
            auth = Header(self.header_name or "", "{{secret:" + self.secrets[0] + "}}")
        return EgressService(self.name, self.upstream, auth)


@dataclass(frozen=True)
class AgentNeeds:
    """What a sandbox or run for one agent would use, read in one snapshot: the named policy
    (`policy` None if there is none by that name), its services that exist (in the policy's
    order) and the names of those that do not, a run's model endpoint (None if not asked for
    or not found), and — for an agent — what of all that is not granted to it (`policy:NAME`,
    `image:NAME`, `service:NAME`, `model-endpoint:NAME`: the facts `allowed` decides on)."""

    policy_name: str
    policy: StoredPolicy | None
    services: tuple[Service, ...]
    unknown_services: tuple[str, ...]
    endpoint: ModelEndpoint | None
    ungranted: tuple[str, ...]


def parse_policy_document(text: str, fmt: str) -> Policy:
    """Validate a policy document; PolicyError lists every bad field by its path."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_POLICY_BYTES:
        raise PolicyError([("", f"the policy document is larger than {MAX_POLICY_BYTES} bytes")])
    if fmt == "json":
        try:
            data = load_json(text)
        except ValueError as exc:
            raise PolicyError([("", str(exc))]) from None
        return policy_from_dict(data)
    return parse_policy(text)


def _check_policy_name(name: str, policy: Policy) -> None:
    if not NAME_RE.match(name):
        raise InvalidInput(
            "policy name must be 1-64 lowercase letters, digits, '.', '_' or '-', starting and "
            "ending with a letter or digit"
        )
    if policy.name and policy.name != name:
        raise InvalidInput(f"name: the document names {policy.name!r} but the URL names {name!r}")


def check_upstream(upstream: object) -> str:
    if not isinstance(upstream, str) or len(upstream) > 512:
        raise InvalidInput("upstream must be an origin like https://crm.internal.example")
    parts = urlsplit(upstream)
    try:
        port = parts.port
    except ValueError:
        raise InvalidInput("upstream: the port is not a number between 0 and 65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput("upstream must be an http(s) origin like https://crm.internal.example")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise InvalidInput("upstream must be an origin only: no path, query or credentials")
    netloc = parts.hostname + (f":{port}" if port is not None else "")
    return f"{parts.scheme}://{netloc}"


def _refuse_if_in_use(s: Any, kind: str, name: str, naming: list[str] | None = None) -> None:
    """Refuse to delete what is still in use: granted to agents (their runs would be refused
    for it) or, for a service, named by policies. Nothing is taken back silently: the admin
    detaches it (or edits those policies) first, each change audited on its own."""
    granted = s.scalars(
        select(AgentResourceRow.agent_id)
        .where(AgentResourceRow.kind == kind, AgentResourceRow.name == name)
        .order_by(AgentResourceRow.agent_id)
    ).all()
    users = [*(naming or []), *(f"agent:{a}" for a in granted)]
    if not users:
        return
    steps = []
    if naming:
        steps.append("remove it from those policies")
    if granted:
        steps.append(f"take it back from those agents (`aamp grant detach AGENT {kind} {name}`)")
    raise Conflict(f"{kind} {name} is in use by {', '.join(users)}; {' and '.join(steps)} first")


def _entry(s: Any, table: Any, name: str, stamp: str, by: str) -> Any:
    """The row of `table` (policies, services, model endpoints) named `name`, locked for the
    write; a new one, created at `stamp` by `by`, when there is none."""
    return locked_or_new(
        s, table.name, name, lambda: table(name=name, created_at=stamp, created_by=by)
    )


T = TypeVar("T")  # what an entry's row is shown as


@dataclass(frozen=True)
class Catalog:
    store: Store

    # Policies, services and model endpoints are each a table of entries keyed by name; these
    # read and delete an entry of any of them, `value` turning its row into what is shown.

    def _all(self, table: Any, value: Callable[[Any], T]) -> list[T]:
        with self.store.session() as s:
            return [value(r) for r in s.scalars(select(table).order_by(table.name))]

    def _find(self, table: Any, name: str, value: Callable[[Any], T]) -> T | None:
        with self.store.session() as s:
            row = s.get(table, name)
            return value(row) if row is not None else None

    def _delete_unused(
        self,
        table: Any,
        kind: str,
        name: str,
        naming: Callable[[Any], list[str]] | None = None,
    ) -> None:
        """Delete entry `name` unless agents are granted it or (`naming(session)`: who names
        it) something names it; else `Conflict`, naming them."""
        with self.store.write_session() as s:
            existing(s, table, name, f"no {kind.replace('-', ' ')} named {name!r}")
            _refuse_if_in_use(s, kind, name, naming(s) if naming is not None else None)
            s.execute(delete(table).where(table.name == name))

    # -- policies -----------------------------------------------------------------------

    def put_policy(
        self,
        name: str,
        source: str,
        fmt: str,
        *,
        by: str,
        check_warm: Callable[[dict[str, int]], None] | None = None,
    ) -> StoredPolicy:
        """Create or replace a policy. `check_warm` is given every stored policy's `warm`
        with this one's (under the write lock, so two writes cannot both pass it) and
        raises `ValueError` when they ask for more warm sandboxes than the installation
        keeps; that refusal names the policy's `warm` field."""
        policy = parse_policy_document(source, fmt)
        _check_policy_name(name, policy)
        stamp = now()
        with self.store.write_session() as s:
            if check_warm is not None and policy.warm:
                if s.get_bind().dialect.name == "postgresql":  # SQLite: BEGIN IMMEDIATE
                    s.execute(sql("SELECT pg_advisory_xact_lock(:k)"), {"k": WARM_LOCK_KEY})
                warm = {
                    row.name: self._policy(row).policy.warm
                    for row in s.scalars(select(PolicyRow).where(PolicyRow.name != name))
                }
                try:
                    check_warm({**warm, name: policy.warm})
                except ValueError as exc:
                    raise PolicyError([("warm", str(exc))]) from None
            row = _entry(s, PolicyRow, name, stamp, by)
            row.source, row.format, row.updated_at, row.updated_by = source, fmt, stamp, by
            s.flush()
            return self._policy(row)

    @staticmethod
    def _policy(row: PolicyRow) -> StoredPolicy:
        return value_of(StoredPolicy, row, policy=parse_policy_document(row.source, row.format))

    def list_policies(self) -> list[StoredPolicy]:
        return self._all(PolicyRow, self._policy)

    def find_policy(self, name: str) -> StoredPolicy | None:
        return self._find(PolicyRow, name, self._policy)

    def get_policy(self, name: str) -> StoredPolicy:
        return found(self.find_policy(name), f"no policy named {name!r}")

    def remove_unused(self, kind: str, name: str, remove: Callable[[], None]) -> None:
        """For what is kept outside the store (knowledge bases): `remove()` it unless agents
        are granted it (`Conflict`, naming them), under the store's write lock so no grant
        arrives between the check and the removal."""
        with self.store.write_session() as s:
            _refuse_if_in_use(s, kind, name)
            remove()

    def delete_policy(self, name: str) -> None:
        """Delete a policy no agent is granted (else `Conflict`, naming them)."""
        self._delete_unused(PolicyRow, "policy", name)

    # -- services -----------------------------------------------------------------------

    def put_service(
        self,
        name: str,
        *,
        upstream: str,
        auth: str,
        secrets: list[str],
        header_name: str | None,
        by: str,
    ) -> Service:
        matching(
            name, SERVICE_RE, "service name must be 1-64 lowercase letters, digits, '_' or '-'"
        )
        origin = check_upstream(upstream)
        if auth not in AUTH_KINDS:
            raise InvalidInput(f"auth must be one of {', '.join(AUTH_KINDS)}; got {auth!r}")
        want = SECRETS_PER_KIND[auth]
        if len(secrets) != want:
            raise InvalidInput(f"secrets: auth {auth} takes exactly {want} secret name(s)")
        for i, secret in enumerate(secrets):
            matching(secret, SECRET_NAME_RE, f"secrets[{i}]: not a valid secret name")
        if auth == "header":
            matching(
                header_name,
                HEADER_NAME_RE,
                "header_name: auth header needs a valid HTTP header name",
            )
        elif header_name is not None:
            raise InvalidInput(f"header_name: only auth header takes a header name, not {auth}")
        stamp = now()
        with self.store.write_session() as s:
            row = _entry(s, ServiceRow, name, stamp, by)
            row.upstream, row.auth_kind, row.header_name = origin, auth, header_name
            row.secret_names = json.dumps(list(secrets))
            row.updated_at, row.updated_by = stamp, by
            s.flush()
            return self._service(row)

    @staticmethod
    def _service(row: ServiceRow) -> Service:
        return value_of(
            Service, row, auth=row.auth_kind, secrets=tuple(json.loads(row.secret_names))
        )

    def list_services(self) -> list[Service]:
        return self._all(ServiceRow, self._service)

    def get_service(self, name: str) -> Service:
        return found(self._find(ServiceRow, name, self._service), f"no service named {name!r}")

    def delete_service(self, name: str) -> None:
        """Delete a service no policy names and no agent is granted (else `Conflict`)."""

        def naming(s: Any) -> list[str]:
            rows = s.scalars(select(PolicyRow).order_by(PolicyRow.name))
            return [f"policy:{r.name}" for r in rows if name in self._policy(r).policy.services]

        self._delete_unused(ServiceRow, "service", name, naming)

    def secret_usage(self) -> dict[str, list[str]]:
        """secret name -> the services and model endpoints that use it (the "where used" of
        the secrets list)."""
        used: dict[str, list[str]] = {}
        for service in self.list_services():
            for secret in service.secrets:
                used.setdefault(secret, []).append(f"service:{service.name}")
        for endpoint in self.list_model_endpoints():
            if endpoint.api_key_secret:
                used.setdefault(endpoint.api_key_secret, []).append(
                    f"model-endpoint:{endpoint.name}"
                )
        return used

    # -- model endpoints ----------------------------------------------------------------

    def put_model_endpoint(
        self,
        name: str,
        *,
        base_url: str,
        api_key_secret: str | None,
        models: list[str] | tuple[str, ...],
        by: str,
    ) -> ModelEndpoint:
        """Create or replace an endpoint. An admin stating its URL confirms it."""
        check_endpoint_name(name)
        url = check_base_url(base_url)
        secret = check_secret_name(api_key_secret)
        served = check_models(models)
        stamp = now()
        with self.store.write_session() as s:
            row = _entry(s, ModelEndpointRow, name, stamp, by)
            row.base_url, row.api_key_secret = url.url, secret
            row.models = json.dumps(list(served))
            row.confirmed, row.confirmed_at, row.confirmed_by = True, stamp, by
            row.updated_at, row.updated_by = stamp, by
            s.flush()
            return self._endpoint(row)

    def confirm_model_endpoint(self, name: str, *, by: str) -> ModelEndpoint:
        """Confirm an endpoint as it stands (one migration 0005 made from an agent's inline
        URL); its URL must be one that `put` would accept."""
        with self.store.write_session() as s:
            row = locked(s, ModelEndpointRow.name, name)
            if row is None:
                raise NotFound(f"no model endpoint named {name!r}")
            try:
                check_base_url(row.base_url)
            except InvalidInput as exc:
                raise InvalidInput(
                    f"{exc}; register it again with `aamp model-endpoint put {name} "
                    "--base-url URL` instead"
                ) from None
            stamp = now()
            row.confirmed, row.confirmed_at, row.confirmed_by = True, stamp, by
            row.updated_at, row.updated_by = stamp, by
            s.flush()
            return self._endpoint(row)

    @staticmethod
    def _endpoint(row: ModelEndpointRow) -> ModelEndpoint:
        return value_of(
            ModelEndpoint, row, models=tuple(json.loads(row.models)), confirmed=bool(row.confirmed)
        )

    def list_model_endpoints(self) -> list[ModelEndpoint]:
        return self._all(ModelEndpointRow, self._endpoint)

    def find_model_endpoint(self, name: str) -> ModelEndpoint | None:
        return self._find(ModelEndpointRow, name, self._endpoint)

    def get_model_endpoint(self, name: str) -> ModelEndpoint:
        return found(self.find_model_endpoint(name), f"no model endpoint named {name!r}")

    def delete_model_endpoint(self, name: str) -> None:
        """Delete a model endpoint no agent is granted (else `Conflict`, naming them)."""
        self._delete_unused(ModelEndpointRow, "model-endpoint", name)

    # -- what agents are granted --------------------------------------------------------

    def grant_resource(
        self,
        agent_id: str,
        kind: str,
        name: str,
        *,
        by: str,
        kept_outside: Callable[[str], object] | None = None,
    ) -> dict[str, Any]:
        """Grant `kind` `name` to the agent (`NotFound` if either does not exist). What is kept
        outside the store (knowledge bases) is looked up by `kept_outside(name)`, which raises
        `NotFound` for one that does not exist, under the store's write lock, so the removal
        (`remove_unused`) cannot come between the look-up and the grant."""
        if kind not in RESOURCE_KINDS:
            raise InvalidInput(f"kind must be one of {', '.join(RESOURCE_KINDS)}; got {kind!r}")
        if kind == "image":
            matching(name, IMAGE_RE, "name: not a valid image name")
        if kind == "knowledge-base":  # kept as files (`knowledge_bases.py`), named like these
            matching(name, NAME_RE, "name: not a valid knowledge base name")
        with self.store.write_session() as s:
            existing(s, AgentRow, agent_id, f"no agent {agent_id!r}")
            if kind == "policy" and s.get(PolicyRow, name) is None:
                raise NotFound(f"no policy named {name!r}")
            if kind == "service" and s.get(ServiceRow, name) is None:
                raise NotFound(f"no service named {name!r}")
            if kind == "model-endpoint" and s.get(ModelEndpointRow, name) is None:
                raise NotFound(f"no model endpoint named {name!r}")
            if kind == "knowledge-base":
                if kept_outside is None:  # never granted unlooked-at
                    raise TypeError("a knowledge-base grant needs kept_outside to look it up")
                kept_outside(name)
            row = AgentResourceRow(
                agent_id=agent_id, kind=kind, name=name, created_at=now(), created_by=by
            )
            taken = f"{kind} {name!r} is already granted to agent {agent_id!r}"
            return self._resource(added(s, row, taken))

    @staticmethod
    def _resource(row: AgentResourceRow) -> dict[str, Any]:
        return {
            "agent_id": row.agent_id,
            "kind": row.kind,
            "name": row.name,
            "created_at": row.created_at,
            "created_by": row.created_by,
        }

    def list_resources(self, agent_id: str) -> list[dict[str, Any]]:
        with self.store.session() as s:
            rows = s.scalars(
                select(AgentResourceRow)
                .where(AgentResourceRow.agent_id == agent_id)
                .order_by(AgentResourceRow.kind, AgentResourceRow.name)
            )
            return [self._resource(r) for r in rows]

    def revoke_resource(self, agent_id: str, kind: str, name: str) -> None:
        with self.store.write_session() as s:
            row = s.get(AgentResourceRow, (agent_id, kind, name))
            if row is None:
                raise NotFound(f"{kind} {name!r} is not granted to agent {agent_id!r}")
            s.delete(row)

    def agent_needs(
        self,
        agent_id: str | None,
        policy: str,
        *,
        endpoint: str | None = None,
        knowledge_bases: tuple[str, ...] = (),
    ) -> AgentNeeds:
        """Policy `policy` with its services (and model endpoint `endpoint` and the
        `knowledge_bases` it searches, for a run), and what of it `agent_id` is not granted,
        in one snapshot (see `AgentNeeds`); without an agent nothing is checked against
        grants."""
        with self.store.session() as s:
            row = s.get(PolicyRow, policy)
            stored = self._policy(row) if row is not None else None
            services: list[Service] = []
            unknown: list[str] = []
            for service_name in stored.policy.services if stored else ():
                service_row = s.get(ServiceRow, service_name)
                if service_row is None:
                    unknown.append(service_name)
                else:
                    services.append(self._service(service_row))
            endpoint_row = s.get(ModelEndpointRow, endpoint) if endpoint is not None else None
            granted = set()
            if agent_id is not None:
                rows = s.scalars(
                    select(AgentResourceRow).where(AgentResourceRow.agent_id == agent_id)
                )
                granted = {(r.kind, r.name) for r in rows}
        needed = [("policy", policy)]
        if stored is not None:
            needed.append(("image", stored.policy.image))
            needed.extend(("service", n) for n in stored.policy.services)
        if endpoint is not None:
            needed.append(("model-endpoint", endpoint))
        needed.extend(("knowledge-base", n) for n in knowledge_bases)
        ungranted = (
            tuple(f"{k}:{n}" for k, n in needed if (k, n) not in granted)
            if agent_id is not None
            else ()
        )
        return AgentNeeds(
            policy,
            stored,
            tuple(services),
            tuple(unknown),
            self._endpoint(endpoint_row) if endpoint_row is not None else None,
            ungranted,
        )

    def is_granted(self, agent_id: str, kind: str, name: str) -> bool:
        with self.store.session() as s:
            return s.get(AgentResourceRow, (agent_id, kind, name)) is not None
