"""aamp: an air-gapped control plane for autonomous LLM agents."""

__version__ = "0.1.0"
