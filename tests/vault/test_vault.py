"""The vault: envelope encryption at rest, one value reader, rotation, tamper detection."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from sqlalchemy import text

from aamp.audit import AuditLog, verify
from aamp.config import Settings
from aamp.store import Store
from aamp.vault import (
    MasterKey,
    MasterKeyError,
    SecretIntegrityError,
    SecretNameError,
    SecretNotFound,
    SecretValueError,
    Vault,
    VaultKeyError,
)

VALUE = "tok-" + "Zq8x" * 6  # distinctive bytes to grep for


def _with_env(settings: Settings, **env: str) -> Settings:
    return Settings(
        home=settings.home,
        runtime_dir=settings.runtime_dir,
        image_dir=settings.image_dir,
        env={**settings.env, **env},
    )


def _audit_texts(store: Store) -> list[str]:
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT action, resource, reason, details FROM audit_records"))
        return [" ".join(str(c) for c in row) for row in rows]


async def test_put_metadata_list_delete(settings: Settings, store: Store, audit: AuditLog) -> None:
    vault = Vault.open(settings, store, audit)
    m1 = await vault.put("crm_token", VALUE, actor="user:admin", request_id="req-1")
    assert (m1.name, m1.version, m1.created_by, m1.updated_by) == (
        "crm_token",
        1,
        "user:admin",
        "user:admin",
    )
    m2 = await vault.put("crm_token", VALUE + "2", actor="user:root")
    assert (m2.version, m2.created_by, m2.updated_by) == (2, "user:admin", "user:root")
    await vault.put("another", "x", actor="user:admin")
    assert [m.name for m in await vault.list()] == ["another", "crm_token"]
    assert (await vault.metadata("crm_token")).version == 2
    assert VALUE not in repr(m2.to_dict())
    revealed = await vault.reveal("crm_token", purpose="inject into crm-api", request_id="r9")
    assert revealed.expose() == VALUE + "2"
    assert VALUE not in repr(revealed) and VALUE not in str(revealed)
    await vault.delete("another", actor="user:admin")
    with pytest.raises(SecretNotFound, match="'another'"):
        await vault.metadata("another")
    with pytest.raises(SecretNotFound):
        await vault.delete("another", actor="user:admin")
    actions = [t.split()[0] for t in _audit_texts(store)]
    assert actions == ["secret.put", "secret.put", "secret.put", "secret.reveal", "secret.delete"]
    assert all(VALUE not in t for t in _audit_texts(store))
    assert "inject into crm-api" in _audit_texts(store)[3]
    assert verify(store, audit.signer.trusted_keys()).ok


async def test_bad_names_and_values_are_refused_without_echoing_values(
    settings: Settings, store: Store, audit: AuditLog
) -> None:
    vault = Vault.open(settings, store, audit)
    for bad in ["", "Upper", "1abc", "a-b", "a" * 65, "ünï"]:
        with pytest.raises(SecretNameError, match="invalid"):
            await vault.put(bad, VALUE, actor="user:a")
    with pytest.raises(SecretValueError) as info:
        await vault.put("ok_name", "", actor="user:a")
    with pytest.raises(SecretValueError) as info:
        await vault.put("ok_name", VALUE * 3000, actor="user:a")
    assert VALUE not in str(info.value)
    with pytest.raises(Exception, match="purpose"):
        await vault.reveal("ok_name", purpose=" ")
    assert await vault.list() == []


async def test_a_use_record_names_its_purpose_and_counts_and_needs_a_purpose(
    settings: Settings, store: Store, audit: AuditLog
) -> None:
    vault = Vault.open(settings, store, audit)
    with pytest.raises(Exception, match="purpose"):
        await vault.record_use("service:crm", purpose=" ", details={"requests": 1})
    assert _audit_texts(store) == []  # refused: nothing recorded
    await vault.record_use(
        "service:crm", purpose="egress sb-1: connection 3", details={"requests": 4}
    )
    [text_] = _audit_texts(store)
    assert text_.startswith("secret.use service:crm egress sb-1: connection 3")
    assert text_.endswith('{"requests":4}')
    assert verify(store, audit.signer.trusted_keys()).ok


async def test_changes_count_puts_and_deletes_of_each_name_and_nothing_else(
    settings: Settings, store: Store, audit: AuditLog
) -> None:
    """What a holder of a revealed value asks before each use (egress held credentials)."""
    vault = Vault.open(settings, store, audit)
    assert vault.changes("crm_token") == 0
    await vault.put("crm_token", VALUE, actor="user:admin")
    await vault.reveal("crm_token", purpose="inject into crm-api")
    await vault.metadata("crm_token")
    await vault.put("other", "x", actor="user:admin")
    assert (vault.changes("crm_token"), vault.changes("other")) == (1, 1)  # reads: no change
    await vault.put("crm_token", VALUE + "2", actor="user:admin")
    assert vault.changes("crm_token") == 2
    await vault.rotate_master_key(actor="user:admin")  # the values stay what they were
    assert vault.changes("crm_token") == 2
    await vault.delete("crm_token", actor="user:admin")
    assert (vault.changes("crm_token"), vault.changes("other")) == (3, 1)
    with pytest.raises(SecretValueError):
        await vault.put("other", "", actor="user:admin")  # refused before the store: no change
    assert vault.changes("other") == 1


async def test_only_ciphertext_reaches_the_database(
    settings: Settings, store: Store, audit: AuditLog, request: pytest.FixtureRequest
) -> None:
    vault = Vault.open(settings, store, audit)
    await vault.put("crm_token", VALUE, actor="user:admin")
    await vault.reveal("crm_token", purpose="test")
    needle = VALUE.encode()
    with store.engine.connect() as conn:
        cells = conn.execute(text("SELECT * FROM secrets")).one()
    assert all(needle not in (c if isinstance(c, bytes) else str(c).encode()) for c in cells)
    if store.dialect == "sqlite":
        # The database, its WAL and every key file of the installation.
        files = [p for p in settings.home.parent.rglob("*") if p.is_file()]
        assert {"aamp.db", "aamp.db-wal"} <= {p.name for p in files}
    else:
        pg = request.getfixturevalue("postgres_server")
        with store.engine.connect() as conn:
            conn.execute(text("CHECKPOINT"))
        files = [p for p in Path(pg.datadir).rglob("*") if p.is_file()]
        files += [p for p in settings.home.rglob("*") if p.is_file()]
    assert len(files) > 3
    leaked = [p for p in files if needle in _read_if_still_there(p)]
    assert leaked == []


async def test_wrong_master_key_is_a_clear_error(
    settings: Settings, store: Store, audit: AuditLog
) -> None:
    await Vault.open(settings, store, audit).put("crm_token", VALUE, actor="user:a")
    other = base64.b64encode(os.urandom(32)).decode()
    with pytest.raises(VaultKeyError, match="wrong master key") as info:
        Vault.open(_with_env(settings, AAMP_MASTER_KEY=other), store, audit)
    assert "AAMP_MASTER_KEY" in str(info.value)
    with pytest.raises(MasterKeyError, match=r"AAMP_MASTER_KEY.*base64"):
        Vault.open(_with_env(settings, AAMP_MASTER_KEY="not base64!!"), store, audit)
    with pytest.raises(MasterKeyError, match="32 bytes"):
        Vault.open(
            _with_env(settings, AAMP_MASTER_KEY=base64.b64encode(b"short").decode()), store, audit
        )


async def test_master_key_file_is_private(
    settings: Settings, store: Store, audit: AuditLog
) -> None:
    Vault.open(settings, store, audit)
    path = settings.home / "vault-master.key"
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)
    with pytest.raises(MasterKeyError, match="chmod 600"):
        Vault.open(settings, store, audit)


async def test_env_master_key_is_used(settings: Settings, store: Store, audit: AuditLog) -> None:
    key = MasterKey.generate()
    env_settings = _with_env(settings, AAMP_MASTER_KEY=key.to_base64())
    vault = Vault.open(env_settings, store, audit)
    assert vault.master_key_id == key.key_id
    await vault.put("a", VALUE, actor="user:a")
    assert not (settings.home / "vault-master.key").exists()


async def test_rotation_rewraps_every_data_key(
    settings: Settings, store: Store, audit: AuditLog
) -> None:
    vault = Vault.open(settings, store, audit)
    for i in range(5):
        await vault.put(f"s{i}", f"{VALUE}-{i}", actor="user:a")
    with store.engine.connect() as conn:
        before = dict(conn.execute(text("SELECT name, value_ciphertext FROM secrets")).all())
        wraps = dict(conn.execute(text("SELECT name, wrapped_key FROM secrets")).all())
    old_file = (settings.home / "vault-master.key").read_bytes()
    new = await vault.rotate_master_key(actor="user:admin")
    assert (settings.home / "vault-master.key").read_bytes() != old_file
    assert not (settings.home / "vault-master.key.next").exists()
    with store.engine.connect() as conn:
        after = dict(conn.execute(text("SELECT name, value_ciphertext FROM secrets")).all())
        rewrapped = dict(conn.execute(text("SELECT name, wrapped_key FROM secrets")).all())
        ids = {r[0] for r in conn.execute(text("SELECT master_key_id FROM secrets"))}
    assert after == before
    assert all(rewrapped[n] != wraps[n] for n in wraps)
    assert ids == {new.key_id}
    reopened = Vault.open(settings, store, audit)
    assert reopened.master_key_id == new.key_id
    for i in range(5):
        assert (await reopened.reveal(f"s{i}", purpose="t")).expose() == f"{VALUE}-{i}"
    old_key = MasterKey.from_base64(old_file, source="old")
    with pytest.raises(VaultKeyError):
        Vault.open(_with_env(settings, AAMP_MASTER_KEY=old_key.to_base64()), store, audit)


async def test_rotation_interrupted_after_commit_is_finished_on_open(
    settings: Settings, store: Store, audit: AuditLog
) -> None:
    vault = Vault.open(settings, store, audit)
    await vault.put("s1", VALUE, actor="user:a")
    new = MasterKey.generate()
    staged = settings.home / "vault-master.key.next"
    staged.write_bytes((new.to_base64() + "\n").encode())
    staged.chmod(0o600)
    await store.run(vault._rewrap_all, new)  # crash here: DB rotated, key file not yet
    reopened = Vault.open(settings, store, audit)
    assert reopened.master_key_id == new.key_id
    assert not staged.exists()
    assert (await reopened.reveal("s1", purpose="t")).expose() == VALUE


async def test_rotation_with_env_key_returns_the_new_key(
    settings: Settings, store: Store, audit: AuditLog
) -> None:
    env_settings = _with_env(settings, AAMP_MASTER_KEY=MasterKey.generate().to_base64())
    vault = Vault.open(env_settings, store, audit)
    await vault.put("s1", VALUE, actor="user:a")
    new = await vault.rotate_master_key(actor="user:admin")
    again = Vault.open(_with_env(settings, AAMP_MASTER_KEY=new.to_base64()), store, audit)
    assert (await again.reveal("s1", purpose="t")).expose() == VALUE


async def test_tampered_ciphertext_is_detected(
    settings: Settings, store: Store, audit: AuditLog
) -> None:
    vault = Vault.open(settings, store, audit)
    await vault.put("crm_token", VALUE, actor="user:a")
    with store.engine.connect() as conn:
        ct = conn.execute(text("SELECT value_ciphertext FROM secrets")).scalar_one()
    flipped = bytes([ct[0] ^ 1]) + ct[1:]
    with store.write_connection() as conn:
        conn.execute(text("UPDATE secrets SET value_ciphertext = :c"), {"c": flipped})
    with pytest.raises(SecretIntegrityError, match="'crm_token'") as info:
        await vault.reveal("crm_token", purpose="t")
    assert VALUE not in str(info.value)


async def test_a_row_copied_under_another_name_is_detected(
    settings: Settings, store: Store, audit: AuditLog
) -> None:
    vault = Vault.open(settings, store, audit)
    await vault.put("crm_token", VALUE, actor="user:a")
    await vault.put("harmless", "nothing", actor="user:a")
    with store.write_connection() as conn:
        conn.execute(text("DELETE FROM secrets WHERE name = 'harmless'"))
        conn.execute(
            text(
                "INSERT INTO secrets SELECT 'harmless', version, value_nonce, value_ciphertext,"
                " key_nonce, wrapped_key, master_key_id, created_at, created_by, updated_at,"
                " updated_by FROM secrets WHERE name = 'crm_token'"
            )
        )
    with pytest.raises(SecretIntegrityError, match="'harmless'"):
        await vault.reveal("harmless", purpose="t")
    assert (await vault.reveal("crm_token", purpose="t")).expose() == VALUE


async def test_reprs_show_no_keys(settings: Settings, store: Store, audit: AuditLog) -> None:
    vault = Vault.open(settings, store, audit)
    key_text = (settings.home / "vault-master.key").read_text().strip()
    assert key_text not in repr(vault)
    assert key_text not in repr(MasterKey.from_base64(key_text, source="x"))


def _read_if_still_there(path: Path) -> bytes:
    """PostgreSQL removes some files (pg_internal.init) while it runs; one gone is no leak."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""
