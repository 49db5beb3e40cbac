"""aamp: an air-gapped control plane for autonomous LLM agents.

`from aamp import Client` (or `AsyncClient`, `ClientError`) is the Python SDK, `aamp.client`,
loaded on first use: `import aamp` alone loads nothing else. This file is also copied into
every guest image (the guest agent's package root), so it imports the standard library only.
"""

__version__ = "0.1.0"

SDK = ("AsyncClient", "Client", "ClientError")
__all__ = ["__version__", *SDK]


def __getattr__(name: str) -> object:
    if name not in SDK:
        raise AttributeError(f"module 'aamp' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module("aamp.client"), name)
    globals()[name] = value  # later lookups skip this function
    return value
