"""Migration 0005 on both backends: agents' inline model URLs and secrets become unconfirmed
model endpoints (one per distinct pair, named after host and port, serving the models used,
granted to the agents that used them), every definition then parses and names its endpoint;
downgrading puts the inline form back."""

from __future__ import annotations

import json

from sqlalchemy import text

from aamp.agents.definition import definition_from_dict
from aamp.config import Settings
from aamp.store import Store, migrate

STAMP = "2026-01-01T00:00:00.000000Z"


def _model(base_url: str, name: str, secret: str | None = None) -> dict:
    model = {"base_url": base_url, "name": name, "timeout": 120, "retries": 3}
    if secret:
        model["api_key_secret"] = secret
    return {"model": model, "system_prompt": "p", "tools": ["python"], "policy": "p", "limits": {}}


VERSIONS = [
    ("ag-a", 1, "published", _model("http://llm.internal:8080/v1", "qwen", "llm_key")),
    ("ag-a", 2, "draft", _model("http://llm.internal:8080/v1", "llama", "llm_key")),
    ("ag-b", 1, "published", _model("http://llm.internal:8080/v1", "qwen", "other_key")),
    ("ag-b", 2, "published", _model("https://10.0.0.5/v1", "qwen")),
]


def _rows(store: Store, sql: str) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql)).all()]


def test_inline_models_become_unconfirmed_granted_endpoints(settings: Settings) -> None:
    with Store.open(settings, upgrade=False) as store:
        migrate.upgrade(store.engine, "0004")
        with store.engine.begin() as conn:
            for agent in ("ag-a", "ag-b"):
                conn.execute(
                    text("INSERT INTO agents VALUES (:i, :i, 'bob', :t)"), {"i": agent, "t": STAMP}
                )
            for agent, version, status, definition in VERSIONS:
                conn.execute(
                    text(
                        "INSERT INTO agent_versions (agent_id, version, status, definition,"
                        " created_at, created_by, updated_at)"
                        " VALUES (:a, :v, :s, :d, :t, 'bob', :t)"
                    ),
                    {
                        "a": agent,
                        "v": version,
                        "s": status,
                        "d": json.dumps(definition),
                        "t": STAMP,
                    },
                )
        migrate.upgrade(store.engine)
        endpoints = _rows(
            store,
            "SELECT name, base_url, api_key_secret, models, confirmed, created_by"
            " FROM model_endpoints ORDER BY name",
        )
        assert [(n, u, s, json.loads(m), bool(c), b) for n, u, s, m, c, b in endpoints] == [
            ("10-0-0-5-443", "https://10.0.0.5/v1", None, ["qwen"], False, "migration 0005"),
            (
                "llm-internal-8080",
                "http://llm.internal:8080/v1",
                "llm_key",
                ["qwen", "llama"],
                False,
                "migration 0005",
            ),
            (
                "llm-internal-8080-2",
                "http://llm.internal:8080/v1",
                "other_key",
                ["qwen"],
                False,
                "migration 0005",
            ),
        ]
        assert _rows(
            store,
            "SELECT agent_id, name FROM agent_resources WHERE kind = 'model-endpoint'"
            " ORDER BY agent_id, name",
        ) == [
            ("ag-a", "llm-internal-8080"),
            ("ag-b", "10-0-0-5-443"),
            ("ag-b", "llm-internal-8080-2"),
        ]
        stored = _rows(store, "SELECT agent_id, version, definition FROM agent_versions")
        named = {(a, v): definition_from_dict(json.loads(d)).model for a, v, d in stored}
        assert named[("ag-a", 2)].endpoint == "llm-internal-8080"
        assert named[("ag-a", 2)].name == "llama"
        assert named[("ag-b", 2)].endpoint == "10-0-0-5-443"

        migrate.upgrade(store.engine)  # a no-op at head
        with store.engine.connect() as conn:
            _migrate_down(conn)
        back = _rows(store, "SELECT agent_id, version, definition FROM agent_versions")
        assert {(a, v): json.loads(d) for a, v, d in back} == {(a, v): d for a, v, _, d in VERSIONS}
        assert _rows(store, "SELECT count(*) FROM agent_resources") == [(0,)]


def _migrate_down(conn) -> None:
    """Downgrade to 0004 on this connection (as `migrate.upgrade` does the other way)."""
    from alembic import command

    cfg = migrate.alembic_config()
    with conn.begin():
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0004")
