"""The HTTP API under /v1 (FastAPI): the only way the CLI and the UI reach the host process."""
