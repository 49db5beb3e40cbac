"""The tamper-evident audit log: append-only, hash-chained, durably written, signed checkpoints.

Public surface:

- `AuditSink` — the interface every other part records through (`await sink.record(...)`).
- `AuditLog` — the implementation (group-committed single writer; see `log.py`), and its
  `Batching` (records a commit, how often it signs).
- `verify(store, keys, witness=...)` / `export(store, out, since=...)` /
  `verify_export(path, keys, witness=...)`.
- `WitnessFile` / `WitnessReader` — the signed heads kept outside the database (`witness.py`).
- `canonical` — the exact encoding that is hashed (the spec, in its docstring).
"""

from aamp.audit.chain import Problem, VerifyReport
from aamp.audit.export import ExportFormatError, export, verify_export
from aamp.audit.log import AuditClosed, AuditLog, AuditWriteError, Batching
from aamp.audit.record import (
    RECORD_COLUMNS,
    AuditInputError,
    AuditRecord,
    AuditSink,
    Decision,
    EventFields,
    ShownRecord,
    recordable,
)
from aamp.audit.signing import SIGNING_KEY_FILENAME, CheckpointSigner
from aamp.audit.verify import verify, verify_installation
from aamp.audit.witness import WITNESS_FILENAME, WitnessFile, WitnessReader

__all__ = [
    "RECORD_COLUMNS",
    "SIGNING_KEY_FILENAME",
    "WITNESS_FILENAME",
    "AuditClosed",
    "AuditInputError",
    "AuditLog",
    "AuditRecord",
    "AuditSink",
    "AuditWriteError",
    "Batching",
    "CheckpointSigner",
    "Decision",
    "EventFields",
    "ExportFormatError",
    "Problem",
    "ShownRecord",
    "VerifyReport",
    "WitnessFile",
    "WitnessReader",
    "export",
    "recordable",
    "verify",
    "verify_export",
    "verify_installation",
]
