"""The SDK (`from aamp import Client`, `AsyncClient`) against a real `aamp up` with gVisor:
a sandbox's lifecycle, a streamed exec, files both ways (1 MiB, byte-identical), a sandbox
destroyed on leaving its `with` block — also when the block raises — and an agent run with the
scripted model double: its events (resumed from the last one seen) and its artifacts."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

import pytest
from scripted_model import ScriptedModelServerForTests
from test_cli_runs import WRITE, publish_agent, write_reporter  # tests/runs

from aamp import AsyncClient, Client, ClientError


class Boom(Exception):
    pass


@pytest.fixture
def live(shared_live):
    """One plane for this module's tests (conftest_live.py's `shared_live`)."""
    return shared_live


def test_sandbox_lifecycle_streamed_exec_and_files(live) -> None:
    with Client(live.url, live.admin_token) as client:
        with client.sandboxes.create(image="base", ttl="5m") as sandbox:
            assert sandbox.id.startswith("sb-")
            assert sandbox.id in [s.id for s in client.sandboxes.list()]
            assert 200 < sandbox.refresh()["expires_in"] <= 300

            # Streamed: the first line reaches the callback while the command still runs.
            seen: list[tuple[float, bytes]] = []
            result = sandbox.exec(
                ["sh", "-c", "echo first; sleep 1.5; echo second; echo err >&2; exit 3"],
                on_stdout=lambda data: seen.append((time.monotonic(), data)),
                timeout=30,
            )
            assert (result.exit_code, result.ok, result.timed_out) == (3, False, False)
            assert result.stdout == b"first\nsecond\n" and result.stderr == b"err\n"
            assert b"".join(d for _, d in seen) == result.stdout
            assert seen[0][1] == b"first\n" and seen[-1][0] - seen[0][0] > 1.0

            slow = sandbox.exec(["sleep", "30"], timeout=1)
            assert slow.timed_out and not slow.ok

            # `keep` bounds what the result holds of each stream; the rest is only counted.
            told: list[bytes] = []
            kept = sandbox.exec(
                ["sh", "-c", "head -c 300000 /dev/zero; echo oops >&2"],
                keep=1000,
                on_stdout=told.append,
            )
            assert (kept.stdout, kept.stderr, kept.truncated) == (b"\0" * 1000, b"oops\n", True)
            assert (kept.stdout_size, kept.stderr_size) == (300_000, 5)
            assert sum(map(len, told)) == 300_000  # the callback still saw all of it

            data = os.urandom(1024 * 1024)
            assert sandbox.files.write("in/blob.bin", data) == len(data)
            copied = sandbox.exec(["sh", "-c", "sha256sum in/blob.bin | cut -d' ' -f1"])
            assert copied.stdout.decode().strip() == hashlib.sha256(data).hexdigest()
            failed = sandbox.exec(["python3", "-c", "raise SystemExit(9)"])
            assert (failed.ok, failed.exit_code) == (False, 9)  # a result, not an error
            sandbox.exec(["python3", "-c", "open('out.bin','wb').write(bytes(range(256))*4096)"])
            assert sandbox.files.read("in/blob.bin") == data
            assert sandbox.files.read("out.bin") == bytes(range(256)) * 4096

            with pytest.raises(ClientError) as missing:
                sandbox.files.read("no/such/file")
            assert missing.value.code and missing.value.status >= 400
        assert sandbox.id not in [s.id for s in client.sandboxes.list()]
        with pytest.raises(ClientError) as gone:
            client.sandboxes.get(sandbox.id)
        assert (gone.value.code, gone.value.status) == ("unknown_sandbox", 404)
        assert sandbox.id in gone.value.message


def test_a_sandbox_is_destroyed_when_its_block_raises(live) -> None:
    with Client(live.url, live.admin_token) as client:
        with pytest.raises(Boom), client.sandboxes.create(image="base") as sandbox:
            assert sandbox.exec(["true"]).ok
            raise Boom
        assert sandbox.id not in [s.id for s in client.sandboxes.list()]
        assert not (live.settings.runtime_dir / "sb" / sandbox.id).exists()


def test_refusals_carry_the_apis_code_and_message(live) -> None:
    with Client(live.url, "aamp_not-a-token") as client, pytest.raises(ClientError) as bad:
        client.sandboxes.list()
    assert bad.value.status == 401 and bad.value.code and bad.value.message
    with Client(live.url, live.admin_token) as client:
        with pytest.raises(ClientError) as named:
            client.sandboxes.create(policy="some-policy", ttl=60)
        assert named.value.code == "invalid_request" and "ttl" in named.value.message
        with pytest.raises(ClientError) as unknown:
            client.agents.run("nobody", "a task")
        assert unknown.value.message == "no agent named 'nobody' that you can see"


def test_an_agent_run_with_events_and_artifacts(live, tmp_path) -> None:
    turns = [
        {"tool_calls": [{"name": "python", "arguments": {"code": WRITE}}]},
        {"content": "Counted."},
    ]
    with ScriptedModelServerForTests(turns) as model:
        csv = write_reporter(tmp_path)
        publish_agent(live, tmp_path, "reporter", "files-only", model.base_url)
        with Client(live.url, live.admin_token) as client:
            run = client.agents.run("reporter", "count the bytes", inputs=[str(csv)])
            assert run.id.startswith("run-")
            first = next(iter(run.events()))  # left after one event: resumed below
            rest = list(run.events())
            ids = [first.id] + [e.id for e in rest]
            assert ids == sorted(set(ids)), ids  # nothing lost, nothing repeated
            kinds = [first.type] + [e.type for e in rest]
            assert "tool.call" in kinds and "artifact" in kinds and kinds[-1] == "run.finished"
            assert run.status == "succeeded"
            assert list(run.events()) == []  # it has ended: nothing more to say
            again = list(client.agents.get_run(run.id).events(after=first.id))
            assert [e.id for e in again] == ids[1:]
            (artifact,) = run.artifacts()
            assert (artifact.name, artifact.size) == ("n.txt", 1)
            assert artifact.read() == b"8"


def test_the_async_client(live) -> None:
    async def main() -> None:
        async with AsyncClient(live.url, live.admin_token) as client:
            loop_thread: list[bool] = []
            chunks: list[bytes] = []

            def on_stdout(data: bytes) -> None:
                loop_thread.append(asyncio.get_running_loop() is not None)
                chunks.append(data)

            async with await client.sandboxes.create(image="base", ttl=120) as sandbox:
                two = await asyncio.gather(
                    sandbox.exec(["sh", "-c", "echo a; sleep 1; echo b"], on_stdout=on_stdout),
                    sandbox.exec(["sh", "-c", "sleep 1; echo c"]),
                )
                assert [r.stdout for r in two] == [b"a\nb\n", b"c\n"]
                await asyncio.sleep(0)  # the callbacks were queued on this loop
                assert b"".join(chunks) == b"a\nb\n" and all(loop_thread)
                await sandbox.files.write("x.txt", b"hello")
                assert await sandbox.files.read("x.txt") == b"hello"
            assert sandbox.id not in [s.id for s in await client.sandboxes.list()]

    asyncio.run(main())
