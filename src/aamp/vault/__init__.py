"""The secrets vault: AES-GCM envelope encryption at rest, values out only via `reveal`.

See `vault.py` for the API and `envelope.py` for the exact cryptography.
"""

from aamp.vault.envelope import SecretIntegrityError
from aamp.vault.masterkey import (
    MASTER_KEY_ENV,
    MASTER_KEY_FILENAME,
    MasterKey,
    MasterKeyError,
    load_master_key,
)
from aamp.vault.vault import (
    MAX_VALUE_BYTES,
    NAME_RE,
    SecretMetadata,
    SecretNameError,
    SecretNotFound,
    SecretValue,
    SecretValueError,
    Vault,
    VaultError,
    VaultKeyError,
)

__all__ = [
    "MASTER_KEY_ENV",
    "MASTER_KEY_FILENAME",
    "MAX_VALUE_BYTES",
    "NAME_RE",
    "MasterKey",
    "MasterKeyError",
    "SecretIntegrityError",
    "SecretMetadata",
    "SecretNameError",
    "SecretNotFound",
    "SecretValue",
    "SecretValueError",
    "Vault",
    "VaultError",
    "VaultKeyError",
    "load_master_key",
]
