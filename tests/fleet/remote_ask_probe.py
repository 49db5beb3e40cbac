"""Run under `unshare -n` by test_remote_ask.py: a control-plane replica (SQLite, its own host
drained) and a real remote sandbox host h1 (`aamp host serve`, its own process), real gVisor.
A run of an agent whose policy says `egress.default: ask` has its sandbox on h1; the guest
asks for three names (resolved on h1 by a DNS server in this namespace to 1.1.1.1, a fake
public host on its loopback): a person (this probe, as the admin, through the API) approves
shop.test, denies nope.test, and leaves late.test unanswered until the run's approval
timeout. Nothing leaves the machine. Prints the JSON report last.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "runs"), str(HERE.parent / "agents")]

import dns.message  # noqa: E402
import dns.rrset  # noqa: E402
import httpx  # noqa: E402
from fleet_processes import HostProcess, free_port, write_credentials  # noqa: E402
from run_helpers import serve_plane  # noqa: E402
from scripted_model import ScriptedModelServerForTests  # noqa: E402

PUBLIC = "1.1.1.1"  # a fake outside host on this namespace's loopback
NAMES = ("shop.test", "nope.test", "late.test")
SEEN: list[str] = []
APPROVAL_TIMEOUT = 8
GUEST = "; ".join(
    f"curl -s -o /dev/null -w '{name} %{{http_code}}\\n' http://{name}/{name}" for name in NAMES
)
TURNS = [
    {"tool_calls": [{"name": "shell", "arguments": {"command": GUEST}}]},
    {"content": "done"},
]


class Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        SEEN.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def dns_server() -> None:
    """Answers A queries for every name with PUBLIC (h1's egress resolver asks it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 53))

    def serve() -> None:
        while True:
            data, peer = sock.recvfrom(4096)
            query = dns.message.from_wire(data)
            reply = dns.message.make_response(query)
            question = query.question[0]
            if question.rdtype == 1:  # A
                reply.answer.append(dns.rrset.from_text(question.name, 60, "IN", "A", PUBLIC))
            sock.sendto(reply.to_wire(), peer)

    threading.Thread(target=serve, daemon=True).start()


async def wait_for(check, timeout: float = 300.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout * 5)):
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError("timed out")


async def person(client: httpx.AsyncClient, run_id: str, seen: list) -> None:
    """Approve shop.test, deny nope.test, leave late.test to its timeout."""
    answered: set[str] = set()
    while True:
        for item in (await client.get("/v1/approvals")).json():
            if item["id"] in answered or item["run_id"] != run_id:
                continue
            answered.add(item["id"])
            seen.append(item["subject"])
            host = item["subject"]["host"]
            if host == "late.test":
                continue
            decision = "approve" if host == "shop.test" else "deny"
            note = {"note": "not for this task"} if decision == "deny" else {}
            got = await client.post(
                f"/v1/approvals/{item['id']}", json={"decision": decision, **note}
            )
            assert got.status_code == 200, got.text
        await asyncio.sleep(0.2)


