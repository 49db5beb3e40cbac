"""Model endpoints: admin-registered, granted to agents; agents no longer carry a URL or secret.

Creates `model_endpoints` and lets `agent_resources` grant the kind `model-endpoint`. Every
agent version whose definition names `model.base_url` (and maybe `model.api_key_secret`) is
rewritten to name a model endpoint instead: one endpoint per distinct (URL, secret) pair,
named after the URL's host and port, serving the model names those versions used, granted
to each agent that used it — and **not confirmed**. Runs that use an unconfirmed endpoint are
refused, naming it and the command, until an admin has checked its URL and secret and run
`aamp model-endpoint confirm NAME` (audited). The URL is kept exactly as the agent had it;
confirming checks that it is one `aamp model-endpoint put` would accept.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from urllib.parse import urlsplit

import sqlalchemy as sa
from alembic import op

from aamp.store.migrations.shapes import at, by, primary_key, replace_check, stamped

revision = "0005"
down_revision = "0004"

BY = "migration 0005"
OLD_KINDS = "kind IN ('policy', 'service', 'image')"
NEW_KINDS = "kind IN ('policy', 'service', 'image', 'model-endpoint')"


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _base_name(base_url: str) -> str:
    """`llm-internal-8080` for http://llm.internal:8080/v1 (a valid endpoint name)."""
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    text = re.sub(r"[^a-z0-9]+", "-", f"{parts.hostname or 'endpoint'}-{port}".lower())
    return text.strip("-")[:56].strip("-") or "endpoint"


def upgrade() -> None:
    op.create_table(
        "model_endpoints",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("base_url", sa.String(512), nullable=False),
        sa.Column("api_key_secret", sa.String(64), nullable=True),
        sa.Column("models", sa.Text(), nullable=False),
        sa.Column("confirmed", sa.Boolean(), nullable=False),
        *stamped(),
        at("confirmed_at", nullable=True),
        by("confirmed_by", nullable=True),
        primary_key("model_endpoints", "name"),
    )
    replace_check("agent_resources", "kind", NEW_KINDS)
    _endpoints_from_inline_models()


def _endpoints_from_inline_models() -> None:
    conn = op.get_bind()
    versions = conn.execute(
        sa.text(
            "SELECT agent_id, version, definition FROM agent_versions ORDER BY agent_id, version"
        )
    ).all()
    names: dict[tuple[str, str | None], str] = {}  # (base_url, secret) -> endpoint name
    models: dict[str, list[str]] = {}
    users: dict[str, set[str]] = {}
    for agent_id, version, text in versions:
        definition = json.loads(text)
        model = definition.get("model")
        if not isinstance(model, dict) or "base_url" not in model:
            continue
        key = (str(model.pop("base_url")), model.pop("api_key_secret", None))
        if key not in names:
            base, n = _base_name(key[0]), 1
            while (candidate := base if n == 1 else f"{base}-{n}") in names.values():
                n += 1
            names[key] = candidate
        name = names[key]
        model["endpoint"] = name
        if model.get("name") not in models.setdefault(name, []):
            models[name].append(str(model.get("name")))
        users.setdefault(name, set()).add(agent_id)
        conn.execute(
            sa.text(
                "UPDATE agent_versions SET definition = :d WHERE agent_id = :a AND version = :v"
            ),
            {"d": json.dumps(definition, sort_keys=True), "a": agent_id, "v": version},
        )
    stamp = _stamp()
    for (base_url, secret), name in names.items():
        conn.execute(
            sa.text(
                "INSERT INTO model_endpoints (name, base_url, api_key_secret, models, confirmed,"
                " created_at, created_by, updated_at, updated_by)"
                " VALUES (:n, :u, :s, :m, :c, :t, :b, :t, :b)"
            ),
            {
                "n": name,
                "u": base_url,
                "s": secret,
                "m": json.dumps(models[name]),
                "c": False,
                "t": stamp,
                "b": BY,
            },
        )
        for agent_id in sorted(users[name]):
            conn.execute(
                sa.text(
                    "INSERT INTO agent_resources (agent_id, kind, name, created_at, created_by)"
                    " VALUES (:a, 'model-endpoint', :n, :t, :b)"
                ),
                {"a": agent_id, "n": name, "t": stamp, "b": BY},
            )


def downgrade() -> None:
    conn = op.get_bind()
    endpoints = {
        name: (base_url, secret)
        for name, base_url, secret in conn.execute(
            sa.text("SELECT name, base_url, api_key_secret FROM model_endpoints")
        ).all()
    }
    for agent_id, version, text in conn.execute(
        sa.text("SELECT agent_id, version, definition FROM agent_versions")
    ).all():
        definition = json.loads(text)
        model = definition.get("model")
        if not isinstance(model, dict) or model.get("endpoint") not in endpoints:
            continue
        base_url, secret = endpoints[model.pop("endpoint")]
        model["base_url"] = base_url
        if secret is not None:
            model["api_key_secret"] = secret
        conn.execute(
            sa.text(
                "UPDATE agent_versions SET definition = :d WHERE agent_id = :a AND version = :v"
            ),
            {"d": json.dumps(definition, sort_keys=True), "a": agent_id, "v": version},
        )
    conn.execute(sa.text("DELETE FROM agent_resources WHERE kind = 'model-endpoint'"))
    replace_check("agent_resources", "kind", OLD_KINDS)
    op.drop_table("model_endpoints")
