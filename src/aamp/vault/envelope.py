"""AES-GCM envelope encryption of one secret value, bound to the secret's name.

value      --AES-256-GCM(data key, nonce1, AAD = "aamp-vault/v1/value\\0" + name)--> ciphertext
data key   --AES-256-GCM(master key, nonce2, AAD = "aamp-vault/v1/data-key\\0" + name)--> wrapped

A fresh random data key and fresh 96-bit nonces per write. Because the name is in both AADs, a
row copied or renamed to another secret's name fails authentication instead of decrypting.
Rotation of the master key only re-wraps the data key; the value ciphertext is untouched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from aamp.vault.masterkey import MasterKey

NONCE_BYTES = 12


class SecretIntegrityError(RuntimeError):
    """A stored secret failed authentication: it was tampered with or moved to another name."""


@dataclass(frozen=True)
class Sealed:
    value_nonce: bytes = field(repr=False)
    value_ciphertext: bytes = field(repr=False)
    key_nonce: bytes = field(repr=False)
    wrapped_key: bytes = field(repr=False)
    master_key_id: str


def _value_aad(name: str) -> bytes:
    return b"aamp-vault/v1/value\x00" + name.encode("ascii")


def _key_aad(name: str) -> bytes:
    return b"aamp-vault/v1/data-key\x00" + name.encode("ascii")


def seal(master: MasterKey, name: str, plaintext: bytes) -> Sealed:
    data_key = AESGCM.generate_key(bit_length=256)
    value_nonce, key_nonce = os.urandom(NONCE_BYTES), os.urandom(NONCE_BYTES)
    return Sealed(
        value_nonce=value_nonce,
        value_ciphertext=AESGCM(data_key).encrypt(value_nonce, plaintext, _value_aad(name)),
        key_nonce=key_nonce,
        wrapped_key=AESGCM(master.key).encrypt(key_nonce, data_key, _key_aad(name)),
        master_key_id=master.key_id,
    )


def unwrap_key(master: MasterKey, name: str, key_nonce: bytes, wrapped_key: bytes) -> bytes:
    try:
        return AESGCM(master.key).decrypt(key_nonce, wrapped_key, _key_aad(name))
    except InvalidTag:
        raise SecretIntegrityError(
            f"secret {name!r}: its data key does not authenticate under the master key "
            "(the row was tampered with or copied from another secret)"
        ) from None


def unseal(master: MasterKey, name: str, sealed: Sealed) -> bytes:
    data_key = unwrap_key(master, name, sealed.key_nonce, sealed.wrapped_key)
    try:
        return AESGCM(data_key).decrypt(
            sealed.value_nonce, sealed.value_ciphertext, _value_aad(name)
        )
    except InvalidTag:
        raise SecretIntegrityError(
            f"secret {name!r}: its ciphertext does not authenticate (tampered with or copied "
            "from another secret)"
        ) from None


def rewrap(
    old: MasterKey, new: MasterKey, name: str, key_nonce: bytes, wrapped_key: bytes
) -> tuple[bytes, bytes]:
    """The same data key, wrapped by `new` under a fresh nonce."""
    data_key = unwrap_key(old, name, key_nonce, wrapped_key)
    nonce = os.urandom(NONCE_BYTES)
    return nonce, AESGCM(new.key).encrypt(nonce, data_key, _key_aad(name))
