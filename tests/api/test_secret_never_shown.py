"""A secret's value appears nowhere but as ciphertext: not in any API response, log line,
audit record or database column (the raw database file is searched too)."""

from __future__ import annotations

import logging

from sqlalchemy import inspect, select

VALUE = "Zq9-unmistakable-secret-7781"


async def test_secret_value_is_absent_everywhere(plane, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    cp = plane.cp
    bodies: list[str] = []
    async with plane.client(plane.admin_token) as c:
        calls = [
            ("PUT", "/v1/secrets/crm_token", {"value": VALUE}),
            (
                "PUT",
                "/v1/services/crm",
                {
                    "upstream": "https://crm.internal.example",
                    "auth": "bearer",
                    "secrets": ["crm_token"],
                },
            ),
            ("GET", "/v1/secrets", None),
            ("GET", "/v1/secrets/crm_token", None),
            ("PUT", "/v1/secrets/crm_token", {"value": VALUE + "-v2"}),
            ("PUT", "/v1/secrets/Bad-Name", {"value": VALUE}),
            # An unknown field is refused (422), and the refusal does not echo what it held.
            ("PUT", "/v1/secrets/crm_token", {"value": VALUE, "extra": VALUE}),
            ("PUT", "/v1/secrets/crm_token", {"value": VALUE}),
            ("PUT", "/v1/secrets/crm_token", {"value": VALUE * 3000}),
            ("GET", "/v1/services/crm", None),
            ("GET", "/v1/audit?limit=1000", None),
        ]
        for method, url, body in calls:
            resp = await c.request(method, url, json=body)
            bodies.append(resp.text + str(resp.headers))
    # The value really is stored (sealed), and the vault's one reader still gets it.
    assert (await cp.vault.reveal("crm_token", purpose="test")).expose() == VALUE
    await cp.audit.checkpoint()

    for text in bodies:
        assert VALUE not in text
    assert VALUE not in caplog.text
    with cp.store.engine.connect() as conn:
        for table in inspect(conn).get_table_names():
            for row in conn.execute(select(_table(conn, table))):
                for cell in row:
                    blob = cell if isinstance(cell, bytes) else str(cell).encode()
                    assert VALUE.encode() not in blob, f"secret value in table {table}"
    db_file = cp.settings.home / "aamp.db"
    for path in (db_file, db_file.with_name("aamp.db-wal")):
        if path.exists():
            assert VALUE.encode() not in path.read_bytes(), f"secret value in {path.name}"


def _table(conn, name: str):
    from sqlalchemy import MetaData, Table

    return Table(name, MetaData(), autoload_with=conn)


async def test_master_key_rotation_through_the_api(plane) -> None:
    """An admin rotates the vault's master key online: the key file changes, every value
    still reads back, the response and the audit record carry key ids only."""
    cp = plane.cp
    key_file = cp.settings.home / "vault-master.key"
    async with plane.client(plane.admin_token) as c:
        assert (await c.put("/v1/secrets/crm_token", json={"value": VALUE})).status_code == 200
        before = key_file.read_bytes()
        rotated = await c.post("/v1/vault/rotate")
        assert rotated.status_code == 200, rotated.text
        assert set(rotated.json()) == {"key_id"}
        assert key_file.read_bytes() != before
        assert VALUE not in rotated.text
    assert (await cp.vault.reveal("crm_token", purpose="test")).expose() == VALUE
    records = [r for r in await _audit_actions(cp) if r == "vault.rotate_master_key"]
    assert records == ["vault.rotate_master_key"]


async def _audit_actions(cp) -> list[str]:
    from sqlalchemy import text

    with cp.store.engine.connect() as conn:
        return [row[0] for row in conn.execute(text("SELECT action FROM audit_records"))]
