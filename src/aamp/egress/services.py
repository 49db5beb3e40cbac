"""Services: an upstream origin and how to authenticate to it, with secrets the guest never sees.

A `Service` is what an admin defines (the API builds it from its `services` row)::

    Service("crm-api", "https://crm.internal.example:8443", Bearer("crm_token"))
    Service("erp", "https://erp.corp.example", Basic("erp_password", user="agent"))
    Service("kb", "https://kb.corp.example", Header("X-Api-Key", "{{secret:kb_key}}"))

The guest's URL for a service IS its upstream origin: the guest asks for
`https://crm.internal.example:8443/...` like any other HTTPS site, through the same proxy. We
chose that over virtual names (`crm-api.service.internal`) because then the policy's egress
rules judge the one host the request really goes to (a deny rule on a service host refuses
it), TLS certificates, Host headers and redirects the upstream sends all name a host the guest
can use, and there is no second name space to keep apart from DNS. The proxy intercepts a
destination only when (host, port) is exactly a granted service's origin; the same host on
another port is an ordinary destination (tunnelled, never injected).

Credential values come from a `SecretReader` — `VaultSecretReader` adapts `aamp.vault.Vault`,
whose `reveal` is the one reader of secret values — once per client connection and service
(`held_credentials.py`; read again when a secret changes), and live only in the `Credential`
built from them (its headers, and the forms of the values and of the header values sent that
its responses are scrubbed of: `secret_forms.py`), held by that connection alone until it
ends: never shared, logged or shown in a repr. Templates come
only from the service definition; nothing the guest sends is ever expanded, so a guest that
writes `{{secret:crm_token}}` into a request gets exactly those characters sent.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aamp.egress.scrub import SecretForms
from aamp.egress.secret_forms import secret_forms
from aamp.policy.hosts import Host, HostError, normalize_host, parse_port, split_host_port
from aamp.policy.model import SERVICE_RE
from aamp.vault import NAME_RE as SECRET_NAME_RE  # the vault's rule for secret names

_TEMPLATE_RE = re.compile(r"\{\{secret:([^{}]*)\}\}")
_TOKEN_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_LITERAL_RE = re.compile(r"^[\x20-\x7e]*\Z")
# Headers a service may not set: framing, routing and hop-by-hop fields the proxy owns.
_RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "proxy-authorization",
        "proxy-authenticate",
    }
)


class ServiceError(ValueError):
    """A service definition that cannot be used; the message names the service and field."""


class CredentialError(Exception):
    """A credential could not be built for a request; names secrets, never values."""


def _secret_name(value: object, where: str) -> str:
    if not isinstance(value, str) or not SECRET_NAME_RE.match(value):
        raise ServiceError(f"{where}: {value!r} is not a valid secret name")
    return value


@dataclass(frozen=True)
class Bearer:
    """`Authorization: Bearer <secret>`."""

    secret: str

    def __post_init__(self) -> None:
        _secret_name(self.secret, "bearer secret")

    @property
    def secret_names(self) -> tuple[str, ...]:
        return (self.secret,)

    @property
    def header_names(self) -> frozenset[str]:
        return frozenset({"authorization"})

    def to_dict(self) -> dict[str, Any]:
        return {"type": "bearer", "secret": self.secret}


@dataclass(frozen=True)
class Basic:
    """`Authorization: Basic base64(user:password)`; the user is literal or a secret."""

    password_secret: str
    user: str | None = None
    user_secret: str | None = None

    def __post_init__(self) -> None:
        _secret_name(self.password_secret, "basic password_secret")
        if (self.user is None) == (self.user_secret is None):
            raise ServiceError("basic auth needs exactly one of user or user_secret")
        if self.user_secret is not None:
            _secret_name(self.user_secret, "basic user_secret")
        if self.user is not None and (
            not self.user or ":" in self.user or not _LITERAL_RE.match(self.user)
        ):
            raise ServiceError("basic user must be printable ASCII without ':'")

    @property
    def secret_names(self) -> tuple[str, ...]:
        if self.user_secret is not None:
            return (self.user_secret, self.password_secret)
        return (self.password_secret,)

    @property
    def header_names(self) -> frozenset[str]:
        return frozenset({"authorization"})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "basic", "password_secret": self.password_secret}
        if self.user is not None:
            out["user"] = self.user
        else:
            out["user_secret"] = self.user_secret
        return out


@dataclass(frozen=True)
class Header:
    """A named header whose value is a template: `Token {{secret:kb_key}}`."""

    name: str
    template: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TOKEN_RE.match(self.name):
            raise ServiceError(f"header name {self.name!r} is not a valid HTTP field name")
        if self.name.lower() in _RESERVED_HEADERS:
            raise ServiceError(
                f"header {self.name!r} is owned by the proxy; a service cannot set it"
            )
        if not isinstance(self.template, str) or not _LITERAL_RE.match(self.template):
            raise ServiceError("header template must be printable ASCII")
        names = [m.group(1) for m in _TEMPLATE_RE.finditer(self.template)]
        if not names:
            raise ServiceError("header template must use at least one {{secret:NAME}}")
        for name in names:
            _secret_name(name, "header template")
        if "{{" in _TEMPLATE_RE.sub("", self.template) or "}}" in _TEMPLATE_RE.sub(
            "", self.template
        ):
            raise ServiceError("header template has a malformed {{...}} placeholder")

    @property
    def secret_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.group(1) for m in _TEMPLATE_RE.finditer(self.template)))

    @property
    def header_names(self) -> frozenset[str]:
        return frozenset({self.name.lower()})

    def to_dict(self) -> dict[str, Any]:
        return {"type": "header", "name": self.name, "template": self.template}


Auth = Bearer | Basic | Header


def auth_from_dict(data: Mapping[str, Any]) -> Auth:
    """Build an `Auth` from its JSON form (`{"type": "bearer", "secret": "crm_token"}`)."""
    if not isinstance(data, Mapping):
        raise ServiceError("auth must be an object with a 'type'")
    kind = data.get("type")
    fields = {k: v for k, v in data.items() if k != "type"}
    allowed = {
        "bearer": ({"secret"}, Bearer),
        "basic": ({"password_secret", "user", "user_secret"}, Basic),
        "header": ({"name", "template"}, Header),
    }
    if kind not in allowed:
        raise ServiceError(f"auth type {kind!r} is not one of bearer, basic, header")
    names, cls = allowed[kind]
    unknown = set(fields) - names
    if unknown:
        raise ServiceError(f"{kind} auth does not take {', '.join(sorted(unknown))}")
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ServiceError(f"{kind} auth: {exc}") from None


@dataclass(frozen=True)
class Service:
    """One service: `name`, `upstream` origin (`https://host[:port]`), and `auth`."""

    name: str
    upstream: str
    auth: Auth
    scheme: str = field(init=False)
    host: Host = field(init=False)
    port: int = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not SERVICE_RE.match(self.name):
            raise ServiceError(f"{self.name!r} is not a valid service name")
        if not isinstance(self.auth, Bearer | Basic | Header):
            raise ServiceError(f"service {self.name}: auth must be Bearer, Basic or Header")
        scheme, host, port = _parse_origin(self.name, self.upstream)
        object.__setattr__(self, "scheme", scheme)
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)
        default = 443 if scheme == "https" else 80
        origin = f"{scheme}://{host}" + ("" if port == default else f":{port}")
        object.__setattr__(self, "upstream", origin)

    @property
    def tls(self) -> bool:
        """Whether the proxy speaks TLS to the upstream (it always may to the guest)."""
        return self.scheme == "https"

    @property
    def url(self) -> str:
        """What the guest uses: the upstream origin itself."""
        return self.upstream

    @property
    def secret_names(self) -> tuple[str, ...]:
        return self.auth.secret_names

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "upstream": self.upstream, "auth": self.auth.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Service:
        return cls(data.get("name"), data.get("upstream"), auth_from_dict(data.get("auth")))  # type: ignore[arg-type]


def _parse_origin(name: str, upstream: object) -> tuple[str, Host, int]:
    if not isinstance(upstream, str):
        raise ServiceError(f"service {name}: upstream must be a URL string")
    scheme, sep, rest = upstream.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise ServiceError(f"service {name}: upstream must start with https:// or http://")
    authority = rest[:-1] if rest.endswith("/") else rest
    if any(c in authority for c in "/?#@"):
        raise ServiceError(
            f"service {name}: upstream must be an origin (scheme://host[:port]), "
            "without userinfo, path, query or fragment"
        )
    try:
        host_text, port_text = split_host_port(authority)
        host = normalize_host(host_text)
        port = (
            parse_port(port_text) if port_text is not None else (443 if scheme == "https" else 80)
        )
    except HostError as exc:
        raise ServiceError(f"service {name}: upstream host: {exc}") from None
    return scheme, host, port


class ServiceSet:
    """The services one sandbox may call, keyed by destination; immutable, replaced whole."""

    def __init__(self, services: Iterable[Service] = ()):
        by_name: dict[str, Service] = {}
        by_origin: dict[tuple[Host, int], Service] = {}
        for service in services:
            if not isinstance(service, Service):
                raise TypeError("ServiceSet takes Service objects")
            if service.name in by_name:
                raise ServiceError(f"service {service.name} is listed twice")
            other = by_origin.get((service.host, service.port))
            if other is not None:
                raise ServiceError(
                    f"services {other.name} and {service.name} have the same upstream "
                    f"{service.host}:{service.port}"
                )
            by_name[service.name] = service
            by_origin[(service.host, service.port)] = service
        self._by_name = by_name
        self._by_origin = by_origin

    @classmethod
    def granted(cls, defined: Iterable[Service], names: Iterable[str]) -> ServiceSet:
        """The services a policy names (`services: [crm-api]`), out of those defined."""
        table = {s.name: s for s in defined}
        wanted = list(dict.fromkeys(names))
        missing = [n for n in wanted if n not in table]
        if missing:
            raise ServiceError(f"no service named {', '.join(missing)}")
        return cls(table[n] for n in wanted)

    def for_destination(self, host: Host, port: int) -> Service | None:
        return self._by_origin.get((host, port))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def __iter__(self) -> Iterator[Service]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"ServiceSet({list(self._by_name)})"


class SecretReader(Protocol):
    async def reveal(self, name: str, *, purpose: str) -> str:
        """The current value of secret `name`, for `purpose` (recorded by the reader)."""
        ...

    def changes(self, name: str) -> int:
        """A number that moves whenever secret `name` is replaced or deleted: a held value
        is used only while it stays what it was when the value was read."""
        ...

    async def record_use(self, service: str, *, purpose: str, details: dict[str, Any]) -> None:
        """Record that a connection which read `service`'s secrets for `purpose` has ended,
        with what it used them for (`details`: request counts, never values)."""
        ...


class VaultSecretReader:
    """`SecretReader` over `aamp.vault.Vault` (whose `reveal` returns a `SecretValue`)."""

    def __init__(self, vault: Any, *, actor: str = "system:egress-proxy"):
        self._vault = vault
        self._actor = actor

    async def reveal(self, name: str, *, purpose: str) -> str:
        value = await self._vault.reveal(name, purpose=purpose, actor=self._actor)
        return value.expose()

    def changes(self, name: str) -> int:
        return self._vault.changes(name)

    async def record_use(self, service: str, *, purpose: str, details: dict[str, Any]) -> None:
        await self._vault.record_use(
            f"service:{service}", purpose=purpose, details=details, actor=self._actor
        )


@dataclass(frozen=True)
class Credential:
    """What one request gets: headers to set (replacing `replaces`) and forms to scrub."""

    service: str
    secret_names: tuple[str, ...]
    replaces: frozenset[str]
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    scrub_forms: SecretForms = field(repr=False)


async def render(service: Service, reader: SecretReader, purpose: str) -> Credential:
    """Read the service's secrets now and build this request's credential."""
    values: dict[str, str] = {}
    for name in service.secret_names:
        try:
            value = await reader.reveal(name, purpose=purpose)
        except Exception as exc:
            raise CredentialError(
                f"secret {name!r} for service {service.name} is unavailable ({type(exc).__name__})"
            ) from None
        if not isinstance(value, str) or not value:
            raise CredentialError(f"secret {name!r} for service {service.name} is empty")
        if not (value.isascii() and value.isprintable()):
            raise CredentialError(
                f"secret {name!r} for service {service.name} is not printable ASCII and "
                "cannot go into an HTTP header"
            )
        values[name] = value
    auth = service.auth
    if isinstance(auth, Bearer):
        header = ("Authorization", f"Bearer {values[auth.secret]}")
        sent = [header[1]]
    elif isinstance(auth, Basic):
        user = auth.user if auth.user is not None else values[auth.user_secret or ""]
        if ":" in user:
            raise CredentialError(f"secret {auth.user_secret!r} (a basic user) contains ':'")
        pair = f"{user}:{values[auth.password_secret]}"
        header = ("Authorization", "Basic " + base64.b64encode(pair.encode()).decode("ascii"))
        sent = [pair, header[1]]
    else:
        header = (auth.name, _TEMPLATE_RE.sub(lambda m: values[m.group(1)], auth.template))
        sent = [header[1]]
    return Credential(
        service=service.name,
        secret_names=tuple(values),
        replaces=auth.header_names,
        headers=(header,),
        scrub_forms=secret_forms(values.values(), sent),
    )
