"""Run under `unshare -n` by test_remote_egress.py: a control-plane replica (SQLite, its own
host drained), a real remote sandbox host h1 (`aamp host serve`, its own process), and a
second host h2 in this process (the real host code, over a real manager) whose outbox this
probe writes to as a hostile host would. Fake upstreams listen on 10.77.0.5, an address put
on this namespace's loopback: nothing leaves the machine.

h1 runs a sandbox whose policy allows 10.77.0.5:8081 and grants the plain-HTTP service crm
(10.77.0.5:8080, bearer crm_token) and the HTTPS service crm-tls (10.77.0.5:8443, the same
secret; its upstream's certificate from a test CA h1 trusts). The replica holds the
installation's egress CA the shared images were built with (copied from where the tests'
images were built); h1 holds none. The guest calls all three and 10.77.0.5:8082 (no rule),
trusting only its image's CA store; then h1's home, runtime directory and log are searched
for the secret's value and for any private key. h2 asks for crm's secret for h1's sandbox and
for its own sandbox, whose policy grants crm-tls only, and for leaf certificates it was not
granted (another host's sandbox, a name that is not its service's, a plain service, its own
sandbox once destroyed). Prints the JSON report last.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import http.server
import ipaddress
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "runs")]

import httpx  # noqa: E402
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402
from fleet_processes import HostProcess, free_port, write_credentials  # noqa: E402
from run_helpers import serve_plane  # noqa: E402

from aamp.config import Settings  # noqa: E402
from aamp.egress.ca import san_for  # noqa: E402
from aamp.egress.ledger import EgressEvent  # noqa: E402
from aamp.egress.rules import EgressRules  # noqa: E402
from aamp.fleet.host_outbox import HostOutbox  # noqa: E402
from aamp.fleet.host_process import HostConfig, SandboxHost  # noqa: E402
from aamp.fleet.host_serve import host_manager  # noqa: E402
from aamp.fleet.link_ca import LinkCA  # noqa: E402
from aamp.fleet.link_egress import LinkEgressView  # noqa: E402
from aamp.fleet.links import HostLinks  # noqa: E402

UPSTREAM = "10.77.0.5"
SECRET = "crm-" + secrets.token_hex(16)
SEEN: list[dict[str, str]] = []


class Echo(http.server.BaseHTTPRequestHandler):
    """Answers with what it was sent (the proxy scrubs the credential from what comes back)."""

    def do_GET(self) -> None:
        seen = {k.lower(): v for k, v in self.headers.items()}
        SEEN.append({**seen, "port": str(self.server.server_address[1])})
        data = json.dumps(
            {"port": self.server.server_address[1], "auth": seen.get("authorization")}
        )
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())

    def log_message(self, *args: object) -> None:
        pass


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )  # fmt: skip


def upstream_tls(root: Path) -> tuple[ssl.SSLContext, Path]:
    """The HTTPS upstream's server context (a certificate for 10.77.0.5 from a test CA) and
    that CA's certificate, which h1 trusts for service upstreams (`SSL_CERT_FILE`)."""
    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "upstream test CA")])

    def signed(builder: x509.CertificateBuilder) -> x509.Certificate:
        return (
            builder.issuer_name(ca_name).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1)).sign(ca_key, hashes.SHA256())
        )  # fmt: skip

    ca = signed(
        x509.CertificateBuilder().subject_name(ca_name).public_key(ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    )  # fmt: skip
    leaf = signed(
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, UPSTREAM)]))
        .public_key(key.public_key())
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address(UPSTREAM))]), critical=False)
    )  # fmt: skip
    ca_pem, chain = root / "upstream-ca.pem", root / "upstream-leaf.pem"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain.write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + _pem_key(key))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(chain)
    return ctx, ca_pem


def upstreams(tls: ssl.SSLContext) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", f"{UPSTREAM}/32", "dev", "lo"], check=True)
    for port in (8080, 8081, 8082, 8443):
        server = http.server.ThreadingHTTPServer((UPSTREAM, port), Echo)
        if port == 8443:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()


