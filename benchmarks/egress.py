"""Egress proxy figures: throughput and added latency, proxy vs direct, in the same run.

Three processes, so the proxy does not share an interpreter with either end: a loopback
upstream HTTP server (127.0.0.10), the `EgressProxy` on a Unix socket, and this client.
Measured:
- a 100 MiB download, direct vs through the proxy (plain HTTP forwarding and a CONNECT
  tunnel), repeated; throughput median and p95;
- 1,000 small requests on one kept-alive connection, direct vs through the proxy; per-request
  latency median and p95, and the added p50.
Prints a table and writes benchmarks/results/egress.json. Targets (issue 3, not asserted):
>= 0.8x direct throughput, <= 1 ms added p50 per small request.

    .venv/bin/python benchmarks/egress.py [--runs 5] [--small 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

UPSTREAM_HOST = "127.0.0.10"
MiB = 1024 * 1024
BLOCK = b"x" * MiB


def _upstream_main(port_out, ready) -> None:
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
        port_out.value = server.sockets[0].getsockname()[1]
        ready.set()
        await server.serve_forever()

    asyncio.run(main())


def _proxy_main(sock_path: str, port: int, ready) -> None:
    from aamp.egress import EgressProxy, EgressRules, JsonLinesSink, StaticResolver

    async def main() -> None:
        rules = EgressRules.from_lists("block", allow=["bench.test"])
        sink = JsonLinesSink(Path(sock_path).with_suffix(".jsonl"))
        proxy = EgressProxy(
            "sb-00000000bench",
            Path(sock_path),
            rules,
            StaticResolver({"bench.test": [UPSTREAM_HOST]}),
            sink,
        )
        await proxy.start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


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
    return length, bytearray(rest)


def _read_body(sock: socket.socket, length: int, rest: bytearray, scratch: memoryview) -> bytearray:
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


def _open(mode: str, sock_path: str, port: int) -> socket.socket:
    if mode == "direct":
        sock = socket.create_connection((UPSTREAM_HOST, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sock_path)
    if mode == "connect":
        sock.sendall(
            f"CONNECT bench.test:{port} HTTP/1.1\r\nHost: bench.test:{port}\r\n\r\n".encode()
        )
        _length, rest = _read_head(sock, bytearray())
        assert not rest
    return sock


def _request(mode: str, port: int, path: str) -> bytes:
    target = f"http://bench.test:{port}{path}" if mode == "proxy-http" else path
    return f"GET {target} HTTP/1.1\r\nHost: bench.test:{port}\r\n\r\n".encode()


def download(mode: str, sock_path: str, port: int, size: int) -> float:
    scratch = memoryview(bytearray(4 * MiB))
    sock = _open(mode, sock_path, port)
    try:
        start = time.perf_counter()
        sock.sendall(_request(mode, port, f"/bytes/{size}"))
        length, rest = _read_head(sock, bytearray())
        assert length == size
        _read_body(sock, length, rest, scratch)
        elapsed = time.perf_counter() - start
    finally:
        sock.close()
    return size / elapsed / MiB  # MiB/s


def small_requests(mode: str, sock_path: str, port: int, count: int) -> list[float]:
    scratch = memoryview(bytearray(65536))
    sock = _open(mode, sock_path, port)
    latencies = []
    try:
        request = _request(mode, port, "/small")
        buf = bytearray()
        for _ in range(count + 50):
            start = time.perf_counter()
            sock.sendall(request)
            length, rest = _read_head(sock, buf)
            buf = _read_body(sock, length, rest, scratch)
            latencies.append((time.perf_counter() - start) * 1000)
    finally:
        sock.close()
    return latencies[50:]  # the first 50 warm the path up


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "egress.json"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

    ctx = multiprocessing.get_context("spawn")
    port = ctx.Value("i", 0)
    up_ready, proxy_ready = ctx.Event(), ctx.Event()
    upstream = ctx.Process(target=_upstream_main, args=(port, up_ready), daemon=True)
    upstream.start()
    up_ready.wait(10)
    workdir = tempfile.mkdtemp(prefix="aamp-bench-", dir="/tmp")
    sock_path = os.path.join(workdir, "egress.sock")
    proxy = ctx.Process(target=_proxy_main, args=(sock_path, port.value, proxy_ready), daemon=True)
    proxy.start()
    proxy_ready.wait(10)
    try:
        size = args.mib * MiB
        throughput: dict[str, list[float]] = {"direct": [], "proxy-http": [], "connect": []}
        for _ in range(args.runs):  # interleaved, so drift hits every mode alike
            for mode in throughput:
                throughput[mode].append(download(mode, sock_path, port.value, size))
        latency = {}
        for mode in ("direct", "proxy-http", "connect"):
            latency[mode] = small_requests(mode, sock_path, port.value, args.small)
    finally:
        proxy.terminate()
        upstream.terminate()
        proxy.join(5)
        upstream.join(5)

    direct_tp = statistics.median(throughput["direct"])
    direct_p50 = statistics.median(latency["direct"])
    result = {
        "download_mib": args.mib,
        "runs": args.runs,
        "small_requests": args.small,
        "cpus": os.cpu_count(),
        "throughput_mib_s": {
            mode: {
                "median": statistics.median(v),
                "p95_low": _p95([-x for x in v]) * -1,
                "ratio_to_direct": statistics.median(v) / direct_tp,
            }
            for mode, v in throughput.items()
        },
        "latency_ms": {
            mode: {
                "p50": statistics.median(v),
                "p95": _p95(v),
                "added_p50": statistics.median(v) - direct_p50,
            }
            for mode, v in latency.items()
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print(f"{args.mib} MiB download, {args.runs} runs (MiB/s; p95 = 95th percentile slowest)")
    print(f"{'mode':<12}{'median':>10}{'p95':>10}{'ratio':>8}")
    for mode, row in result["throughput_mib_s"].items():
        print(
            f"{mode:<12}{row['median']:>10.0f}{row['p95_low']:>10.0f}{row['ratio_to_direct']:>8.2f}"
        )
    print(f"\n{args.small} small requests on one kept-alive connection (ms per request)")
    print(f"{'mode':<12}{'p50':>10}{'p95':>10}{'added p50':>11}")
    for mode, row in result["latency_ms"].items():
        print(f"{mode:<12}{row['p50']:>10.3f}{row['p95']:>10.3f}{row['added_p50']:>11.3f}")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
