"""Ed25519 signatures over audit checkpoints, with the host key in $AAMP_HOME.

A checkpoint says "the chain's record `seq` has hash `hash`", signed. It is what makes a
rewrite of the chain *with all hashes recomputed* detectable: the attacker who can write the
database cannot produce the signature without the key file on the host.

Signed message (ASCII): `aamp-audit-checkpoint/1\\n<seq in decimal>\\n<hash in lowercase hex>`.
A key is named by its key id: the first 32 hex digits of SHA-256 over the raw 32-byte public key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from aamp.store.keyfiles import KeyFileError, read_key_file, read_or_create_key_file

SIGNING_KEY_FILENAME = "audit-signing.key"


def checkpoint_message(seq: int, hash_hex: str) -> bytes:
    return f"aamp-audit-checkpoint/1\n{int(seq)}\n{hash_hex}".encode("ascii")


def key_id_of(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:32]


def public_key_hex(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw.hex()


def public_key_from_hex(text: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))


def verify_signature(public_key: Ed25519PublicKey, seq: int, hash_hex: str, sig_hex: str) -> bool:
    try:
        public_key.verify(bytes.fromhex(sig_hex), checkpoint_message(seq, hash_hex))
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class CheckpointSigner:
    """The host's signing key; `repr` never shows it."""

    _private: Ed25519PrivateKey

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self._private.public_key()

    @property
    def key_id(self) -> str:
        return key_id_of(self.public_key)

    def trusted_keys(self) -> dict[str, Ed25519PublicKey]:
        return {self.key_id: self.public_key}

    def sign(self, seq: int, hash_hex: str) -> str:
        return self._private.sign(checkpoint_message(seq, hash_hex)).hex()

    def __repr__(self) -> str:
        return f"CheckpointSigner(key_id={self.key_id})"

    @classmethod
    def generate(cls) -> CheckpointSigner:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: Path) -> CheckpointSigner:
        """The existing key in `path` (for verifying: never creates one)."""
        return cls._parse(path, read_key_file(path))

    @classmethod
    def load_or_create(cls, path: Path) -> CheckpointSigner:
        """The key in `path` (PKCS#8 PEM, 0600), created on first start."""

        def make() -> bytes:
            return Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )

        return cls._parse(path, read_or_create_key_file(path, make))

    @classmethod
    def _parse(cls, path: Path, pem: bytes) -> CheckpointSigner:
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except ValueError:
            raise KeyFileError(f"{path} is not a PEM Ed25519 private key") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"{path} holds a key that is not Ed25519")
        return cls(key)