def leaf_request(name: str) -> str:
    """A CSR for `name` with a fresh key, as a (hostile) host would send."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .add_extension(x509.SubjectAlternativeName([san_for(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def holding(root: Path, needle: bytes) -> list[str]:
    """Regular files under `root` whose bytes contain `needle`."""
    found = []
    for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(str(path))
        except OSError:
            continue
    return found


async def exec_(client: httpx.AsyncClient, sandbox_id: str, script: str) -> str:
    r = await client.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"argv": ["sh", "-c", script]})
    assert r.status_code == 200, r.text
    lines = [json.loads(line) for line in r.text.splitlines()]
    return b"".join(base64.b64decode(x["data"]) for x in lines if "data" in x).decode()


async def wait_for(check, timeout: float = 300.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout * 5)):
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError("timed out")


async def audit(client: httpx.AsyncClient, **filters: str) -> list[dict]:
    r = await client.get("/v1/audit", params={**filters, "limit": 1000})
    assert r.status_code == 200, r.text
    return r.json()["records"]


def policy(name: str, services: list[str], image: str = "base") -> str:
    return (
        f"name: {name}\nimage: {image}\negress:\n  default: block\n"
        f'  allow: ["{UPSTREAM}:8081"]\nservices: {json.dumps(services)}\n'
    )


async def main(settings_json: str, images_ca: str) -> dict:
    given = json.loads(settings_json)
    root = Path(given["AAMP_HOME"]).parent
    tls, upstream_ca = upstream_tls(root)
    upstreams(tls)
    home, port = root / "home", free_port()
    # The installation's egress CA: the one the shared images were built to trust.
    (home / "ca").mkdir(parents=True, mode=0o700)
    for name in ("ca.key", "ca.crt"):
        shutil.copy2(Path(images_ca) / name, home / "ca" / name)
    runtime = given["AAMP_RUNTIME_DIR"]
    fleet = {"AAMP_FLEET_HEARTBEAT_SECONDS": "1", "AAMP_FLEET_LOST_SECONDS": "30"}
    replica = serve_plane(home, runtime, port, AAMP_FLEET_HOST_ID="rep-a", **fleet)
    token = (home / "cli-token").read_text().strip()
    base = f"http://127.0.0.1:{port}"
    client = httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {token}"},
                               timeout=120)  # fmt: skip
    report: dict = {}
    h1: HostProcess | None = None
    h2_task: asyncio.Task[None] | None = None
    try:
        assert (await client.post("/v1/hosts/rep-a/drain")).status_code == 200
        r = await client.put("/v1/secrets/crm_token", json={"value": SECRET})
        assert r.status_code == 200, r.text
        service = {"upstream": f"http://{UPSTREAM}:8080", "auth": "bearer",
                   "secrets": ["crm_token"]}  # fmt: skip
        assert (await client.put("/v1/services/crm", json=service)).status_code in (200, 201)
        service = {**service, "upstream": f"https://{UPSTREAM}:8443"}
        r = await client.put("/v1/services/crm-tls", json=service)
        assert r.status_code in (200, 201), r.text

        # -- h1: a real `aamp host serve` ------------------------------------------------
        added = (await client.post("/v1/hosts", json={"id": "h1"})).json()
        h1 = HostProcess("h1", write_credentials(root / "creds-h1", added), root / "host-h1",
                         f"/run/aamp-t{secrets.token_hex(4)}", free_port(), base)  # fmt: skip
        h1.start(SSL_CERT_FILE=str(upstream_ca))  # h1's proxy trusts the upstream's CA

        async def active(host_id: str) -> bool:
            hosts = (await client.get("/v1/hosts")).json()
            return any(h["id"] == host_id and h["state"] == "active" for h in hosts)

        await wait_for(lambda: active("h1"))
        r = await client.post(
            "/v1/sandboxes", json={"policy_document": policy("p1", ["crm", "crm-tls"])}
        )
        assert r.status_code == 201, r.text
        s1 = r.json()
        report["s1"], report["s1_host"] = s1["id"], s1["host"]
        report["guest"] = await exec_(
            client,
            s1["id"],
            f"curl -sS http://{UPSTREAM}:8080/whoami; echo;"
            f" curl -sS http://{UPSTREAM}:8081/rule; echo;"
            f" curl -s -o /dev/null -w '%{{http_code}}' http://{UPSTREAM}:8082/none; echo;"
            f" curl -sS https://{UPSTREAM}:8443/tls 2>&1; echo",
        )
        report["upstream_auth"] = {s["port"]: s.get("authorization") for s in SEEN}
        report["secret_is"] = f"Bearer {SECRET}"

        async def recorded() -> bool:
            return len(await audit(client, actor=f"sandbox:{s1['id']}")) >= 4

        await wait_for(recorded, 60)
        report["egress"] = [
            {k: r[k] for k in ("action", "decision", "reason", "resource")}
            | {"host": r["details"].get("sandbox_host"), "service": r["details"]["service"]}
            for r in await audit(client, actor=f"sandbox:{s1['id']}")
        ]
        report["leaves"] = [
            {"actor": r["actor"], "decision": r["decision"], "resource": r["resource"]}
            | {k: r["details"][k] for k in ("sandbox", "name")}
            for r in await audit(client, action="certificate.issued")
        ]
        report["reveals"] = [
            {"actor": r["actor"], "reason": r["reason"]}
            for r in await audit(client, action="secret.reveal")
        ]
        # The search sees what is there: the sandbox's state files and the log naming it.
        report["h1_sandbox_seen"] = [
            bool(
                holding(Path(h1.runtime), s1["id"].encode())
                or list(Path(h1.runtime).rglob(s1["id"]))
            ),
            bool(holding(h1.log, s1["id"].encode())),
        ]
        report["secret_on_h1_disk"] = (
            holding(h1.home, SECRET.encode())
            + holding(Path(h1.runtime), SECRET.encode())
            + holding(h1.log, SECRET.encode())
        )
        # No key rests on h1's disk (its link key is in its credentials directory, apart);
        # it holds the installation's CA certificate it was given, and no CA of its own.
        report["keys_on_h1_disk"] = holding(h1.home, b"PRIVATE KEY") + holding(
            Path(h1.runtime), b"PRIVATE KEY"
        )
        report["h1_own_ca"] = (h1.home / "ca").exists()
        report["h1_given_ca"] = (h1.home / "installation-ca.crt").read_bytes() == (
            home / "ca" / "ca.crt"
        ).read_bytes()

        # -- s1's rules changed over the link, its egress viewed from h1 --------------------
        # As a replica does (`FleetPlacer.update_egress_elsewhere`, `egress_view_elsewhere`),
        # with a client certificate of the installation's link CA; the replica's own path
        # (its row's grant, its audit record) is tested in process (test_hostile_reports).
        links = HostLinks(LinkCA.load_or_create(home / "link-ca"))  # type: ignore[arg-type]
        link = links.client("h1", f"127.0.0.1:{h1.port}")

        async def granted() -> list[str]:
            return ["crm", "crm-tls"]

        view = LinkEgressView(link, s1["id"], granted)
        mark = await view.mark()
        rules = EgressRules.from_lists("block", allow=[f"{UPSTREAM}:8082"])
        await link.update_egress(s1["id"], rules, None, "user:probe")
        report["guest_after_update"] = await exec_(
            client,
            s1["id"],
            f"curl -s -o /dev/null -w '%{{http_code}}' http://{UPSTREAM}:8081/rule; echo;"
            f" curl -sS http://{UPSTREAM}:8082/now; echo;"
            f" curl -sS http://{UPSTREAM}:8080/whoami; echo",
        )
        for _ in range(100):  # a connection's event is handed on as it ends
            events = await view.since(mark)
            if len(events) >= 3:
                break
            await asyncio.sleep(0.1)
        report["view_after_update"] = [
            {"port": e.port, "decision": e.decision, "rule": e.rule, "service": e.service}
            for e in events
        ]
        report["view_nothing_after"] = await view.since(await view.mark())
        await links.close()

        # -- a screenshot of a browser sandbox on h1, through the replica's API --------------
        r = await client.post(
            "/v1/sandboxes", json={"policy_document": policy("p3", [], image="browser")}
        )
        assert r.status_code == 201, r.text
        s3 = r.json()
        report["s3_host"] = s3["host"]
        shots = {}
        for port in (8082, 8081):
            shot = await client.post(
                f"/v1/sandboxes/{s3['id']}/screenshot",
                json={"url": f"http://{UPSTREAM}:{port}/page", "timeout_seconds": 120},
                timeout=400,
            )
            body = shot.json()
            shots[str(port)] = {
                "status": shot.status_code,
                "code": body.get("code"),
                "message": body.get("message"),
                "page_status": body.get("status"),
                "png": body.get("bytes", 0) > 0,
            }
        report["shots"] = shots
        assert (await client.delete(f"/v1/sandboxes/{s3['id']}")).status_code == 204

        # -- h2: a host in this process, asking for what is not its own ---------------------
        added = (await client.post("/v1/hosts", json={"id": "h2"})).json()
        cert_dir = write_credentials(root / "creds-h2", added)
        h2_settings = Settings.from_env({
            "AAMP_HOME": str(root / "host-h2"),
            "AAMP_RUNTIME_DIR": f"/run/aamp-t{secrets.token_hex(4)}",
            "AAMP_IMAGE_DIR": given["AAMP_IMAGE_DIR"],
        })  # fmt: skip
        outbox = HostOutbox()
        h2_port = free_port()
        config = HostConfig("h2", base, added["token"], cert_dir, "127.0.0.1", h2_port,
                            f"127.0.0.1:{h2_port}")  # fmt: skip
        h2 = SandboxHost(config, host_manager(h2_settings, outbox), outbox)
        h2_task = asyncio.create_task(h2.serve())
        await wait_for(lambda: active("h2"))
        assert (await client.post("/v1/hosts/h1/drain")).status_code == 200
        r = await client.post("/v1/sandboxes", json={"policy_document": policy("p2", ["crm-tls"])})
        assert r.status_code == 201, r.text
        s2 = r.json()
        report["s2_host"] = s2["host"]
        report["h2_asks"] = {
            "other_host_sandbox": await outbox.ask(s1["id"], "crm", "crm_token"),
            "not_granted": await outbox.ask(s2["id"], "crm", "crm_token"),
            "no_such_sandbox": await outbox.ask("sb-000000000000", "crm", "crm_token"),
        }
        report["h2_leaves"] = {
            "other_host_sandbox": await outbox.ask_leaf(
                s1["id"], "crm-tls", UPSTREAM, leaf_request(UPSTREAM)
            ),
            "name_not_granted": await outbox.ask_leaf(
                s2["id"], "crm-tls", "bank.example", leaf_request("bank.example")
            ),
            "service_not_granted": await outbox.ask_leaf(
                s2["id"], "crm", UPSTREAM, leaf_request(UPSTREAM)
            ),
        }
        # A record of another host's sandbox is not written as that sandbox's.
        forged = EgressEvent(s1["id"], time.time(), 1, "http", UPSTREAM, 8080, UPSTREAM,
                             "allowed", "forged", "forged", 200, 0, 0, 0.0)  # fmt: skip
        await outbox.record("egress", forged.to_dict())
        report["forged"] = {
            "written": [r for r in await audit(client, actor=f"sandbox:{s1['id']}")
                        if r["reason"] == "forged"],
            "refused": [(r["actor"], r["decision"])
                        for r in await audit(client, action="host.report_refused")],
        }  # fmt: skip
        report["refusals"] = [
            {"actor": r["actor"], "reason": r["reason"], "sandbox": r["details"]["sandbox"]}
            for r in await audit(client, action="secret.refused")
        ]
        for s in (s1, s2):
            assert (await client.delete(f"/v1/sandboxes/{s['id']}")).status_code == 204
        report["h2_leaves"]["destroyed_sandbox"] = await outbox.ask_leaf(
            s2["id"], "crm-tls", UPSTREAM, leaf_request(UPSTREAM)
        )
        report["leaf_refusals"] = [
            {"actor": r["actor"], "decision": r["decision"], "reason": r["reason"]}
            for r in await audit(client, action="certificate.refused")
        ]
        report["secret_on_h1_disk_after"] = holding(h1.home, SECRET.encode()) + holding(
            Path(h1.runtime), SECRET.encode()
        )
        report["uses"] = [
            {"actor": r["actor"], "sandbox": r["details"].get("sandbox")}
            for r in await audit(client, action="secret.use")
        ]
        report["verify"] = (await client.get("/v1/audit/verify")).json()
    except BaseException:
        print(json.dumps(report, default=str), file=sys.stderr)
        if h1 is not None:
            print(h1.log.read_text()[-3000:], file=sys.stderr)
        kept = [r for r in await audit(client)
                if r["action"].split(".")[0] in ("egress", "secret", "certificate")]  # fmt: skip
        print(json.dumps(kept, default=str)[-3000:], file=sys.stderr)
        raise
    finally:
        if h2_task is not None:
            h2_task.cancel()
            await asyncio.gather(h2_task, return_exceptions=True)
        if h1 is not None:
            h1.stop()
        await client.aclose()
        replica.kill()
        replica.wait()
    return report


if __name__ == "__main__":
    os.environ.pop("AAMP_DATABASE_URL", None)
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
