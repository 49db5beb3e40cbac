"""Egress proxy figures: throughput and added latency, proxy vs direct, in the same run.

Three processes, so the proxy does not share an interpreter with either end: a loopback
upstream HTTP server (127.0.0.10, plain HTTP and HTTPS ports), the `EgressProxy` on a Unix
socket (on uvloop, as `aamp up` runs it), and this client. The proxy records its ledger as
`aamp up` does: audit records (`AuditEgressSink`), durable in the installation's audit log
(SQLite) before they count; `--ledger file` records to the JSON-lines file instead
(`JsonLinesSink`, far cheaper per event: it is what earlier figures were taken with). Measured:
- a 100 MiB download, direct vs through the proxy (plain HTTP forwarding and a CONNECT
  tunnel), repeated (`--runs`, 15: on a 2-core host the downloads of one mode range from
  under half to over 1.4x their median, and the median of 5 moved by up to a third from one
  run of this benchmark to the next); throughput median and p95;
- 1,000 small requests a mode, each mode on one kept-alive connection opened (and warmed up
  with 50 unmeasured requests) before the first, taken in `--rounds` rounds (10): every round
  gives each mode its share in turn, the order rotating round by round, so a mode and its
  baseline are measured moments apart. Per-request latency median and p95; the added p50 is
  the median over the rounds of a round's p50 minus its baseline's p50 in the same round.
- the same through `floor`, a minimal relay process (splice(2) in blocking threads, no
  parsing, rules or ledger; not a product path) on the proxy's hops: a Unix socket in, a
  loopback TCP connection out. What no userspace relay here gets past, printed beside the
  proxy's modes so their ratios can be read against it;
- the same with TLS interception: `direct-tls` is TLS straight to the upstream's HTTPS port;
  `intercept` goes through the proxy to a service (bearer credential from a real `Vault` on
  SQLite, read and audited once per connection, again only if it changes; TLS terminated
  with the installation CA, re-originated to the upstream verified against its own CA;
  response scrubbed). Its ratio and added p50 are against `direct-tls`.
CPU is counted where it is spent. The proxy process's (all its threads, the audit writer's
included; from /proc schedstat, in ns) per 100 MiB and per small request: each reading waits
until the proxy has gone quiet, so a ledger record committed just after an answer counts to
the mode that caused it, not to the next one measured (a direct mode shows ~0). The client's
(this process's one thread) is given apart, per 100 MiB and per request: what a mode costs
the client (TLS to the proxy, say) is not the proxy's; so is the upstream server's per 100 MiB
(its process, settled like the proxy's). With the client's, it says what a TLS mode's ratio
can reach at all: the proxy decrypts and encrypts every byte where each end does one of the
two (docs/architecture.md, "Speed figures"). On a shared host CPU moves far less
with the load than wall time does; the host's load average at the start and end of the run is
printed (and written) with the figures. Each download of a mode is compared with its
baseline's of the same round (the rounds are interleaved), and the median and p95 of those
ratios are printed with the median and p95 of the proxy CPU per run.

`--compare DIR` runs a second proxy from another source tree (DIR is its `src`, e.g. of a
`git worktree add /tmp/aamp-main main`) and measures every proxied mode through it too, as
`MODE@cmp`, interleaved with the rest: before/after figures from one run, under the same load.

Prints a table and writes benchmarks/results/egress.json. Targets (issue 18, not asserted):
>= 0.8x direct throughput, <= 0.5 ms added p50 per small request; with TLS interception
>= 0.5x direct TLS throughput, <= 1 ms added p50.

    .venv/bin/python benchmarks/egress.py [--runs 15] [--small 1000] [--rounds 10]
        [--ledger audit|file] [--compare DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvloop

UPSTREAM_HOST = "127.0.0.10"
SERVICE_HOST = "svc.bench.test"
MiB = 1024 * 1024
BLOCK = b"x" * MiB


def _upstream_main(port_out, tls_port_out, upstream_ca_dir: str, ready) -> None:
    from aamp.egress.ca import InstallationCA

    # The upstream's certificate comes from a CA of its own (not the proxy's installation CA).
    tls = InstallationCA.load_or_create(Path(upstream_ca_dir)).server_context(SERVICE_HOST)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target = head.split(b" ", 2)[1].decode()
                if target.startswith("/bytes/"):
                    size = int(target.split("/")[2])
                    writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
                    while size:
                        piece = BLOCK[: min(size, MiB)]
                        writer.write(piece)
                        size -= len(piece)
                        await writer.drain()
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(serve, UPSTREAM_HOST, 0)
        tls_server = await asyncio.start_server(serve, UPSTREAM_HOST, 0, ssl=tls)
        port_out.value = server.sockets[0].getsockname()[1]
        tls_port_out.value = tls_server.sockets[0].getsockname()[1]
        ready.set()
        await asyncio.gather(server.serve_forever(), tls_server.serve_forever())

    asyncio.run(main())


def _floor_main(sock_path: str, port: int, ready) -> None:
    """The floor of any relay on this machine, not a product path: a Unix-socket listener
    that connects each client to the upstream's plain port and moves the bytes each way with
    splice(2) in a blocking thread — no parsing, rules, ledger or byte budget. The
    proxy's plain modes take the same hops (a Unix socket in, a loopback TCP connection out,
    a third process on the machine's cores); what they lose against `direct` beyond what
    this loses is the proxy's own."""
    import fcntl
    import queue
    import threading

    def pump(src: socket.socket, dst: socket.socket) -> None:
        pipe_r, pipe_w = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(pipe_w, 1031, MiB)  # F_SETPIPE_SZ
        try:
            while n := os.splice(src.fileno(), pipe_w, MiB):
                while n:
                    n -= os.splice(pipe_r, dst.fileno(), n)
        except OSError:
            pass
        finally:
            os.close(pipe_r)
            os.close(pipe_w)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    # Threads that live as long as the process: the CPU of one that ended would no longer
    # be counted (`_cpu_seconds` reads the live threads' schedstat).
    jobs: queue.Queue[tuple[socket.socket, socket.socket, Callable[[], None]]] = queue.Queue()

    def worker() -> None:
        while True:
            src, dst, done = jobs.get()
            pump(src, dst)
            done()

    def closer(a: socket.socket, b: socket.socket) -> Callable[[], None]:
        """Closes both sockets once both directions have ended."""
        left, lock = [2], threading.Lock()

        def done() -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                a.close()
                b.close()

        return done

    for _ in range(16):
        threading.Thread(target=worker, daemon=True).start()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)
    ready.set()
    while True:
        client, _ = listener.accept()
        upstream = socket.create_connection((UPSTREAM_HOST, port))
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        done = closer(client, upstream)
        jobs.put((client, upstream, done))
        jobs.put((upstream, client, done))


