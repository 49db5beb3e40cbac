"""What the channel raises about the guest: one exception per way a request can end badly.

Whatever the guest does, the host gets one of these, and only the connection concerned is
dropped. `PathEscapeError`, the refusal of a path before anything is sent, is the workspace
rule's (`workspace.py`).
"""

from __future__ import annotations


class ChannelError(Exception):
    """Base class of everything the channel raises about the guest."""


class GuestError(ChannelError):
    """The guest agent refused or failed the request and said why."""

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code


class FileTooLargeError(ChannelError, ValueError):
    """A file over the installation's `max_file_bytes`; nothing was transferred."""


class GuestProtocolError(ChannelError):
    """The guest sent something malformed or out of place; its connection was dropped."""


class GuestTimeout(ChannelError, TimeoutError):
    """The guest did not answer within the timeout; its connection was dropped."""


class GuestUnavailable(ChannelError):
    """No guest agent connection (not up yet, gone, or hung up mid-request)."""
