"""The egress proxy's limits: sizes, counts and timeouts, one frozen value per proxy."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProxyLimits:
    """Parsing and timing limits. Header sizes count the whole head including the final CRLF."""

    max_request_line: int = 8 * 1024  # also the longest chunk-size line of a chunked body
    max_head_bytes: int = 32 * 1024  # also the largest trailer block of a chunked body
    max_headers: int = 100  # also the most trailer fields
    header_timeout: float = 10.0  # whole request head, from its first byte (slowloris)
    idle_timeout: float = 120.0  # waiting for a request's first byte; then closed silently
    max_connections: int = 512  # open client connections per sandbox
    connect_timeout: float = 10.0
    response_timeout: float = 60.0  # upstream response head after the request was sent
    chunk_bytes: int = 256 * 1024
    # A chunked request body is read and its framing checked before anything of the request
    # reaches the upstream, up to this many bytes; a longer one goes on in checked pieces.
    # Worst case memory for a guest that fills them all: max_connections x this.
    held_body_bytes: int = 64 * 1024
    # After a refusal the proxy half-closes and reads (and drops) what the client still sends,
    # so the refusal is read before the connection ends (no reset): at most this long/much.
    linger_time: float = 5.0
    linger_bytes: int = 16 * 1024 * 1024
    # SO_SNDBUF of the guest's end (the kernel caps it at net.core.wmem_max and doubles it).
    # The default ~208 KiB makes every large response a stream of short socket writes and
    # wake-ups; 4 MiB roughly halves the proxy's CPU per byte on TLS interception. Worst case
    # kernel memory for a guest that stops reading: max_connections x 2 x this. 0: leave it.
    guest_send_buffer: int = 4 * 1024 * 1024