async def main(settings_json: str) -> dict:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", f"{PUBLIC}/32", "dev", "lo"], check=True)
    server = http.server.ThreadingHTTPServer((PUBLIC, 80), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dns_server()
    given = json.loads(settings_json)
    root = Path(given["AAMP_HOME"]).parent
    home, port = root / "home", free_port()
    fleet = {"AAMP_FLEET_HEARTBEAT_SECONDS": "1", "AAMP_FLEET_LOST_SECONDS": "30"}
    replica = serve_plane(home, given["AAMP_RUNTIME_DIR"], port, AAMP_FLEET_HOST_ID="rep-a",
                          **fleet)  # fmt: skip
    token = (home / "cli-token").read_text().strip()
    base = f"http://127.0.0.1:{port}"
    client = httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {token}"},
                               timeout=120)  # fmt: skip
    report: dict = {}
    h1: HostProcess | None = None
    asking: asyncio.Task[None] | None = None
    try:
        assert (await client.post("/v1/hosts/rep-a/drain")).status_code == 200
        added = (await client.post("/v1/hosts", json={"id": "h1"})).json()
        h1 = HostProcess("h1", write_credentials(root / "creds-h1", added), root / "host-h1",
                         f"/run/aamp-t{secrets.token_hex(4)}", free_port(), base)  # fmt: skip
        h1.start(AAMP_EGRESS_DNS="127.0.0.1")

        async def active() -> bool:
            hosts = (await client.get("/v1/hosts")).json()
            return any(h["id"] == "h1" and h["state"] == "active" for h in hosts)

        await wait_for(active)
        with ScriptedModelServerForTests(TURNS) as model:
            agent = (await client.post("/v1/agents", json={"name": "asks"})).json()["id"]
            policy = {"name": "asks", "image": "base", "egress": {"default": "ask"}}
            assert (await client.put("/v1/policies/asks", json=policy)).status_code == 200
            llm = {"base_url": model.base_url, "models": ["scripted"]}
            assert (await client.put("/v1/model-endpoints/llm", json=llm)).status_code == 200
            for kind, name in (("policy", "asks"), ("image", "base"), ("model-endpoint", "llm")):
                r = await client.post(
                    f"/v1/agents/{agent}/resources", json={"kind": kind, "name": name}
                )
                assert r.status_code == 201, r.text
            definition = {
                "model": {"endpoint": "llm", "name": "scripted"},
                "system_prompt": "test",
                "tools": ["shell"],
                "policy": "asks",
                "limits": {"tool_timeout": "120s", "wall_time": "5m",
                           "approval_timeout": f"{APPROVAL_TIMEOUT}s"},
            }  # fmt: skip
            r = await client.put(f"/v1/agents/{agent}/draft", json=definition)
            assert r.status_code == 200, r.text
            assert (await client.post(f"/v1/agents/{agent}/publish")).status_code == 200
            made = await client.post(f"/v1/agents/{agent}/runs", json={"task": "t"})
            assert made.status_code in (200, 201), made.text
            run_id = made.json()["id"]
            seen: list = []
            asking = asyncio.create_task(person(client, run_id, seen))
            events = (await client.get(f"/v1/runs/{run_id}/events")).text  # until it ends
            run = (await client.get(f"/v1/runs/{run_id}")).json()
        report["run"] = {k: run.get(k) for k in ("status", "reason", "sandbox_id")}
        report["questions"] = seen
        steps: list[tuple[str, dict]] = []
        for block in events.split("\n\n"):
            fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            if "event" in fields and "data" in fields:
                steps.append((fields["event"], json.loads(fields["data"])))
        report["steps"] = [t for t, _ in steps]
        report["decided"] = [
            {k: d.get(k) for k in ("status", "by", "note")}
            for t, d in steps
            if t == "approval.decided"
        ]
        report["tool_output"] = json.dumps([d for t, d in steps if t == "tool.result"])
        report["upstream_saw"] = SEEN
        sandbox_id = run["sandbox_id"]
        records = (
            await client.get("/v1/audit", params={"actor": f"sandbox:{sandbox_id}", "limit": 100})
        ).json()["records"]
        report["egress"] = [
            {k: r[k] for k in ("action", "decision", "reason", "resource")}
            | {"host": r["details"].get("sandbox_host")}
            for r in records
        ]
        report["verify"] = (await client.get("/v1/audit/verify")).json()
    except BaseException:
        print(json.dumps(report, default=str), file=sys.stderr)
        if h1 is not None:
            print(h1.log.read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        if asking is not None:
            asking.cancel()
        if h1 is not None:
            h1.stop()
        await client.aclose()
        replica.kill()
        replica.wait()
    return report


if __name__ == "__main__":
    os.environ.pop("AAMP_DATABASE_URL", None)
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
