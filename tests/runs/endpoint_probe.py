"""Run under `unshare -n` by test_model_endpoint_runs.py: a private network namespace whose
only interface is `lo`, with 169.254.169.254 added to it as a fake metadata host where the
scripted model double listens. A real control plane (gVisor sandboxes) resolves names with a
static map, as the installation's resolver; two agents run through the HTTP API:

- `rebound`: endpoint `http://imds.test:PORT/v1`, registered while `imds.test` resolved to
  127.0.0.1; then the name resolves to 169.254.169.254 (DNS rebinding) — the run's connection
  must be refused, the model never asked;
- `exact`: endpoint `http://169.254.169.254:PORT/v1` — named exactly, so it is reached.

Prints a JSON report. Usage: python endpoint_probe.py SETTINGS_JSON
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
from sqlalchemy import text

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "agents")]

from run_helpers import admin_client  # noqa: E402
from scripted_model import ScriptedModelServerForTests  # noqa: E402

from aamp.api.app import create_app  # noqa: E402
from aamp.config import Settings  # noqa: E402
from aamp.egress.resolver import StaticResolver  # noqa: E402
from aamp.sandbox.gvisor import GVisorDriver  # noqa: E402
from aamp.server import build_control_plane  # noqa: E402

METADATA = "169.254.169.254"


async def _agent(c: httpx.AsyncClient, name: str, base_url: str) -> tuple[str, dict]:
    agent = (await c.post("/v1/agents", json={"name": name})).json()["id"]
    registered = await c.put(f"/v1/model-endpoints/{name}", json={"base_url": base_url})
    assert registered.status_code == 200, registered.text
    for kind, item in (("policy", "p"), ("image", "base"), ("model-endpoint", name)):
        r = await c.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": item})
        assert r.status_code == 201, r.text
    definition = {
        "model": {"endpoint": name, "name": "scripted", "retries": 1},
        "tools": ["shell"],
        "policy": "p",
    }
    assert (await c.put(f"/v1/agents/{agent}/draft", json=definition)).status_code == 200
    assert (await c.post(f"/v1/agents/{agent}/publish")).status_code == 200
    return agent, registered.json()


async def _run(c: httpx.AsyncClient, agent: str) -> dict:
    run_id = (await c.post(f"/v1/agents/{agent}/runs", json={"task": "t"})).json()["id"]
    await c.get(f"/v1/runs/{run_id}/events")  # until run.finished
    return (await c.get(f"/v1/runs/{run_id}")).json()


async def scenario(settings: Settings, model: ScriptedModelServerForTests) -> dict:
    cp, _ = build_control_plane(settings, {"gvisor": GVisorDriver(settings.runtime_dir)})
    cp.manager.resolver = StaticResolver({"imds.test": ["127.0.0.1"]})
    app = create_app(cp)
    token = settings.cli_token_path.read_text().strip()
    report: dict = {}
    async with app.router.lifespan_context(app), admin_client(app, token) as c:
        assert (await c.put("/v1/policies/p", json={"name": "p"})).status_code == 200
        rebound, report["registered"] = await _agent(
            c, "rebound", f"http://imds.test:{model.port}/v1"
        )
        cp.manager.resolver = StaticResolver({"imds.test": [METADATA]})
        report["rebound"] = await _run(c, rebound)
        report["requests_after_rebound"] = len(model.requests)
        exact, _ = await _agent(c, "exact", f"http://{METADATA}:{model.port}/v1")
        report["exact"] = await _run(c, exact)
        report["requests_after_exact"] = len(model.requests)
    with cp.store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT actor, action, resource, decision, reason, details FROM audit_records"
                " WHERE action = 'model.connect' ORDER BY seq"
            )
        ).all()
    cp.store.close()
    report["connects"] = [
        {"actor": a, "resource": r, "decision": d, "reason": why, "details": json.loads(x)}
        for a, _, r, d, why, x in rows
    ]
    return report


def main() -> None:
    env = json.loads(sys.argv[1])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", f"{METADATA}/32", "dev", "lo"], check=True)
    with ScriptedModelServerForTests([{"content": "reached"}], host=METADATA) as model:
        report = asyncio.run(scenario(Settings.from_env(env), model))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
