"""Run under `unshare -n` by test_sandbox_egress.py: real upstream web servers on this private
namespace's loopback, a real gVisor sandbox whose policy allows only a.test, and clients
inside the guest (Python urllib, curl, and — for the browser image — chromium). Prints JSON.

Nothing can leave the machine: the namespace has no interface but `lo`.
"""

from __future__ import annotations

import asyncio
import datetime
import http.server
import json
import ssl
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from aamp.config import Settings
from aamp.egress.proxy import EgressContext
from aamp.egress.resolver import StaticResolver
from aamp.egress.rules import EgressRules
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import CreateRequest, SandboxManager

HOSTS = {"a.test": "127.0.0.10", "b.test": "127.0.0.11"}

GUEST_URLLIB = r"""
import json, ssl, urllib.request, urllib.error, socket
out = {}
ctx = ssl.create_default_context(cafile="/workspace/test-ca.pem")
for url in ("http://a.test/hello", "https://a.test/hello", "http://b.test/hello",
            "https://b.test/hello"):
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=20) as r:
            out[url] = {"status": r.status, "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        out[url] = {"status": e.code, "body": e.read().decode(errors="replace"),
                    "rule": e.headers.get("X-Aamp-Egress-Rule")}
    except Exception as e:
        out[url] = {"error": repr(e)}
s = socket.socket(); s.settimeout(3)
try:
    s.connect(("127.0.0.10", 80)); out["direct"] = "connected"
except OSError as e:
    out["direct"] = f"refused: {e}"
print(json.dumps(out))
"""

GUEST_CURL = (
    "curl -sS --cacert /workspace/test-ca.pem -o - -w ' %{http_code}' https://a.test/hello; "
    "echo; curl -sS -o /dev/null -w '%{http_code}' http://b.test/hello; echo; "
    "curl -sS --noproxy '*' -m 3 http://a.test/hello; echo \" exit=$?\""
)

AFTER_CHANGE = (
    "curl -sS -o /dev/null -w '%{http_code}' http://a.test/; printf ' '; "
    "curl -sS -o /dev/null -w '%{http_code}' http://b.test/"
)

GUEST_CHROMIUM = r"""
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    b = p.chromium.launch(executable_path="/usr/bin/chromium",
        proxy={"server": "http://127.0.0.1:3128"},
        args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
              "--disable-background-networking", "--disable-component-update"])
    page = b.new_page(ignore_https_errors=True)
    page.goto("https://a.test/hello")
    print(page.inner_text("body").strip())
    r = page.goto("http://b.test/hello")
    print(r.status)
    b.close()
"""


def make_ca_and_cert(tmp: Path) -> tuple[Path, Path, Path]:
    """A test CA and a certificate for a.test/b.test signed by it."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a.test")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(h) for h in HOSTS]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem, cert_pem, key_pem = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_pem, cert_pem, key_pem


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from {self.headers.get('Host', '?')}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def start_upstreams(cert: Path, key: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    for address in HOSTS.values():
        for port, wrap in ((80, False), (443, True)):
            server = http.server.ThreadingHTTPServer((address, port), Hello)
            if wrap:
                server.socket = tls.wrap_socket(server.socket, server_side=True)
            threading.Thread(target=server.serve_forever, daemon=True).start()


class LedgerForTests:
    def __init__(self) -> None:
        self.events: list[dict[str, object]] = []

    async def record(self, event: object) -> None:
        self.events.append(json.loads(event.to_json()))  # type: ignore[attr-defined]


async def probe(settings: Settings, image: str, ca_pem: Path) -> dict[str, object]:
    ledger = LedgerForTests()
    manager = SandboxManager(
        settings,
        ImageStore(settings),
        {"gvisor": GVisorDriver(settings.runtime_dir)},
        "gvisor",
        egress=EgressContext(StaticResolver({h: [a] for h, a in HOSTS.items()}), ledger),
    )
    await manager.start()
    out: dict[str, object] = {}
    try:
        rules = EgressRules.from_lists("block", allow=["a.test"])
        sb = await manager.create(CreateRequest(image=image, egress=rules))
        async with manager.use(sb.id) as channel:
            ca = ca_pem.read_bytes()
            await channel.put("test-ca.pem", ca, len(ca))
            result, stdout, stderr = await channel.run(["python3", "-c", GUEST_URLLIB], timeout=90)
            out["urllib"] = json.loads(stdout) if result.exit_code == 0 else stderr.decode()
            result, stdout, stderr = await channel.run(["sh", "-c", GUEST_CURL], timeout=90)
            out["curl"] = stdout.decode() + stderr.decode()
            if image == "browser":
                result, stdout, stderr = await channel.run(
                    ["python3", "-c", GUEST_CHROMIUM], timeout=180
                )
                out["chromium"] = stdout.decode() + stderr.decode()[-2000:]
            # Rules change on the live sandbox and apply to the next connection.
            await manager.update_egress(sb.id, EgressRules.from_lists("block", allow=["b.test"]))
            result, stdout, _ = await channel.run(["sh", "-c", AFTER_CHANGE], timeout=60)
            out["after_rule_change"] = stdout.decode()
    finally:
        await manager.shutdown()
    out["ledger"] = ledger.events
    return out


def main() -> None:
    env = json.loads(sys.argv[1])
    image = sys.argv[2]
    settings = Settings.from_env(env)
    with tempfile.TemporaryDirectory() as tmp:
        ca_pem, cert, key = make_ca_and_cert(Path(tmp))
        start_upstreams(cert, key)
        report = asyncio.run(probe(settings, image, ca_pem))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
