"""The catalog: what an admin registers and grants to agents — policies, services, images
(by name), model endpoints — and which of them each agent may use.

- `Catalog` — the store of all of it (`catalog.py`), and `AgentNeeds`, what a sandbox or run
  for an agent would use with what of it is not granted;
- `ModelEndpoint` and its checks (`model_endpoints.py`).
"""

from aamp.catalog.catalog import (
    AgentNeeds,
    Catalog,
    Service,
    StoredPolicy,
    check_upstream,
    parse_policy_document,
)
from aamp.catalog.model_endpoints import ModelEndpoint

__all__ = [
    "AgentNeeds",
    "Catalog",
    "ModelEndpoint",
    "Service",
    "StoredPolicy",
    "check_upstream",
    "parse_policy_document",
]
