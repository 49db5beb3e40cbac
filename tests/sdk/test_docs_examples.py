"""The Python examples of docs/sdk.md and docs/mcp.md, each run as a program against a real
`aamp up` (signed in as the docs say: AAMP_TOKEN with AAMP_PORT), with the `reporter` agent
of the run tests on the scripted model double."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from scripted_model import ScriptedModelServerForTests
from test_cli_runs import WRITE, publish_agent, write_reporter  # tests/runs

DOCS = Path(__file__).resolve().parents[2] / "docs"


def examples(name: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), re.S)


def test_the_docs_have_examples() -> None:
    assert len(examples("sdk.md")) == 3 and len(examples("mcp.md")) == 1


@pytest.mark.parametrize("doc", ["sdk.md", "mcp.md"])
def test_each_example_runs(live, tmp_path, doc) -> None:
    turns = [
        {"tool_calls": [{"name": "python", "arguments": {"code": WRITE}}]},
        {"content": "Counted."},
    ]
    env = {**live.env, "AAMP_TOKEN": live.admin_token, "PYTHONPATH": str(DOCS.parent / "src")}
    with ScriptedModelServerForTests(turns) as model:
        write_reporter(tmp_path)
        publish_agent(live, tmp_path, "reporter", "files-only", model.base_url)
        for code in examples(doc):
            done = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, (code, done.stdout, done.stderr)
            out = done.stdout
            if "6*7" in code:
                assert "42" in out
            if "agents.run" in code:
                assert "succeeded" in out and "n.txt 1 b'8'" in out
            if "gather" in code:
                assert "[b'one\\n', b'two\\n']" in out
            if "print('hello')" in code:
                assert "hello\n2 lines" in out