def _proxy_main(
    sock_path: str,
    tls_port: int,
    workdir: str,
    upstream_ca: str,
    ready,
    src: str | None,
    ledger: str,
) -> None:
    if src is not None:  # --compare: this proxy's code comes from another source tree
        sys.path.insert(0, src)
    from aamp.audit import AuditLog
    from aamp.config import Settings
    from aamp.egress.ca import InstallationCA
    from aamp.egress.intercept import upstream_tls_context
    from aamp.egress.ledger import AuditEgressSink, JsonLinesSink
    from aamp.egress.proxy import EgressContext, EgressProxy
    from aamp.egress.resolver import StaticResolver
    from aamp.egress.rules import EgressRules
    from aamp.egress.services import Bearer, Service, ServiceSet, VaultSecretReader
    from aamp.store import Store
    from aamp.vault import Vault

    if src is not None and not sys.modules[EgressProxy.__module__].__file__.startswith(src):
        raise SystemExit(f"--compare: the proxy came from elsewhere than {src}")

    async def main() -> None:
        home = Path(workdir) / "home"
        settings = Settings(home=home, runtime_dir=home / "run", image_dir=home / "images")
        store = Store.open(settings)
        async with AuditLog.open(settings, store) as audit:
            vault = Vault.open(settings, store, audit)
            await vault.put("bench_token", "bench-" + os.urandom(12).hex(), actor="user:bench")
            rules = EgressRules.from_lists("block", allow=["bench.test", SERVICE_HOST])
            # As `aamp up` records a proxy's events (server.py): audit records, durable in the
            # installation's audit log before they count; `--ledger file` is the JSON-lines
            # file of earlier runs, which costs far less per event.
            if ledger == "audit":
                sink = AuditEgressSink(audit)
            else:
                sink = JsonLinesSink(Path(sock_path).with_suffix(".jsonl"))
            service = Service(
                "bench-api", f"https://{SERVICE_HOST}:{tls_port}", Bearer("bench_token")
            )
            proxy = EgressProxy(
                "sb-00000000bench",
                Path(sock_path),
                rules,
                EgressContext(
                    StaticResolver({"bench.test": [UPSTREAM_HOST], SERVICE_HOST: [UPSTREAM_HOST]}),
                    sink,
                    secrets=VaultSecretReader(vault),
                    ca=InstallationCA.load_or_create(home / "ca"),
                    upstream_tls=upstream_tls_context(Path(upstream_ca) / "ca.crt"),
                ),
                services=ServiceSet([service]),
            )
            await proxy.start()
            # As `aamp up` does (server.py): what start-up built lives as long as the process,
            # out of the cyclic GC's sight, whose collections otherwise walk all of it.
            gc.collect()
            gc.freeze()
            ready.set()
            await asyncio.Event().wait()

    # On the event loop `aamp up` runs its proxies on (server.py); `--compare`'s proxy too, so
    # the two differ only in their code.
    uvloop.run(main())


