"""The secrets table: envelope-encrypted values, never plaintext (see `aamp.vault`).

Each row holds the value encrypted under its own random data key (`value_nonce`,
`value_ciphertext`), that data key wrapped by the master key (`key_nonce`, `wrapped_key`), and
the id of the master key that wrapped it, so a wrong master key is named, not guessed at.
"""

from __future__ import annotations

from sqlalchemy import Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from aamp.store.tables.base import Base


class SecretRow(Base):
    __tablename__ = "secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    value_nonce: Mapped[bytes] = mapped_column(LargeBinary)
    value_ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    key_nonce: Mapped[bytes] = mapped_column(LargeBinary)
    wrapped_key: Mapped[bytes] = mapped_column(LargeBinary)
    master_key_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[str] = mapped_column(String(32))
    created_by: Mapped[str] = mapped_column(String(256))
    updated_at: Mapped[str] = mapped_column(String(32))
    updated_by: Mapped[str] = mapped_column(String(256))
