"""A model endpoint as an admin registers it: a name, an OpenAI-compatible base URL, the name
of the vault secret holding its API key (never the key), the model names it serves.

Agents name an endpoint granted to them (`model: {endpoint: NAME, name: MODEL}`) and never
carry a URL or a secret. An endpoint an admin puts is confirmed; the ones migration 0005 made
from agents' former inline `base_url`/`api_key_secret` are not, and runs that use them are
refused until an admin confirms them (`aamp model-endpoint confirm NAME`). Storage is in
`Catalog`; this module holds the value and its validation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aamp.egress.registered import RegisteredUrl, UrlError
from aamp.errors import InvalidInput, matching
from aamp.values import Shown
from aamp.vault.vault import NAME_RE as SECRET_NAME_RE

ENDPOINT_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?\Z")
MODEL_NAME_RE = re.compile(r"^[\w./:@+-]{1,200}\Z")
MAX_MODELS = 100


@dataclass(frozen=True)
class ModelEndpoint(Shown):
    name: str
    base_url: str
    api_key_secret: str | None
    models: tuple[str, ...]  # empty: any model name the server answers to
    confirmed: bool
    created_at: str
    created_by: str
    updated_at: str
    updated_by: str
    confirmed_at: str | None
    confirmed_by: str | None

    @property
    def url(self) -> RegisteredUrl:
        return RegisteredUrl.parse(self.base_url)

    def serves(self, model: str) -> bool:
        return not self.models or model in self.models


def check_endpoint_name(name: object) -> str:
    return matching(
        name,
        ENDPOINT_NAME_RE,
        "model endpoint name must be 1-64 lowercase letters, digits, '_' or '-', starting "
        "and ending with a letter or digit",
    )


def check_base_url(base_url: object) -> RegisteredUrl:
    try:
        return RegisteredUrl.parse(base_url)
    except UrlError as exc:
        raise InvalidInput(f"base_url: {exc}") from None


def check_secret_name(secret: object) -> str | None:
    if secret is None:
        return None
    return matching(
        secret,
        SECRET_NAME_RE,
        "api_key_secret: expected the name of a vault secret (lower-case letters, digits "
        "and '_', starting with a letter)",
    )


def check_models(models: object) -> tuple[str, ...]:
    if not isinstance(models, list | tuple) or len(models) > MAX_MODELS:
        raise InvalidInput(f"models: expected a list of at most {MAX_MODELS} model names")
    out: list[str] = []
    for i, model in enumerate(models):
        matching(model, MODEL_NAME_RE, f"models[{i}]: not a model name: {model!r}")
        if model in out:
            raise InvalidInput(f"models[{i}]: {model!r} is listed twice")
        out.append(model)
    return tuple(out)
