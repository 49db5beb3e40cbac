"""Run under `unshare -n` by test_sandbox_egress.py: what a real guest reaches on this host.

On this private namespace's loopback: a fake control-plane API at the port the installation's
settings say (`AAMP_PORT`), a plain web server on another port, and a granted service's HTTPS
upstream (all `Echo` servers, which say what they were sent and remember it). The sandbox's
policy allows only `cp.test` (a DNS name for 127.0.0.1, no port) and is granted the service
without listing its host in `egress.allow`. From inside the guest, curl tries the API by that
name (plain and CONNECT), the other port, `localhost` (which the guest's NO_PROXY sends to the
guest's own loopback), the service, and the service's host on another port. Prints JSON: each
answer, what the servers saw, and the ledger.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from egress_probe import LedgerForTests, make_ca_and_cert
from service_probe import SEEN, serve_echo, service_manager

from aamp.audit import AuditLog
from aamp.config import Settings
from aamp.egress.rules import EgressRules
from aamp.egress.services import Bearer, Service, ServiceSet
from aamp.sandbox.manager import CreateRequest
from aamp.store import Store
from aamp.vault import Vault

API_PORT, OTHER_PORT = 8711, 8712
# a.test is the service's upstream (its test certificate names a.test and b.test).
HOSTS = {"cp.test": "127.0.0.1", "a.test": "127.0.0.10"}

GUEST = f"""
row() {{ name=$1; shift; out=$("$@" 2>&1); rc=$?
  printf '%s: %s exit=%s\\n' "$name" "$(printf %s "$out" | tr -d '\\n')" "$rc"; }}
code="-sS -o /dev/null -w %{{http_code}}:%{{header_json}}"
row api curl $code http://cp.test:{API_PORT}/v1/health
row api-connect curl -sS -o /dev/null https://cp.test:{API_PORT}/
row other curl -sS http://cp.test:{OTHER_PORT}/
row localhost curl -sS -m 5 http://localhost:{API_PORT}/v1/health
row service curl -sS https://a.test/whoami
row service-host-other-port curl $code http://a.test/
"""


async def probe(settings: Settings, ca_dir: Path, test_ca: Path) -> dict[str, object]:
    store = Store.open(settings)
    ledger = LedgerForTests()
    out: dict[str, object] = {}
    async with AuditLog.open(settings, store) as audit:
        vault = Vault.open(settings, store, audit)
        await vault.put("crm_token", "sk-probe-token", actor="user:admin")
        # No `listeners=`: the manager takes the installation's own from its settings.
        manager = service_manager(settings, vault, ca_dir, test_ca, HOSTS, sink=ledger)
        await manager.start()
        try:
            request = CreateRequest(
                image="base",
                egress=EgressRules.from_lists("block", allow=["cp.test"]),
                services=ServiceSet([Service("crm", "https://a.test", Bearer("crm_token"))]),
            )
            sb = await manager.create(request)
            async with manager.use(sb.id) as channel:
                _, stdout, stderr = await channel.run(["sh", "-c", GUEST], timeout=120)
                out["guest"] = (stdout + stderr).decode(errors="replace")
        finally:
            await manager.shutdown()
    store.close()
    out["ledger"] = ledger.events
    return out


def main() -> None:
    env = json.loads(sys.argv[1])
    ca_dir = Path(sys.argv[2])
    settings = Settings.from_env({**env, "AAMP_PORT": str(API_PORT)})
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        test_ca, cert, key = make_ca_and_cert(Path(tmp))
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
        serve_echo("127.0.0.1", API_PORT)
        serve_echo("127.0.0.1", OTHER_PORT)
        serve_echo("127.0.0.10", 443, tls)
        serve_echo("127.0.0.10", 80)
        report = asyncio.run(probe(settings, ca_dir, test_ca))
    report["seen"] = sorted(s["host-served"] for s in SEEN)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
