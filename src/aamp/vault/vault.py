"""`Vault`: named secrets, encrypted at rest, whose values leave only through `reveal`.

Every change and every use is recorded through the `AuditSink` (names, versions, purposes —
never values). Values never appear in a repr, an exception message, a log line, metadata or an
audit record: exceptions name the secret, `SecretValue` hides its contents from `repr`/`str`.

Master-key rotation re-wraps every data key in ONE transaction. When the key lives in the
key file, the new key is first staged durably next to it (`vault-master.key.next`), then the
rows are re-wrapped and committed, then the staged key replaces the old file; `Vault.open`
finishes a rotation that a crash interrupted between the last two steps. With the key given
in AAMP_MASTER_KEY, the caller must put the returned new key there itself.

`changes(name)` is a count, in memory, of the puts and deletes of a secret through this
`Vault`: a holder of a revealed value (an egress connection) asks it before each use, and
reads again — or stops, when the secret is gone — once it moved. Changes made to the table
by another process are not counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select

from aamp.audit.record import AuditSink
from aamp.config import Settings
from aamp.store import Store, locked, locked_or_new, value_of
from aamp.store.keyfiles import read_key_file, replace_key_file
from aamp.store.tables import SecretRow
from aamp.store.timestamps import now
from aamp.values import Shown
from aamp.vault.envelope import Sealed, rewrap, seal, unseal
from aamp.vault.masterkey import MasterKey, MasterKeyError, load_master_key

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")
MAX_VALUE_BYTES = 64 * 1024
STAGED_SUFFIX = ".next"


class VaultError(Exception):
    """Base of the vault's errors; messages name secrets, never values."""


class SecretNameError(VaultError, ValueError):
    pass


class SecretValueError(VaultError, ValueError):
    pass


class SecretNotFound(VaultError, LookupError):
    pass


class VaultKeyError(VaultError):
    """The configured master key is not the one the secrets were sealed with."""


@dataclass(frozen=True)
class SecretMetadata(Shown):
    """Everything about a secret that may be shown: never its value."""

    name: str
    version: int
    created_at: str
    created_by: str
    updated_at: str
    updated_by: str


@dataclass(frozen=True)
class SecretValue:
    """A revealed value. `repr`/`str` never show it; call `expose()` at the point of use."""

    name: str
    version: int
    _value: str = field(repr=False)

    def expose(self) -> str:
        return self._value

    def __str__(self) -> str:
        return f"<secret {self.name} v{self.version}>"


def validate_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        shown = repr(name)[:80] if isinstance(name, str) else type(name).__name__
        raise SecretNameError(
            f"secret name {shown} is invalid: use 1-64 characters, a lowercase letter first, "
            "then lowercase letters, digits or _"
        )
    return name


def _meta(row: SecretRow) -> SecretMetadata:
    return value_of(SecretMetadata, row)