def _read_head(sock: socket.socket, buf: bytearray) -> tuple[int, bytearray]:
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the response head")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
        if name.strip().lower() == b"transfer-encoding":
            length = -1  # chunked: the caller reads chunks
    return length, bytearray(rest)


def _read_chunked(
    sock: socket.socket, rest: bytearray, scratch: memoryview | None = None
) -> tuple[int, bytearray]:
    """Read a chunked body (a scrubbed service response); (payload bytes, leftover).

    Chunk data beyond what is buffered goes straight into `scratch` (as `_read_body` does for
    a Content-Length body), so the client costs the same per byte in both framings."""
    scratch = scratch if scratch is not None else memoryview(bytearray(4 * MiB))
    buf, total = rest, 0

    def fill(minimum: int) -> None:
        while len(buf) < minimum:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed mid-body")
            buf.extend(chunk)

    while True:
        while (end := buf.find(b"\r\n")) < 0:
            fill(len(buf) + 1)
        size = int(bytes(buf[:end]).split(b";")[0], 16)
        del buf[: end + 2]
        if size == 0:
            fill(2)
            del buf[:2]
            return total, buf
        total += size
        take = min(size, len(buf))
        del buf[:take]
        remaining = size - take
        while remaining:
            n = sock.recv_into(scratch, min(len(scratch), remaining))
            if n == 0:
                raise ConnectionError("closed mid-body")
            remaining -= n
        fill(2)
        del buf[:2]


def _read_body(sock: socket.socket, length: int, rest: bytearray, scratch: memoryview) -> bytearray:
    if length < 0:
        return _read_chunked(sock, rest, scratch)[1]
    got = len(rest)
    leftover = bytearray()
    if got > length:
        leftover = rest[length:]
        got = length
    while got < length:
        n = sock.recv_into(scratch, min(len(scratch), length - got))
        if n == 0:
            raise ConnectionError("closed mid-body")
        got += n
    return leftover


@dataclass(frozen=True)
class Target:
    """Where the client goes: the plain port, or (TLS modes) the HTTPS port, with the CA
    bundles the client trusts for each TLS mode."""

    sock_path: str
    port: int
    tls_port: int
    upstream_ca: str  # direct-tls trusts the upstream's CA
    installation_ca: str  # intercept trusts only the installation CA
    floor_path: str = ""  # the floor relay's socket (`_floor_main`)


