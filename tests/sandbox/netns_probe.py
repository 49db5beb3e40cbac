"""Run under `unshare -n` by test_network_isolation.py: fake "outside" hosts on this private
namespace's loopback, a real gVisor sandbox, and a probe from inside it. Prints JSON.

Nothing here can reach a real outside address: the namespace has no interface but `lo`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading

from aamp.config import Settings
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import CreateRequest, SandboxManager

FAKE_ADDRESSES = ["169.254.169.254", "1.1.1.1", "10.20.30.40", "192.0.2.10"]
TCP_TARGETS = [
    ("127.0.0.1", 8080),  # a service on the host's loopback
    ("192.0.2.10", 80),  # the host's other address
    ("169.254.169.254", 80),  # cloud metadata
    ("1.1.1.1", 53),  # a public DNS server, over TCP
    ("10.20.30.40", 80),  # a private-network host
]

GUEST_PROBE = r"""
import json, socket
targets = %s
out = {"tcp": {}, "interfaces": [n for _, n in socket.if_nameindex()]}
for host, port in targets:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, port)); out["tcp"][f"{host}:{port}"] = "connected"
    except OSError as e:
        out["tcp"][f"{host}:{port}"] = f"refused: {e}"
    finally:
        s.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
try:
    u.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01a\x04test\x00\x00\x01\x00\x01",
             ("1.1.1.1", 53))
    out["udp_dns"] = "answered: " + repr(u.recvfrom(512)[0][:8])
except OSError as e:
    out["udp_dns"] = f"refused: {e}"
for name in ("a.test", "example.com"):
    try:
        out.setdefault("dns", {})[name] = str(socket.getaddrinfo(name, 80)[0][4])
    except OSError as e:
        out.setdefault("dns", {})[name] = f"refused: {e}"
print(json.dumps(out))
""".replace("%s", repr(TCP_TARGETS), 1)


def fake_hosts() -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for addr in FAKE_ADDRESSES:
        subprocess.run(["ip", "addr", "add", f"{addr}/32", "dev", "lo"], check=True)
    for host, port in TCP_TARGETS:
        srv = socket.create_server((host, port))
        threading.Thread(target=_serve_tcp, args=(srv,), daemon=True).start()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("1.1.1.1", 53))
    threading.Thread(target=_serve_udp, args=(udp,), daemon=True).start()


def _serve_tcp(srv: socket.socket) -> None:
    while True:
        conn, _ = srv.accept()
        conn.sendall(b"FAKEHOST\n")
        conn.close()


def _serve_udp(sock: socket.socket) -> None:
    while True:
        data, peer = sock.recvfrom(512)
        sock.sendto(data[:2] + b"\x81\x80", peer)


def control_reachability() -> dict[str, str]:
    """From the namespace's host side every fake host answers: the probe is meaningful."""
    seen = {}
    for host, port in TCP_TARGETS:
        with socket.create_connection((host, port), timeout=2) as s:
            seen[f"{host}:{port}"] = s.recv(16).decode().strip()
    return seen


async def probe_from_guest(settings: Settings) -> dict[str, object]:
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    manager = SandboxManager(settings, ImageStore(settings), drivers, "gvisor")
    await manager.start()
    try:
        sb = await manager.create(CreateRequest(image="base"))
        async with manager.use(sb.id) as channel:
            result, out, err = await channel.run(["python3", "-c", GUEST_PROBE], timeout=60)
        if result.exit_code != 0:
            raise SystemExit(f"guest probe failed: {err.decode(errors='replace')}")
        return json.loads(out)
    finally:
        await manager.shutdown()


def main() -> None:
    settings = Settings.from_env(json.loads(sys.argv[1]))
    fake_hosts()
    control = control_reachability()
    guest = asyncio.run(probe_from_guest(settings))
    print(json.dumps({"control": control, "guest": guest}))


if __name__ == "__main__":
    main()
