"""Where the guest agent dials the host: ``unix:/path`` (gVisor) or ``vsock:CID:PORT``
(Firecracker), for the channel and for the egress proxy alike."""

from __future__ import annotations

import socket

TYPE_CHECKING = False  # typing is not imported at run time (see `aamp.guest.agent`)
if TYPE_CHECKING:
    from typing import Any

CONNECT_TIMEOUT = 5.0


class Endpoint:
    __slots__ = ("address", "family", "text")

    def __init__(self, family: int, address: Any, text: str) -> None:
        self.family, self.address, self.text = family, address, text


def parse_endpoint(text: str) -> Endpoint:
    """``unix:/path`` or ``vsock:CID:PORT``."""
    kind, _, rest = text.partition(":")
    if kind == "unix" and rest.startswith("/"):
        return Endpoint(socket.AF_UNIX, rest, text)
    if kind == "vsock":
        cid, _, port = rest.partition(":")
        if cid.isdigit() and port.isdigit():
            family = getattr(socket, "AF_VSOCK", None)
            if family is None:
                raise ValueError("this Python has no AF_VSOCK support")
            return Endpoint(family, (int(cid), int(port)), text)
    raise ValueError(f"--connect must be unix:/absolute/path or vsock:CID:PORT, got {text!r}")
