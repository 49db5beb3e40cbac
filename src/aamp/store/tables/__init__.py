"""Every table of the control plane, one module per domain, all on `Base.metadata`.

Add a domain by adding a module here (e.g. `identity.py` for users, tokens and grants),
importing it below, and writing an Alembic revision under `aamp/store/migrations/versions/`.
"""

from aamp.store.tables.agents import AgentResourceRow, AgentRow
from aamp.store.tables.audit import AuditCheckpointRow, AuditHeadRow, AuditRecordRow
from aamp.store.tables.base import Base
from aamp.store.tables.catalog import ModelEndpointRow, PolicyRow, ServiceRow
from aamp.store.tables.fleet import HOST_STATES, SANDBOX_STATES, HostRow, SandboxRow
from aamp.store.tables.identity import (
    ApiTokenRow,
    GrantRow,
    LoginFailureRow,
    SessionRow,
    UserRow,
)
from aamp.store.tables.runs import (
    RUN_STATUSES,
    AgentVersionRow,
    RunApprovalRow,
    RunArtifactRow,
    RunEventRow,
    RunInputRow,
    RunRow,
)
from aamp.store.tables.vault import SecretRow

metadata = Base.metadata

__all__ = [
    "HOST_STATES",
    "RUN_STATUSES",
    "SANDBOX_STATES",
    "AgentResourceRow",
    "AgentRow",
    "AgentVersionRow",
    "ApiTokenRow",
    "AuditCheckpointRow",
    "AuditHeadRow",
    "AuditRecordRow",
    "Base",
    "GrantRow",
    "HostRow",
    "LoginFailureRow",
    "ModelEndpointRow",
    "PolicyRow",
    "RunApprovalRow",
    "RunArtifactRow",
    "RunEventRow",
    "RunInputRow",
    "RunRow",
    "SandboxRow",
    "SecretRow",
    "ServiceRow",
    "SessionRow",
    "UserRow",
    "metadata",
]