class Vault:
    """Usage::

    vault = Vault.open(settings, store, audit)
    await vault.put("crm_token", "s3cr3t", actor="user:admin")
    meta = await vault.metadata("crm_token")
    value = await vault.reveal("crm_token", purpose="egress credential injection for crm-api")
    header = f"Bearer {value.expose()}"
    """

    def __init__(self, store: Store, master: MasterKey, audit: AuditSink) -> None:
        self._store = store
        self._master = master
        self._audit = audit
        self._changes: dict[str, int] = {}  # puts and deletes through this vault, by name

    def __repr__(self) -> str:
        return f"Vault(master_key_id={self._master.key_id})"

    @property
    def master_key_path(self) -> Path | None:
        """The key file, or None when the master key came from the environment."""
        return self._master.path

    @property
    def master_key_id(self) -> str:
        return self._master.key_id

    @classmethod
    def open(cls, settings: Settings, store: Store, audit: AuditSink) -> Vault:
        """The vault with the installation's master key, checked against the stored secrets."""
        master = load_master_key(settings)
        vault = cls(store, master, audit)
        vault._check_master_key()
        return vault

    def _stored_key_ids(self) -> set[str]:
        with self._store.session() as s:
            return set(s.scalars(select(SecretRow.master_key_id).distinct()))

    def _check_master_key(self) -> None:
        ids = self._stored_key_ids()
        if not ids or ids == {self._master.key_id}:
            return
        path = self._master.path
        staged = path.with_name(path.name + STAGED_SUFFIX) if path else None
        if path is not None and staged is not None and staged.exists():
            candidate = MasterKey.from_base64(read_key_file(staged), source=str(staged), path=path)
            if ids == {candidate.key_id}:
                # A rotation committed but crashed before replacing the key file: finish it.
                replace_key_file(path, read_key_file(staged))
                staged.unlink()
                self._master = MasterKey(candidate.key, str(path), path)
                return
        raise VaultKeyError(
            f"the secrets were sealed with master key {', '.join(sorted(ids))}, but the "
            f"configured master key ({self._master.source}) is {self._master.key_id}: "
            "this is the wrong master key"
        )

    async def put(
        self,
        name: str,
        value: str,
        actor: str,
        *,
        request_id: str | None = None,
        reason: str | None = None,
    ) -> SecretMetadata:
        """Create or replace a secret; the version goes up by one each time."""
        validate_name(name)
        if not isinstance(value, str) or not value:
            raise SecretValueError(f"secret {name!r}: the value must be a non-empty string")
        plaintext = value.encode("utf-8", errors="strict")
        if len(plaintext) > MAX_VALUE_BYTES:
            raise SecretValueError(f"secret {name!r}: the value is over {MAX_VALUE_BYTES} bytes")
        self._check_actor(actor)
        sealed = seal(self._master, name, plaintext)
        try:
            meta = await self._store.run(self._put, name, sealed, actor)
        finally:  # counted even when the outcome is unknown: holders read again, no harm
            self._changed(name)
        await self._record("put", name, meta.version, actor, reason, request_id)
        return meta

    def _put(self, name: str, sealed: Sealed, actor: str) -> SecretMetadata:
        stamp = now()
        with self._store.write_session() as s:
            row = locked_or_new(
                s,
                SecretRow.name,
                name,
                lambda: SecretRow(name=name, version=0, created_at=stamp, created_by=actor),
            )
            row.version += 1
            row.value_nonce = sealed.value_nonce
            row.value_ciphertext = sealed.value_ciphertext
            row.key_nonce = sealed.key_nonce
            row.wrapped_key = sealed.wrapped_key
            row.master_key_id = sealed.master_key_id
            row.updated_at = stamp
            row.updated_by = actor
            s.flush()
            return _meta(row)

    async def metadata(self, name: str) -> SecretMetadata:
        validate_name(name)
        return await self._store.run(self._metadata, name)

    def _metadata(self, name: str) -> SecretMetadata:
        with self._store.session() as s:
            row = s.get(SecretRow, name)
            if row is None:
                raise SecretNotFound(f"no secret named {name!r}")
            return _meta(row)

    async def list(self) -> list[SecretMetadata]:
        return await self._store.run(self._list)

    def _list(self) -> list[SecretMetadata]:
        with self._store.session() as s:
            return [_meta(r) for r in s.scalars(select(SecretRow).order_by(SecretRow.name))]

    async def delete(
        self, name: str, actor: str, *, request_id: str | None = None, reason: str | None = None
    ) -> None:
        validate_name(name)
        self._check_actor(actor)
        try:
            version = await self._store.run(self._delete, name)
        finally:
            self._changed(name)
        await self._record("delete", name, version, actor, reason, request_id)

    def changes(self, name: str) -> int:
        """How often `name` was put or deleted through this vault (see the module doc)."""
        return self._changes.get(name, 0)

    def _changed(self, name: str) -> None:
        self._changes[name] = self._changes.get(name, 0) + 1

    def _delete(self, name: str) -> int:
        with self._store.write_session() as s:
            row = locked(s, SecretRow.name, name)
            if row is None:
                raise SecretNotFound(f"no secret named {name!r}")
            version = row.version
            s.execute(delete(SecretRow).where(SecretRow.name == name))
            return version

    async def reveal(
        self,
        name: str,
        *,
        purpose: str,
        actor: str = "system:egress-proxy",
        request_id: str | None = None,
    ) -> SecretValue:
        """THE ONLY VALUE READER: for the egress proxy's credential injection, nothing else.

        The use is audited (`secret.reveal`, with `purpose`) before the value is returned; if
        the audit record cannot be written, the value is not returned.
        """
        validate_name(name)
        if not isinstance(purpose, str) or not purpose.strip():
            raise VaultError("reveal needs a purpose (what the value is injected into)")
        self._check_actor(actor)
        row_version, plaintext = await self._store.run(self._reveal, name)
        await self._record("reveal", name, row_version, actor, purpose, request_id)
        return SecretValue(name, row_version, plaintext.decode("utf-8"))

    async def _record(
        self,
        action: str,
        name: str,
        version: int,
        actor: str,
        reason: str | None,
        request_id: str | None,
    ) -> None:
        """The audit record of an allowed `secret.ACTION` on one version of one secret."""
        await self._audit.record(
            actor=actor,
            action=f"secret.{action}",
            resource=f"secret:{name}",
            decision="allow",
            reason=reason,
            request_id=request_id,
            details={"version": version},
        )

    async def record_use(
        self,
        resource: str,
        *,
        purpose: str,
        details: dict[str, Any],
        actor: str = "system:egress-proxy",
    ) -> None:
        """Record (`secret.use`) what values revealed for `purpose` were used for, once their
        holder (an egress connection) let go of them; `details` hold counts, never values."""
        if not isinstance(purpose, str) or not purpose.strip():
            raise VaultError("a use record needs the purpose its values were revealed for")
        self._check_actor(actor)
        await self._audit.record(
            actor=actor,
            action="secret.use",
            resource=resource,
            decision="allow",
            reason=purpose,
            details=details,
        )

    def _reveal(self, name: str) -> tuple[int, bytes]:
        with self._store.session() as s:
            row = s.get(SecretRow, name)
            if row is None:
                raise SecretNotFound(f"no secret named {name!r}")
            if row.master_key_id != self._master.key_id:
                raise VaultKeyError(
                    f"secret {name!r} is sealed with master key {row.master_key_id}, not the "
                    f"configured {self._master.key_id}"
                )
            sealed = Sealed(
                row.value_nonce,
                row.value_ciphertext,
                row.key_nonce,
                row.wrapped_key,
                row.master_key_id,
            )
            return row.version, unseal(self._master, name, sealed)

    async def rotate_master_key(
        self, new_key: MasterKey | None = None, *, actor: str, request_id: str | None = None
    ) -> MasterKey:
        """Re-wrap every data key under `new_key` (random if None) in one transaction.

        Returns the new key. Values and their ciphertexts are unchanged.
        """
        self._check_actor(actor)
        new = new_key if new_key is not None else MasterKey.generate()
        if new.key_id == self._master.key_id:
            raise MasterKeyError("the new master key is the current one")
        path = self._master.path
        staged = path.with_name(path.name + STAGED_SUFFIX) if path else None
        if staged is not None:
            replace_key_file(staged, (new.to_base64() + "\n").encode("ascii"))
        count = await self._store.run(self._rewrap_all, new)
        if path is not None and staged is not None:
            replace_key_file(path, read_key_file(staged))
            staged.unlink()
            new = MasterKey(new.key, str(path), path)
        old_id = self._master.key_id
        self._master = new
        await self._audit.record(
            actor=actor,
            action="vault.rotate_master_key",
            resource="vault",
            decision="allow",
            request_id=request_id,
            details={"from_key_id": old_id, "to_key_id": new.key_id, "secrets": count},
        )
        return new

    def _rewrap_all(self, new: MasterKey) -> int:
        with self._store.write_session() as s:
            rows = list(s.scalars(select(SecretRow).order_by(SecretRow.name).with_for_update()))
            for row in rows:
                if row.master_key_id != self._master.key_id:
                    raise VaultKeyError(
                        f"secret {row.name!r} is sealed with master key {row.master_key_id}, "
                        f"not the configured {self._master.key_id}; nothing was rotated"
                    )
                row.key_nonce, row.wrapped_key = rewrap(
                    self._master, new, row.name, row.key_nonce, row.wrapped_key
                )
                row.master_key_id = new.key_id
            return len(rows)

    @staticmethod
    def _check_actor(actor: object) -> None:
        if not isinstance(actor, str) or not actor or len(actor) > 256:
            raise VaultError("actor must be a non-empty string of at most 256 characters")
