"""The catalog: what an admin registers and grants to agents — policies, services, images
(by name), model endpoints — and which of them each agent may use.

- `Catalog` — the store of all of it (`catalog.py`), and `AgentNeeds`, what a sandbox or run
  for an agent would use with what of it is not granted;
- `ModelEndpoint` and its checks (`model_endpoints.py`);
- `KnowledgeBases` — documents and their versioned, content-hashed indexes, indexed inside
  rag sandboxes (`knowledge_bases.py`).

Names load on first use (`aamp.surface`).
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    catalog: MAX_POLICY_BYTES RESOURCE_KINDS AgentNeeds Catalog Service StoredPolicy check_upstream
        parse_policy_document
    knowledge_bases: DOCUMENT_TYPES MAX_DOCUMENT_BYTES Document KnowledgeBaseError KnowledgeBases
        check_document
    model_endpoints: ENDPOINT_NAME_RE MAX_MODELS MODEL_NAME_RE ModelEndpoint check_base_url
    """,
)
