"""Run inside the network namespace, with the freshly installed clone's own venv: start
`aamp up`, run a one-shot sandbox, an agent run against the scripted model, and record what
an upgrade must keep. Prints one JSON object (the test reads it); never asserts itself.

    .venv/bin/python offline_scenario.py first|again WORKDIR
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

AGENT = """name: reporter
model: {endpoint: llm, name: scripted}
system_prompt: You write reports.
tools: [python, files]
policy: files-only
limits: {max_steps: 5, wall_time: 2m}
"""
POLICY = """name: files-only
image: base
data:
  inbound: {max_bytes: 1MB, types: [csv]}
  outbound: {max_bytes: 1MB, types: [txt]}
"""
WRITE = "open('/workspace/out/n.txt','w').write(str(len(open('/workspace/in/a.csv').read())))"


def aamp(*words: str, stdin: bytes | None = None) -> dict:
    done = subprocess.run([".venv/bin/aamp", *words], input=stdin, capture_output=True, timeout=900)
    return {"rc": done.returncode, "out": done.stdout.decode(), "err": done.stderr.decode()}


def start_up(work: Path) -> subprocess.Popen:
    log = (work / "up.log").open("ab")
    proc = subprocess.Popen([".venv/bin/aamp", "up"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{os.environ['AAMP_PORT']}/v1/health"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"aamp up exited: {(work / 'up.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    raise SystemExit("aamp up did not answer in 120 s")


def model_server(work: Path) -> tuple[subprocess.Popen, str]:
    script = work / "turns.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "python", "arguments": {"code": WRITE}}]},
                {"content": "Counted."},
            ]
        )
    )
    portfile = work / "model.port"
    portfile.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "tests/agents/scripted_model.py", str(script), str(portfile)]
    )
    while not portfile.exists() or not portfile.read_text():
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{portfile.read_text()}/v1"


def first(work: Path) -> dict:
    out: dict = {"doctor": aamp("doctor")}
    up = start_up(work)
    model, url = model_server(work)
    try:
        out["sandbox"] = aamp(
            "sandbox", "exec", "--image", "base", "--", "python3", "-c", "print(6*7)"
        )
        (work / "agent.yaml").write_text(AGENT)
        (work / "policy.yaml").write_text(POLICY)
        (work / "a.csv").write_bytes(b"x,y\n1,2\n")
        setup = [
            ("user", "add", "alice", "--role", "operator"),
            ("secret", "set", "kept_secret"),
            ("agent", "create", "-f", str(work / "agent.yaml")),
            ("policy", "put", str(work / "policy.yaml")),
            ("model-endpoint", "put", "llm", "--base-url", url, "--models", "scripted"),
            ("grant", "attach", "reporter", "policy", "files-only"),
            ("grant", "attach", "reporter", "image", "base"),
            ("grant", "attach", "reporter", "model-endpoint", "llm"),
            ("agent", "publish", "reporter"),
        ]
        out["setup"] = [
            {"words": list(w), **aamp(*w, stdin=b"s3cret-value" if w[0] == "secret" else None)}
            for w in setup
        ]
        out["run"] = aamp("run", "reporter", "count", "--input", str(work / "a.csv"))
        out.update(state())
    finally:
        model.terminate()
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=120)
    return out


def state() -> dict:
    return {
        "users": aamp("user", "ls"),
        "agents": aamp("agent", "ls"),
        "runs": aamp("run", "ls"),
        "secrets": aamp("secret", "ls"),
        "wheelhouse": aamp("wheelhouse", "ls"),
    }


def again(work: Path) -> dict:
    out: dict = {"doctor": aamp("doctor")}
    up = start_up(work)
    try:
        out.update(state())
        out["sandbox"] = aamp(
            "sandbox", "exec", "--image", "browser", "--", "python3", "-c", "print(6*7)"
        )
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=120)
    out["audit"] = aamp("audit", "verify")
    return out


if __name__ == "__main__":
    which, work = sys.argv[1], Path(sys.argv[2])
    result = first(work) if which == "first" else again(work)
    print("SCENARIO " + json.dumps(result))