def _tls_client(cafile: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _open(mode: str, t: Target) -> socket.socket:
    if mode == "direct":
        sock = socket.create_connection((UPSTREAM_HOST, t.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    if mode == "direct-tls":
        sock = socket.create_connection((UPSTREAM_HOST, t.tls_port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _tls_client(t.upstream_ca).wrap_socket(sock, server_hostname=SERVICE_HOST)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(t.floor_path if mode == "floor" else t.sock_path)
    if mode in ("connect", "intercept"):
        host, port = ("bench.test", t.port) if mode == "connect" else (SERVICE_HOST, t.tls_port)
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        _length, rest = _read_head(sock, bytearray())
        assert not rest
    if mode == "intercept":
        return _tls_client(t.installation_ca).wrap_socket(sock, server_hostname=SERVICE_HOST)
    return sock


def _request(mode: str, t: Target, path: str) -> bytes:
    if mode in ("direct-tls", "intercept"):
        host = f"{SERVICE_HOST}:{t.tls_port}"
    else:
        host = f"bench.test:{t.port}"
    target = f"http://{host}{path}" if mode == "proxy-http" else path
    return f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def download(mode: str, t: Target, size: int) -> float:
    scratch = memoryview(bytearray(4 * MiB))
    sock = _open(mode, t)
    try:
        start = time.perf_counter()
        sock.sendall(_request(mode, t, f"/bytes/{size}"))
        length, rest = _read_head(sock, bytearray())
        if length < 0:
            got, _ = _read_chunked(sock, rest, scratch)
            assert got == size, (got, size)
        else:
            assert length == size
            _read_body(sock, length, rest, scratch)
        elapsed = time.perf_counter() - start
    finally:
        sock.close()
    return size / elapsed / MiB  # MiB/s


class SmallStream:
    """One mode's kept-alive connection for the small requests: opened once and warmed up,
    then used for that mode's share of every round (`requests`)."""

    WARM_UP = 50  # requests before the first measured one, not measured

    def __init__(self, mode: str, t: Target) -> None:
        self._sock = _open(mode, t)
        self._request = _request(mode, t, "/small")
        self._scratch = memoryview(bytearray(65536))
        self._buf = bytearray()
        self.requests(self.WARM_UP)

    def requests(self, count: int) -> list[float]:
        """`count` requests one after another; each one's latency in ms."""
        sock, latencies = self._sock, []
        for _ in range(count):
            start = time.perf_counter()
            sock.sendall(self._request)
            length, rest = _read_head(sock, self._buf)
            self._buf = _read_body(sock, length, rest, self._scratch)
            latencies.append((time.perf_counter() - start) * 1000)
        return latencies

    def close(self) -> None:
        self._sock.close()


MODES = ("direct", "floor", "proxy-http", "connect", "direct-tls", "intercept")
PROXIED = ("proxy-http", "connect", "intercept")
COMPARED = "@cmp"  # the suffix of a mode measured through the --compare proxy


def _baseline(mode: str) -> str:
    """What a mode is compared with: TLS modes with TLS straight to the upstream."""
    return "direct-tls" if mode.removesuffix(COMPARED) in ("direct-tls", "intercept") else "direct"


def _cpu_seconds(pid: int) -> float:
    """CPU seconds the threads of process `pid` have run so far (Linux /proc schedstat, in
    ns: /proc/PID/stat counts in clock ticks, too coarse for a plain download's share)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def _settled_cpu_seconds(pid: int, quiet_s: float = 0.02, limit_s: float = 1.0) -> float:
    """`_cpu_seconds(pid)` once the process has gone quiet (under 2% of a core for `quiet_s`,
    or `limit_s` has passed). The proxy finishes an answered request's ledger record after the
    answer (the audit writer's commit); read at once, that CPU would be counted to whichever
    mode is measured next, a direct baseline's included."""
    deadline = time.monotonic() + limit_s
    before = _cpu_seconds(pid)
    while True:
        time.sleep(quiet_s)
        now = _cpu_seconds(pid)
        if now - before < 0.02 * quiet_s or time.monotonic() >= deadline:
            return now
        before = now


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _start_proxy(ctx, workdir: str, tls_port: int, upstream_ca: str, src: str | None, ledger: str):
    """A proxy process on its own socket, home and installation CA; (process, socket, CA)."""
    os.makedirs(workdir, exist_ok=True)
    ready = ctx.Event()
    sock_path = os.path.join(workdir, "egress.sock")
    proxy = ctx.Process(
        target=_proxy_main,
        args=(sock_path, tls_port, workdir, upstream_ca, ready, src, ledger),
        daemon=True,
    )
    proxy.start()
    if not ready.wait(120):
        raise SystemExit(f"the proxy in {workdir} did not start")
    return proxy, sock_path, os.path.join(workdir, "home", "ca", "ca.crt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument(
        "--rounds",
        type=int,
        default=10,
        help="rounds the small requests are split into, every mode's share in each round",
    )
    parser.add_argument(
        "--ledger",
        choices=["audit", "file"],
        default="audit",
        help="the proxy's ledger: the audit log, as `aamp up` has it (default), or the "
        "JSON-lines file (`JsonLinesSink`)",
    )
    parser.add_argument(
        "--modes",
        default="direct,floor,proxy-http,connect,direct-tls,intercept",
        help="comma-separated subset of the modes (a mode's baseline is added if missing)",
    )
    parser.add_argument(
        "--compare",
        type=Path,
        help="the src directory of another version: its proxy is measured too (MODE@cmp)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "egress.json"
    )
    args = parser.parse_args()
    if args.runs < 1 or args.mib < 1 or args.rounds < 1 or args.small < args.rounds:
        parser.error("--runs, --mib and --rounds must be at least 1, --small at least --rounds")
    if args.compare is not None and not (args.compare / "aamp" / "egress").is_dir():
        parser.error(f"--compare {args.compare}: no aamp/egress package there")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

    ctx = multiprocessing.get_context("spawn")
    port, tls_port = ctx.Value("i", 0), ctx.Value("i", 0)
    up_ready = ctx.Event()
    workdir = tempfile.mkdtemp(prefix="aamp-bench-", dir="/tmp")
    upstream_ca = os.path.join(workdir, "upstream-ca")
    upstream = ctx.Process(
        target=_upstream_main, args=(port, tls_port, upstream_ca, up_ready), daemon=True
    )
    upstream.start()
    up_ready.wait(20)
    floor_path = os.path.join(workdir, "floor.sock")
    floor_ready = ctx.Event()
    floor = ctx.Process(target=_floor_main, args=(floor_path, port.value, floor_ready), daemon=True)
    floor.start()
    floor_ready.wait(20)
    proxies = {"": _start_proxy(ctx, workdir, tls_port.value, upstream_ca, None, args.ledger)}
    if args.compare is not None:
        proxies[COMPARED] = _start_proxy(
            ctx,
            os.path.join(workdir, "compare"),
            tls_port.value,
            upstream_ca,
            str(args.compare.resolve()),
            args.ledger,
        )
    targets = {
        suffix: Target(
            sock_path,
            port.value,
            tls_port.value,
            os.path.join(upstream_ca, "ca.crt"),
            ca_path,
            floor_path,
        )
        for suffix, (_proc, sock_path, ca_path) in proxies.items()
    }
    wanted = {m.strip() for m in args.modes.split(",") if m.strip()}
    unknown = wanted - set(MODES)
    if unknown:
        parser.error(f"unknown mode(s): {', '.join(sorted(unknown))}; known: {', '.join(MODES)}")
    wanted |= {_baseline(m) for m in wanted}
    modes = [m for m in MODES if m in wanted]
    # (label, mode, through which proxy): a compared mode right after its own.
    measured = [
        (mode + suffix, mode, suffix)
        for mode in modes
        for suffix in proxies
        if not suffix or mode in PROXIED
    ]
    load_before = os.getloadavg()
    try:
        size = args.mib * MiB
        throughput: dict[str, list[float]] = {label: [] for label, _, _ in measured}
        # The proxy's own CPU per run: unlike wall time it hardly moves with the machine's
        # load, so it compares two versions of the proxy on a shared host.
        proxy_cpu: dict[str, list[float]] = {label: [] for label, _, _ in measured}
        # This client's CPU (its one thread) per run, apart from the proxy's: what a mode
        # costs the client (TLS to the proxy, say) is not the proxy's cost.
        client_cpu: dict[str, list[float]] = {label: [] for label, _, _ in measured}
        # The upstream server's too: with the client's, what the ends cost, so a TLS mode's
        # ratio can be read against the crypto each party does (docs/architecture.md).
        upstream_cpu: dict[str, list[float]] = {label: [] for label, _, _ in measured}
        for _ in range(args.runs):  # interleaved, so drift hits every mode alike
            for label, mode, suffix in measured:
                pid = floor.pid if mode == "floor" else proxies[suffix][0].pid
                before = _settled_cpu_seconds(pid)
                upstream_before = _settled_cpu_seconds(upstream.pid)
                client_before = time.thread_time()  # after the readings: not counted to it
                throughput[label].append(download(mode, targets[suffix], size))
                client_cpu[label].append((time.thread_time() - client_before) * 100 / args.mib)
                proxy_cpu[label].append((_settled_cpu_seconds(pid) - before) * 100 / args.mib)
                upstream_cpu[label].append(
                    (_settled_cpu_seconds(upstream.pid) - upstream_before) * 100 / args.mib
                )
        # Small requests in rounds: each mode has one kept-alive connection for the whole
        # phase, and every round gives each mode its share in turn (the order rotating round
        # by round), so a mode and its baseline are measured within moments of each other and
        # the added latency of a round is against its own baseline's.
        per_round = args.small // args.rounds
        latency: dict[str, list[float]] = {label: [] for label, _, _ in measured}
        round_p50: dict[str, list[float]] = {label: [] for label, _, _ in measured}
        proxy_cpu_small = dict.fromkeys(latency, 0.0)
        client_cpu_small = dict.fromkeys(latency, 0.0)
        streams = {label: SmallStream(mode, targets[suffix]) for label, mode, suffix in measured}
        try:
            for n in range(args.rounds):
                for label, mode, suffix in (
                    measured[n % len(measured) :] + measured[: n % len(measured)]
                ):
                    pid = floor.pid if mode == "floor" else proxies[suffix][0].pid
                    before, client_before = _settled_cpu_seconds(pid), time.thread_time()
                    taken = streams[label].requests(per_round)
                    client_cpu_small[label] += time.thread_time() - client_before
                    proxy_cpu_small[label] += _settled_cpu_seconds(pid) - before
                    latency[label] += taken
                    round_p50[label].append(statistics.median(taken))
        finally:
            for stream in streams.values():
                stream.close()
    finally:
        for proc, _sock, _ca in proxies.values():
            proc.terminate()
        upstream.terminate()
        floor.terminate()
        for proc, _sock, _ca in proxies.values():
            proc.join(5)
        upstream.join(5)
        floor.join(5)

    modes = list(throughput)
    direct_tp = {m: statistics.median(throughput[_baseline(m)]) for m in modes}
    # Each run against its baseline's run of the same round.
    ratios = {
        m: [x / base for x, base in zip(throughput[m], throughput[_baseline(m)], strict=True)]
        for m in modes
    }
    direct_p50 = {m: statistics.median(latency[_baseline(m)]) for m in modes}
    # Each round's p50 against its baseline's p50 of the same round.
    added_per_round = {
        m: [x - base for x, base in zip(round_p50[m], round_p50[_baseline(m)], strict=True)]
        for m in modes
    }
    measured_small = args.rounds * per_round
    # The host's 1-minute load average when the run began and ended: on a shared machine the
    # wall-time figures mean little without it (the proxy CPU columns move far less).
    load = {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)}
    result = {
        "load_average_1min": load,
        "download_mib": args.mib,
        "runs": args.runs,
        "small_requests": measured_small,
        "small_rounds": args.rounds,
        "ledger": args.ledger,
        "cpus": os.cpu_count(),
        "compare": str(args.compare) if args.compare is not None else None,
        "throughput_mib_s": {
            mode: {
                "median": statistics.median(v),
                "p95_low": _p95([-x for x in v]) * -1,
                "baseline": _baseline(mode),
                "ratio_to_direct": statistics.median(v) / direct_tp[mode],
                "runs": v,
                "ratio_per_run": {
                    "median": statistics.median(ratios[mode]),
                    "p95_low": -_p95([-r for r in ratios[mode]]),
                    "runs": ratios[mode],
                },
                "proxy_cpu_s_per_100mib": statistics.mean(proxy_cpu[mode]),
                "proxy_cpu_per_run": {
                    "median": statistics.median(proxy_cpu[mode]),
                    "p95": _p95(proxy_cpu[mode]),
                    "runs": proxy_cpu[mode],
                },
                "client_cpu_s_per_100mib": statistics.median(client_cpu[mode]),
                "upstream_cpu_s_per_100mib": statistics.median(upstream_cpu[mode]),
            }
            for mode, v in throughput.items()
        },
        "latency_ms": {
            mode: {
                "p50": statistics.median(v),
                "p95": _p95(v),
                "baseline": _baseline(mode),
                # the median of the rounds' added p50s (each against its own round's baseline)
                "added_p50": statistics.median(added_per_round[mode]),
                "added_p50_per_round": added_per_round[mode],
                "added_p50_pooled": statistics.median(v) - direct_p50[mode],
                # the measured requests' only: the warm-ups before the rounds are not counted
                "proxy_cpu_ms_per_request": proxy_cpu_small[mode] * 1000 / measured_small,
                "client_cpu_ms_per_request": client_cpu_small[mode] * 1000 / measured_small,
            }
            for mode, v in latency.items()
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print("load average (1 min): {before:.2f} at the start, {after:.2f} at the end".format(**load))
    print("ratio and added p50 are against direct (plain modes) or direct-tls (TLS modes)")
    if args.compare is not None:
        print(f"MODE{COMPARED}: through a proxy from {args.compare}, interleaved with the rest")
    print(f"{args.mib} MiB download, {args.runs} runs (MiB/s; p95 = 95th percentile slowest)")
    print("ratio: each run against its baseline's run of the same round, median and p95")
    print("proxy CPU: the proxy process's CPU seconds per 100 MiB, per run (median, p95);")
    print("client CPU, upstream CPU: this client's and the upstream server's, per 100 MiB")
    print("(median); the ledger: " + args.ledger)
    print(
        f"{'mode':<16}{'median':>8}{'p95':>8}{'ratio':>8}{'p95':>7}{'proxy CPU':>11}{'p95':>8}"
        f"{'client CPU':>12}{'upstream CPU':>14}"
    )
    for mode, row in result["throughput_mib_s"].items():
        ratio, cpu = row["ratio_per_run"], row["proxy_cpu_per_run"]
        print(
            f"{mode:<16}{row['median']:>8.0f}{row['p95_low']:>8.0f}"
            f"{ratio['median']:>8.2f}{ratio['p95_low']:>7.2f}"
            f"{cpu['median']:>11.3f}{cpu['p95']:>8.3f}{row['client_cpu_s_per_100mib']:>12.3f}"
            f"{row['upstream_cpu_s_per_100mib']:>14.3f}"
        )
    print(
        f"\n{measured_small} small requests a mode in {args.rounds} rounds, each mode on one"
        " kept-alive connection (ms per request)"
    )
    print("added p50: the median of the rounds' p50 minus their baseline's p50 of the round")
    print(f"{'mode':<16}{'p50':>10}{'p95':>10}{'added p50':>11}{'proxy CPU':>11}{'client CPU':>12}")
    for mode, row in result["latency_ms"].items():
        print(
            f"{mode:<16}{row['p50']:>10.3f}{row['p95']:>10.3f}{row['added_p50']:>11.3f}"
            f"{row['proxy_cpu_ms_per_request']:>11.3f}{row['client_cpu_ms_per_request']:>12.3f}"
        )
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
