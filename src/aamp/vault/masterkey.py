"""The vault master key: AES-256, from AAMP_MASTER_KEY (base64) or a 0600 file in $AAMP_HOME.

The key is named by a key id (a hash of the key, safe to show and store) so that a database
sealed under another key is reported as such, not as a mysterious decryption failure.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from aamp.config import Settings
from aamp.store.keyfiles import KeyFileError, read_or_create_key_file

MASTER_KEY_ENV = "AAMP_MASTER_KEY"
MASTER_KEY_FILENAME = "vault-master.key"
KEY_BYTES = 32


class MasterKeyError(ValueError):
    """The master key cannot be used; the message names where it came from (never the key)."""


@dataclass(frozen=True)
class MasterKey:
    """32 key bytes and where they came from; `repr` shows only the key id and source."""

    key: bytes = field(repr=False)
    source: str = "generated"
    path: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if len(self.key) != KEY_BYTES:
            raise MasterKeyError(f"the master key from {self.source} must be {KEY_BYTES} bytes")

    @property
    def key_id(self) -> str:
        return hashlib.sha256(b"aamp-vault-master-key-id\x00" + self.key).hexdigest()[:32]

    def __repr__(self) -> str:
        return f"MasterKey(key_id={self.key_id}, source={self.source})"

    @classmethod
    def generate(cls) -> MasterKey:
        return cls(os.urandom(KEY_BYTES))

    @classmethod
    def from_base64(cls, text: str | bytes, *, source: str, path: Path | None = None) -> MasterKey:
        try:
            raw = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise MasterKeyError(f"the master key from {source} is not valid base64") from None
        if len(raw) != KEY_BYTES:
            raise MasterKeyError(
                f"the master key from {source} must decode to {KEY_BYTES} bytes (AES-256), "
                f"got {len(raw)}"
            )
        return cls(raw, source, path)

    def to_base64(self) -> str:
        return base64.b64encode(self.key).decode("ascii")


def master_key_path(settings: Settings) -> Path:
    return settings.home / MASTER_KEY_FILENAME


def load_master_key(settings: Settings) -> MasterKey:
    """AAMP_MASTER_KEY if set, else the key file, created with a fresh random key if absent."""
    env = (settings.env.get(MASTER_KEY_ENV) or "").strip()
    if env:
        return MasterKey.from_base64(env, source=MASTER_KEY_ENV)
    path = master_key_path(settings)
    try:
        text = read_or_create_key_file(
            path, lambda: (MasterKey.generate().to_base64() + "\n").encode("ascii")
        )
    except KeyFileError as exc:
        raise MasterKeyError(str(exc)) from None
    return MasterKey.from_base64(text, source=str(path), path=path)
