"""TLS for the egress proxy's intercepted connections: OpenSSL on the socket, under asyncio.

asyncio's own TLS layer (`SSLProtocol`) runs OpenSSL over memory BIOs: every record is read
from the socket into a Python object, copied into the incoming BIO, decrypted out of it in
16 KiB pieces, and each piece handed up through a Python state machine; writes go the same
way back. On an intercepted service download that layer — not the cryptography — was most of
the proxy's CPU (measured: 0.37 s of proxy CPU per 100 MiB through it; OpenSSL reading and
writing the socket itself, as a blocking `ssl.SSLSocket` does, needs about 0.2 s).

`TLSSocketTransport` is an asyncio transport over a non-blocking `ssl.SSLSocket`: OpenSSL
reads records from the descriptor and decrypts them straight into one receive buffer of the
connection's own, as many as are ready (up to `RECEIVE_BYTES`) per wake-up, handed to the
protocol in one `data_received`; a write is one `SSL_write` on the socket (`writelines`: no
more records than one joined write, a large piece's whole records sent from its own memory,
not copied). It is driven by the event loop's readiness callbacks like any socket transport —
no thread, no state outside the connection — so everything above it is unchanged: the same
`StreamReader`/`StreamWriter`, the same parser, decision, scrubbing, byte meter, ledger,
timeouts (they are the streams') and flow control (`pause_reading` / write buffer limits).

OpenSSL may need to write while reading (a TLS 1.3 key update answered) or to read while
writing: `SSLWantWriteError` in a read waits for the socket to be writable before reading on,
`SSLWantReadError` in a write waits for it to be readable before writing on; a write that
OpenSSL began is repeated with the same bytes, as it requires. Renegotiation is refused by
the contexts (`ssl.OP_NO_RENEGOTIATION`). A peer's close_notify, or its end of the TCP stream
without one, is the end of the stream (`eof_received`), as with asyncio's TLS; a record that
does not decrypt is the stream's error (`ssl.SSLError` from the reader). `close` sends
close_notify once what was written has gone out (or gives up and cuts the connection after
`close_timeout` if the peer stops reading), then half-closes and keeps the descriptor until
the peer closes as well (again at most `close_timeout`); `abort` cuts at once, lingering
included (the proxy's `close` aborts every connection: a sandbox's end is not held up).

`tap` hands the next so many bytes read to a callback instead of the protocol, as views of
that receive buffer (the scrubbed relay of a service response body, `forward.py`): the
callback consumes each before returning, and asks for a pause when its sink is full.

The handshake, and the streams put on one of these transports, are `tls_streams.py`'s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import ssl
from collections.abc import Callable
from typing import Any

RECEIVE_BYTES = 256 * 1024  # decrypted bytes gathered per wake-up, into one buffer
TLS_RECORD = 16 * 1024  # OpenSSL writes a record per 16 KiB (TLS's largest plaintext)
_JOIN_BELOW = 2 * TLS_RECORD  # writelines joins pieces up to this much into one write
CLOSE_TIMEOUT = 10.0  # how long `close` waits for buffered bytes to leave before cutting


class TLSSocketTransport(asyncio.Transport):
    """An asyncio transport over a non-blocking, handshaken `ssl.SSLSocket` (see the module)."""

    def __init__(
        self,
        tls: ssl.SSLSocket,
        protocol: asyncio.Protocol,
        context: ssl.SSLContext,
        *,
        close_timeout: float = CLOSE_TIMEOUT,
    ):
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._tls = tls
        self._fd = tls.fileno()
        self._protocol = protocol
        self._context = context
        self._close_timeout = close_timeout
        self._into = memoryview(bytearray(RECEIVE_BYTES))
        self._out: collections.deque[bytes] = collections.deque()
        self._out_size = 0
        self._retry: bytes | None = None  # a write OpenSSL began: repeated with these bytes
        self._low, self._high = 16 * 1024, 64 * 1024
        self._writing_paused = False
        self._reading = True
        self._eof = False
        self._closing = False
        self._closed = False
        self._read_wants_write = False
        self._write_wants_read = False
        self._reader_on = self._writer_on = False
        self._cut: asyncio.TimerHandle | None = None
        self._lingering = False  # closed, the descriptor kept until the peer closes too
        self._tap: Callable[[memoryview], bool] | None = None
        self._tap_left = 0
        self._tapped: asyncio.Future[int] | None = None
        self._joined = bytearray()  # writelines assembles here: no fresh object per write
        self._arm()

    # -- asyncio.Transport -----------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        tls = self._tls
        if name == "ssl_object":
            return tls
        if name == "sslcontext":
            return self._context
        if name == "socket":
            return tls
        if self._closed:
            return default
        with contextlib.suppress(OSError, ValueError):
            if name == "peername":
                return tls.getpeername()
            if name == "sockname":
                return tls.getsockname()
            if name == "peercert":
                return tls.getpeercert()
            if name == "cipher":
                return tls.cipher()
        return default

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing or self._closed

    def is_reading(self) -> bool:
        return self._reading and not self.is_closing()

    def pause_reading(self) -> None:
        self._reading = False
        self._arm()

    def resume_reading(self) -> None:
        if self._reading or self.is_closing():
            return
        self._reading = True
        self._arm()
        with contextlib.suppress(OSError, ValueError):
            if self._tls.pending():  # decrypted bytes OpenSSL holds: no readiness event comes
                self._loop.call_soon(self._on_readable)

    def get_write_buffer_size(self) -> int:
        return self._out_size + (len(self._retry) if self._retry is not None else 0)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._flow()

    def can_write_eof(self) -> bool:
        return False  # TLS has no half-close

    def write_eof(self) -> None:
        raise NotImplementedError("TLS has no half-close")

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.is_closing() or not data:
            return
        if self._retry is not None or self._out or self._write_wants_read:
            self._queue(data)
            return
        self._retry = data if isinstance(data, bytes) else bytes(data)
        self._flush()

    def writelines(self, list_of_data: Any) -> None:
        # As few records as one joined SSL_write would make (each costs the guest a
        # decryption), without copying a large piece: small pieces are joined into the
        # transport's own buffer, topped up to a record boundary from the next large piece,
        # whose whole records then go straight from its memory; its rest starts the next
        # joined write. Only what OpenSSL did not take at once is copied out to wait.
        if self.is_closing():
            return
        if self._retry is not None or self._out or self._write_wants_read:
            self._queue(b"".join(list_of_data))
            return
        joined = self._joined
        joined[:] = b""
        pieces = iter(list_of_data)
        for piece in pieces:
            if len(joined) + len(piece) < _JOIN_BELOW:
                joined += piece
                continue
            view = memoryview(piece)
            head = -len(joined) % TLS_RECORD
            whole = head + (len(view) - head) // TLS_RECORD * TLS_RECORD
            joined += view[:head]
            if joined and not self._send_now(joined):
                self._queue_rest(view[head:], pieces)
                return
            if whole > head and not self._send_now(view[head:whole]):
                self._queue_rest(view[whole:], pieces)
                return
            joined[:] = view[whole:]
        if joined:
            self._send_now(joined)

    def _send_now(self, data: bytes | bytearray | memoryview) -> bool:
        """One SSL_write with nothing waiting before it. False if OpenSSL did not take all of
        `data` (it is repeated later with the same bytes, copied now: `data` may be reused
        memory) or the connection failed."""
        try:
            sent = self._tls.send(data)
        except ssl.SSLWantWriteError:
            sent = 0
        except ssl.SSLWantReadError:
            sent = 0
            self._write_wants_read = True
        except (OSError, ValueError) as exc:
            self._fatal(exc)
            return False
        if sent < len(data):
            # OpenSSL began the write: it is repeated with the same bytes (from the start).
            self._retry = bytes(data) if sent == 0 else bytes(memoryview(data)[sent:])
            self._flow()
            self._arm()
            return False
        return True

    def _queue_rest(self, rest: memoryview, pieces: Any) -> None:
        """What `writelines` had not written yet, after a write that has to wait."""
        if not self._closed:
            self._queue(b"".join([rest, *pieces]))

    def tap(self, length: int, deliver: Callable[[memoryview], bool]) -> asyncio.Future[int]:
        """Hand the next (at most) `length` bytes read to `deliver` instead of the protocol:
        a view of the receive buffer, valid only during the call (no StreamReader, no copy).
        `deliver` returns False when its sink is full: reading pauses and the future ends
        with the bytes still to come; it ends with 0 when all `length` were delivered, and
        with the error if the stream ends or fails first. Only with nothing buffered above."""
        if self._tap is not None:
            raise RuntimeError("already tapped")
        future = self._loop.create_future()
        if self._closed or self._eof:
            future.set_exception(asyncio.IncompleteReadError(b"", length))
            return future
        self._tap, self._tap_left, self._tapped = deliver, length, future
        self._reading = False
        self.resume_reading()
        return future

    def untap(self) -> None:
        """End a tap still on (its waiter was cancelled): reading pauses, nothing more is
        delivered. Nothing happens if the tap already ended."""
        if self._tap is not None:
            self.pause_reading()
            self._untap(asyncio.CancelledError())

    def _untap(self, result: int | BaseException) -> None:
        future = self._tapped
        self._tap, self._tapped = None, None
        if future is not None and not future.done():
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    def close(self) -> None:
        if self.is_closing():
            return
        self._closing = True
        self._reading = False
        if not self.get_write_buffer_size():
            self._finish(None, notify=True)
            return
        self._arm()  # the rest goes out first, within close_timeout
        self._cut = self._loop.call_later(self._close_timeout, self.abort)

    def abort(self) -> None:
        self._finish(None, notify=False)

    # -- readiness -------------------------------------------------------------------------

    def _arm(self) -> None:
        """Register for exactly the readiness events something waits on."""
        if self._closed:
            return
        want_read = self._write_wants_read or (
            self._reading and not self._eof and not self._closing and not self._read_wants_write
        )
        want_write = self._read_wants_write or (
            not self._write_wants_read and self.get_write_buffer_size() > 0
        )
        if want_read != self._reader_on:
            if want_read:
                self._loop.add_reader(self._fd, self._on_readable)
            else:
                self._loop.remove_reader(self._fd)
            self._reader_on = want_read
        if want_write != self._writer_on:
            if want_write:
                self._loop.add_writer(self._fd, self._on_writable)
            else:
                self._loop.remove_writer(self._fd)
            self._writer_on = want_write

    def _on_readable(self) -> None:
        if self._closed:
            return
        if self._write_wants_read:
            self._write_wants_read = False
            self._flush()
            if self._closed:
                return
        if not self._reading or self._eof or self._closing or self._read_wants_write:
            self._arm()
            return
        into, got, ended = self._into, 0, False
        error: BaseException | None = None
        tls = self._tls
        tap = self._tap
        room = len(into) if tap is None else min(len(into), self._tap_left)
        # One record per call: the C method itself, not `SSLSocket.recv_into`, which wraps
        # it in two Python frames (and turns a ragged EOF into 0, done here below).
        read = tls._sslobj.read  # type: ignore[attr-defined]
        try:
            while got < room:
                n = read(room - got, into[got:room])
                if n == 0:
                    ended = True
                    break
                got += n
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLWantWriteError:
            self._read_wants_write = True
        except ssl.SSLEOFError:  # the TCP stream ended without close_notify: the end too
            ended = True
        except (OSError, ValueError) as exc:  # SSLError included: a bad record, an alert
            error = exc
        if got and tap is not None:
            self._tap_left -= got
            try:
                more = tap(into[:got])
            except BaseException as exc:  # the sink's refusal (a cap): the tap's error
                self.pause_reading()
                self._untap(exc)
                return
            if not self._tap_left:
                self._untap(0)
            elif not more:
                self.pause_reading()
                self._untap(self._tap_left)
                return
        elif got:
            self._protocol.data_received(into[:got])  # type: ignore[attr-defined]
        if (error is not None or ended) and self._tap is not None:
            self._untap(error or asyncio.IncompleteReadError(b"", self._tap_left))
        if error is not None:
            self._fatal(error)
            return
        if ended:
            self._eof = True
            self._arm()
            if not self._protocol.eof_received():  # type: ignore[attr-defined]
                self.close()
            return
        if got == room and not self._closed:
            with contextlib.suppress(OSError, ValueError):
                if tls.pending():  # the buffer filled inside a record
                    self._loop.call_soon(self._on_readable)
        self._arm()

    def _on_writable(self) -> None:
        if self._closed:
            return
        if self._read_wants_write:
            self._read_wants_write = False
            self._on_readable()
            if self._closed:
                return
        self._flush()

    # -- writing ---------------------------------------------------------------------------

    def _queue(self, data: bytes | bytearray | memoryview) -> None:
        self._out.append(data if isinstance(data, bytes) else bytes(data))
        self._out_size += len(data)
        self._flow()

    def _flush(self) -> None:
        """Write what is buffered until OpenSSL would block."""
        tls = self._tls
        while True:
            if self._retry is None:
                if not self._out:
                    break
                self._retry = self._out.popleft()
                self._out_size -= len(self._retry)
            try:
                sent = tls.send(self._retry)
            except ssl.SSLWantWriteError:
                break
            except ssl.SSLWantReadError:
                self._write_wants_read = True
                break
            except (OSError, ValueError) as exc:
                self._fatal(exc)
                return
            rest = self._retry[sent:]
            self._retry = rest if rest else None
        self._flow()
        if self._closing and not self.get_write_buffer_size():
            self._finish(None, notify=True)
            return
        self._arm()

    def _flow(self) -> None:
        """Tell the protocol to pause or resume writing as the buffer crosses its limits."""
        size = self.get_write_buffer_size()
        protocol = self._protocol
        if not self._writing_paused and size > self._high:
            self._writing_paused = True
            protocol.pause_writing()
        elif self._writing_paused and size <= self._low:
            self._writing_paused = False
            protocol.resume_writing()

    # -- the end ---------------------------------------------------------------------------

    def _fatal(self, exc: BaseException) -> None:
        self._finish(exc, notify=False)

    def _finish(self, exc: BaseException | None, *, notify: bool) -> None:
        """Close for good. With `notify`: close_notify, then a half-close, and the socket is
        kept (reading and dropping what arrives) until the peer closes too, at most
        `close_timeout`: a peer answering with its own close_notify must not meet a closed
        socket, whose reset could destroy what it has not read yet."""
        if self._closed:
            if not notify and self._lingering:
                self._release()  # abort() cuts a linger short
            return
        self._closed = self._closing = True
        if self._cut is not None:
            self._cut.cancel()
            self._cut = None
        if self._reader_on:
            self._loop.remove_reader(self._fd)
        if self._writer_on:
            self._loop.remove_writer(self._fd)
        self._reader_on = self._writer_on = False
        self._out.clear()
        self._out_size, self._retry = 0, None
        self._untap(exc or ConnectionResetError("the connection was closed"))
        self._loop.call_soon(self._protocol.connection_lost, exc)
        if notify:
            with contextlib.suppress(OSError, ValueError):
                self._tls.unwrap()  # sends close_notify; the peer's is not waited for here
            with contextlib.suppress(OSError, ValueError):
                self._tls.shutdown(socket.SHUT_WR)
                self._lingering = True
                self._loop.add_reader(self._fd, self._drop_until_closed)
                self._cut = self._loop.call_later(self._close_timeout, self._release)
                return
        self._tls.close()

    def _drop_until_closed(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._release()

    def _release(self) -> None:
        if self._lingering:
            self._lingering = False
            self._loop.remove_reader(self._fd)
        if self._cut is not None:
            self._cut.cancel()
            self._cut = None
        self._tls.close()
