"""How the guest agent says something went wrong: `RequestError`, a refusal sent back to the
host with a machine-readable code, and `log`, a line on its stderr (the sandbox's console)."""

from __future__ import annotations

import os
import sys


class RequestError(Exception):
    """A request the agent refuses; `code` is machine-readable, the message is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def log(message: str) -> None:
    try:
        sys.stderr.write(f"aamp-agent[{os.getpid()}]: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
