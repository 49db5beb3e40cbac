"""The real guest agent (run on the host as the image runs it) against the real host channel."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from guest_helpers import AgentStarter, MiB, make_channel, pids_gone_within

from aamp.sandbox import (
    ExecResult,
    FileTooLargeError,
    GuestChannel,
    GuestError,
    GuestUnavailable,
    PathEscapeError,
    workspace_path,
)

pytestmark = pytest.mark.timeout(60)


async def test_exec_python_prints_42(ready: GuestChannel) -> None:
    result, out, err = await ready.run(["python3", "-c", "print(6*7)"], timeout=30)
    assert (result.exit_code, result.signal, result.timed_out) == (0, None, False)
    assert out == b"42\n" and err == b""


async def test_health_reports_uptime_and_load(ready: GuestChannel) -> None:
    before = ready.last_activity
    health = await ready.health()
    assert health["ok"] is True and health["uptime"] >= 0
    assert health["load"] is None or len(health["load"]) == 3
    assert ready.connected and ready.guest_info is not None
    assert ready.last_activity > before


async def test_output_is_streamed_while_the_command_runs(ready: GuestChannel) -> None:
    script = "import sys,time; print('first', flush=True); time.sleep(1); print('second')"
    started = time.monotonic()
    arrivals: list[tuple[float, bytes]] = []  # (seconds since start, data)
    async with await ready.exec(["python3", "-c", script], timeout=10) as session:
        async for out in session:
            arrivals.append((time.monotonic() - started, out.data))
    assert b"".join(d for _, d in arrivals) == b"first\nsecond\n"
    assert arrivals[0][1] == b"first\n"
    # The first line arrives about a second before the last: it was not held back.
    assert arrivals[-1][0] - arrivals[0][0] >= 0.8, "output was buffered to the end"
    assert session.result is not None and session.result.exit_code == 0


async def test_stdout_and_stderr_are_kept_apart(ready: GuestChannel) -> None:
    result, out, err = await ready.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (out, err, result.exit_code) == (b"out\n", b"err\n", 3)


async def test_stdin_small_and_large(ready: GuestChannel) -> None:
    _, out, _ = await ready.run(["cat"], stdin=b"hello\n")
    assert out == b"hello\n"
    big = os.urandom(3 * MiB)  # more than one frame: streamed by a background task
    result, out, _ = await ready.run(["sha256sum"], stdin=big)
    assert result.exit_code == 0
    assert out.split()[0].decode() == hashlib.sha256(big).hexdigest()
    _, out, _ = await ready.run(["cat"], stdin=b"")
    assert out == b""


async def test_without_stdin_the_command_reads_eof(ready: GuestChannel) -> None:
    result, out, _ = await ready.run(["cat"], timeout=5)
    assert (result.exit_code, out) == (0, b"")


async def test_env_is_merged_onto_a_minimal_default(ready: GuestChannel) -> None:
    _, out, _ = await ready.run(
        ["sh", "-c", 'echo "$FOO|$HOME|$LANG|$PATH|${PYTEST_CURRENT_TEST:-unset}"'],
        env={"FOO": "bar baz"},
    )
    foo, home, lang, path, leaked = out.decode().strip().split("|")
    assert (foo, home, lang, leaked) == ("bar baz", "/root", "C.UTF-8", "unset")
    assert "/usr/bin" in path.split(":")
    _, out, _ = await ready.run(["sh", "-c", "echo $HOME"], env={"HOME": "/tmp"})
    assert out == b"/tmp\n"


async def test_cwd_defaults_to_the_workspace(ready: GuestChannel, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    _, out, _ = await ready.run(["pwd"])
    assert out.decode().strip() == os.path.realpath(workspace)
    _, out, _ = await ready.run(["pwd"], cwd="sub")
    assert out.decode().strip() == os.path.realpath(workspace / "sub")
    _, out, _ = await ready.run(["pwd"], cwd="/")
    assert out == b"/\n"
    with pytest.raises(GuestError, match="does not exist") as info:
        await ready.run(["pwd"], cwd="missing")
    assert info.value.code == "bad_cwd"


async def test_exit_codes_and_signals(ready: GuestChannel) -> None:
    result, _, _ = await ready.run(["sh", "-c", "exit 7"])
    assert (result.exit_code, result.signal) == (7, None)
    result, _, _ = await ready.run(["sh", "-c", "kill -TERM $$"])
    assert (result.exit_code, result.signal) == (None, signal.SIGTERM)


async def test_a_missing_program_is_a_clear_error(ready: GuestChannel) -> None:
    with pytest.raises(GuestError, match="no-such-program") as info:
        await ready.run(["no-such-program"])
    assert info.value.code == "spawn_failed"
    assert (await ready.run(["true"]))[0].exit_code == 0  # and the agent carries on


async def test_bad_exec_arguments_are_refused_before_anything_is_sent(
    ready: GuestChannel,
) -> None:
    for kwargs in (
        {"argv": []},
        {"argv": ["a\0b"]},
        {"argv": ["true"], "env": {"A=B": "x"}},
        {"argv": ["true"], "timeout": -1},
        {"argv": ["true"], "cwd": ""},
    ):
        argv = kwargs.pop("argv")
        with pytest.raises(ValueError):
            await ready.exec(argv, **kwargs)  # type: ignore[arg-type]


async def test_timeout_kills_the_whole_process_group(ready: GuestChannel) -> None:
    started = time.monotonic()
    result, out, _ = await ready.run(
        ["sh", "-c", "sleep 30 & echo $!; sh -c 'sleep 31 & echo $!; wait' & wait"],
        timeout=0.5,
    )
    elapsed = time.monotonic() - started
    assert result.timed_out and result.signal == signal.SIGKILL and result.exit_code is None
    assert elapsed < 3
    children = [int(line) for line in out.split()]
    assert len(children) == 2
    assert pids_gone_within(children, 3), "background children of a timed-out command survived"


async def test_kill_ends_the_command_and_its_children(ready: GuestChannel) -> None:
    session = await ready.exec(["sh", "-c", "sleep 30 & echo $!; wait"])
    async with session:
        async for out in session:
            child = int(out.data)
            started = time.monotonic()
            await session.kill()
    assert session.result is not None and session.result.signal == signal.SIGKILL
    assert not session.result.timed_out
    assert time.monotonic() - started < 2
    assert pids_gone_within([child], 3)


async def test_leaving_the_session_early_kills_the_command(ready: GuestChannel) -> None:
    async with await ready.exec(["sh", "-c", "echo $$; exec sleep 30"]) as session:
        async for out in session:
            pid = int(out.data)
            break
    assert session.result is None
    assert pids_gone_within([pid], 3)
    assert (await ready.run(["true"]))[0].exit_code == 0


async def test_concurrent_execs_on_one_channel(ready: GuestChannel) -> None:
    async def one(n: int) -> tuple[ExecResult, bytes, bytes]:
        return await ready.run(["sh", "-c", f"sleep 0.5; echo {n}"], timeout=10)

    started = time.monotonic()
    results = await asyncio.gather(*(one(n) for n in range(5)))
    elapsed = time.monotonic() - started
    assert [out for _, out, _ in results] == [f"{n}\n".encode() for n in range(5)]
    assert all(r.exit_code == 0 for r, _, _ in results)
    assert elapsed < 2.4, f"5 x 0.5 s took {elapsed:.2f} s: not concurrent"


async def test_run_caps_output(ready: GuestChannel) -> None:
    result, out, _ = await ready.run(
        ["python3", "-c", "import sys; sys.stdout.write('x' * 300000)"], max_output=1000
    )
    assert result.exit_code == 0 and result.truncated and out == b"x" * 1000


@pytest.mark.parametrize("size", [0, 1, MiB])
async def test_put_then_get_is_byte_identical(
    ready: GuestChannel, workspace: Path, size: int
) -> None:
    data = os.urandom(size)
    await ready.put("in/data.bin", data, size)
    assert (workspace / "in" / "data.bin").read_bytes() == data
    async with await ready.get("/workspace/in/data.bin") as stream:
        assert stream.size == size
        assert await stream.read_all() == data
    assert [p.name for p in (workspace / "in").iterdir()] == ["data.bin"]  # no temp left


async def test_put_from_an_async_iterator_replaces_atomically(
    ready: GuestChannel, workspace: Path
) -> None:
    (workspace / "f.txt").write_bytes(b"old")

    async def chunks():  # type: ignore[no-untyped-def]
        for part in (b"a" * 10, b"b" * (2 * MiB), b"c"):
            yield part

    await ready.put("f.txt", chunks(), 10 + 2 * MiB + 1)
    assert (workspace / "f.txt").read_bytes() == b"a" * 10 + b"b" * (2 * MiB) + b"c"


async def test_put_with_a_short_source_changes_nothing(
    ready: GuestChannel, workspace: Path
) -> None:
    (workspace / "keep.txt").write_bytes(b"original")

    async def short():  # type: ignore[no-untyped-def]
        yield b"only this"

    with pytest.raises(ValueError, match="not the declared"):
        await ready.put("keep.txt", short(), 100)
    await asyncio.sleep(0.2)  # let the agent see the hang-up
    assert (workspace / "keep.txt").read_bytes() == b"original"
    assert sorted(p.name for p in workspace.iterdir()) == ["keep.txt"]
    with pytest.raises(ValueError, match="data is 3 bytes"):
        await ready.put("keep.txt", b"abc", 4)


async def test_put_and_get_100_mib(ready: GuestChannel, workspace: Path) -> None:
    data = os.urandom(100 * MiB)
    started = time.monotonic()
    await ready.put("big.bin", data, len(data))
    put_s = time.monotonic() - started
    started = time.monotonic()
    h = hashlib.sha256()
    async with await ready.get("big.bin") as stream:
        assert stream.size == len(data)
        async for chunk in stream:
            h.update(chunk)
    get_s = time.monotonic() - started
    assert h.digest() == hashlib.sha256(data).digest()
    assert hashlib.sha256((workspace / "big.bin").read_bytes()).digest() == h.digest()
    print(f"\n100 MiB put {100 / put_s:.0f} MiB/s ({put_s:.2f} s), get {100 / get_s:.0f} MiB/s")


async def test_size_limits_refuse_before_any_data_moves(
    sock_path: Path, start_agent: AgentStarter, workspace: Path
) -> None:
    channel = make_channel(sock_path, max_file_bytes=MiB)
    await channel.start()
    try:
        start_agent()
        await channel.wait_ready(timeout=10)
        with pytest.raises(FileTooLargeError, match="over the limit"):
            await channel.put("big.bin", b"x" * (MiB + 1), MiB + 1)
        assert not (workspace / "big.bin").exists()
        (workspace / "big.bin").write_bytes(b"y" * (MiB + 1))
        with pytest.raises(FileTooLargeError, match=f"{MiB + 1} bytes"):
            await channel.get("big.bin")
        with pytest.raises(FileTooLargeError):
            await channel.exec(["cat"], stdin=b"z" * (MiB + 1))
        await channel.put("ok.bin", b"x" * MiB, MiB)  # exactly the limit is fine
        assert (await channel.run(["true"]))[0].exit_code == 0
    finally:
        await channel.close()


@pytest.mark.parametrize(
    "bad",
    [
        "../x",
        "/etc/passwd",
        "a/../../x",
        "/workspace/../etc",
        "/workspacex/y",
        "",
        "a\0b",
        "a" * 5000,
        "d/" + "n" * 300,
    ],
)
def test_workspace_path_refuses_escapes(bad: str) -> None:
    with pytest.raises(PathEscapeError):
        workspace_path(bad)


def test_workspace_path_normalises() -> None:
    assert workspace_path("a/b.txt") == "/workspace/a/b.txt"
    assert workspace_path("/workspace/x/../y") == "/workspace/y"
    assert workspace_path("./a//b/") == "/workspace/a/b"
    assert workspace_path("//workspace/a") == "/workspace/a"
    assert workspace_path("/workspace") == "/workspace"


async def test_escaping_paths_never_reach_the_guest(ready: GuestChannel, tmp_path: Path) -> None:
    before = ready.last_activity
    with pytest.raises(PathEscapeError):
        await ready.put("../outside.txt", b"x", 1)
    with pytest.raises(PathEscapeError):
        await ready.get("/etc/passwd")
    assert ready.last_activity == before  # refused before any connection was used
    assert not (tmp_path / "outside.txt").exists()


async def test_the_agent_refuses_symlinks_out_of_the_workspace(
    ready: GuestChannel, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s3cret")
    (workspace / "link").symlink_to(outside)
    (workspace / "passwd").symlink_to("/etc/passwd")
    for path in ("link/secret", "passwd"):
        with pytest.raises(GuestError, match="outside the workspace") as info:
            await ready.get(path)
        assert info.value.code == "path_escape"
    with pytest.raises(GuestError, match="outside the workspace"):
        await ready.put("link/new.txt", b"data", 4)
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    # A symlink that stays inside is fine.
    (workspace / "real.txt").write_bytes(b"inside")
    (workspace / "alias.txt").symlink_to(workspace / "real.txt")
    async with await ready.get("alias.txt") as stream:
        assert await stream.read_all() == b"inside"


async def test_get_refuses_directories_and_missing_files(
    ready: GuestChannel, workspace: Path
) -> None:
    (workspace / "dir").mkdir()
    with pytest.raises(GuestError, match="is a directory") as info:
        await ready.get("dir")
    assert info.value.code == "is_directory"
    with pytest.raises(GuestError, match="does not exist") as info:
        await ready.get("nope.txt")
    assert info.value.code == "not_found"
    os.mkfifo(workspace / "fifo")
    with pytest.raises(GuestError, match="not a regular file"):
        await ready.get("fifo")  # must not hang on open
    with pytest.raises(GuestError, match="is a directory"):
        await ready.put("dir", b"x" * (3 * MiB), 3 * MiB)  # refused while data flows


async def test_the_agent_redials_a_restarted_host(
    sock_path: Path, start_agent: AgentStarter
) -> None:
    first = make_channel(sock_path)
    await first.start()
    proc = start_agent(retry=10)
    await first.wait_ready(timeout=10)
    pid = first.guest_info["pid"]  # type: ignore[index]
    await first.close()
    assert not sock_path.exists()
    await asyncio.sleep(0.3)  # the agent's idle connection is gone; it keeps redialling
    second = make_channel(sock_path)
    await second.start()
    try:
        await second.wait_ready(timeout=10)
        assert second.guest_info["pid"] == pid  # type: ignore[index]
        assert (await second.run(["echo", "again"]))[1] == b"again\n"
        assert proc.poll() is None
    finally:
        await second.close()


async def test_the_agent_exits_non_zero_when_the_host_stays_gone(
    channel: GuestChannel, start_agent: AgentStarter
) -> None:
    proc = start_agent(retry=0.5)
    await channel.wait_ready(timeout=10)
    await channel.close()
    started = time.monotonic()
    code = await asyncio.to_thread(proc.wait, 10)
    assert code == 1
    assert time.monotonic() - started < 5


async def test_an_agent_without_a_host_gives_up(sock_path: Path, start_agent: AgentStarter) -> None:
    proc = start_agent(retry=0.3)
    assert await asyncio.to_thread(proc.wait, 10) == 1


async def test_bad_connect_argument_is_a_usage_error(agent_install: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        str(agent_install), "--connect", "tcp:1.2.3.4:5", stderr=subprocess.PIPE
    )
    _, err = await proc.communicate()
    assert proc.returncode == 2 and b"--connect must be" in err


async def test_channel_operations_without_a_guest_time_out(sock_path: Path) -> None:
    channel = make_channel(sock_path, io_timeout=0.3)
    await channel.start()
    try:
        assert not channel.connected
        with pytest.raises(GuestUnavailable):
            await channel.wait_ready(timeout=0.2)
        with pytest.raises(GuestUnavailable, match="no guest agent connection"):
            await channel.health()
    finally:
        await channel.close()
    with pytest.raises(GuestUnavailable, match="closed"):
        await channel.health()


async def test_socket_path_checks(tmp_path: Path, sock_path: Path) -> None:
    with pytest.raises(ValueError, match="limited to 107 bytes"):
        GuestChannel(Path("/tmp") / ("x" * 120), max_file_bytes=1)
    sock_path.write_text("not a socket")
    with pytest.raises(ValueError, match="not a socket"):
        await make_channel(sock_path).start()
    sock_path.unlink()
    stale = make_channel(sock_path)
    await stale.start()
    stale._server.close()  # type: ignore[union-attr]  # a crash leaves the file behind
    assert sock_path.exists()
    fresh = make_channel(sock_path)
    await fresh.start()
    assert oct(sock_path.stat().st_mode & 0o777) == "0o600"
    await fresh.close()
    await stale.close()
    assert not sock_path.exists()


async def test_agent_as_pid_1_reaps_orphans(
    channel: GuestChannel, start_agent: AgentStarter
) -> None:
    """In a fresh pid namespace the agent is pid 1: it forks, the parent reaps, the child
    serves (the Firecracker --init mounts cannot be exercised on this host)."""
    proc = start_agent(prefix=("unshare", "--pid", "--fork", "--mount-proc"), retry=0.5)
    hello = await channel.wait_ready(timeout=10)
    assert hello["pid"] == 2
    _, out, _ = await channel.run(["cat", "/proc/1/cmdline"])
    assert b"agent" in out
    # An orphan re-parented to pid 1 must be reaped, not left a zombie.
    await channel.run(["sh", "-c", "sleep 0.2 & exit 0"])
    # Until the orphan is gone from /proc altogether: a zombie would stay there for good, and a
    # fixed wait could look before the orphan even exited (on a loaded host).
    count = 'cat /proc/[0-9]*/stat 2>/dev/null | awk \'$2 == "(sleep)" || $3 == "Z"\' | wc -l'
    deadline = time.monotonic() + 10
    while True:
        _, out, _ = await channel.run(["sh", "-c", count])
        if out.strip() == b"0" or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert out.strip() == b"0"
    await channel.close()
    assert await asyncio.to_thread(proc.wait, 10) == 1  # pid 1 exits with the agent's status


async def test_stdin_the_command_does_not_read(ready: GuestChannel) -> None:
    for _ in range(3):
        result, out, _ = await ready.run(["head", "-c", "1"], stdin=b"y" * (5 * MiB))
        assert (result.exit_code, out) == (0, b"y")


async def test_kill_racing_the_end_of_the_command(ready: GuestChannel) -> None:
    for _ in range(10):
        async with await ready.exec(["true"]) as session:
            await asyncio.sleep(0.003)
            await session.kill()
            result = await session.wait()
        assert result.exit_code == 0 or result.signal == signal.SIGKILL


@pytest.mark.parametrize(("declared", "sent"), [(5, 10), (10, 5)])
async def test_the_agent_checks_put_sizes_itself(
    ready: GuestChannel, workspace: Path, declared: int, sent: int
) -> None:
    """Defence in depth: a host bug that sends the wrong amount writes nothing."""
    from aamp.guest import wire

    conn = await ready._acquire()
    try:
        wire.write_control(conn.writer, {"op": "put", "path": "f.bin", "size": declared})
        wire.write_frame(conn.writer, wire.DATA, b"z" * sent)
        wire.write_frame(conn.writer, wire.EOF)
        ftype, payload = await ready._read(conn, "in test")
        answer = wire.decode_control(payload)
    finally:
        conn.close()
    assert ftype == wire.CONTROL and answer["code"] == "size_mismatch"
    assert list(workspace.iterdir()) == []


async def test_init_mounts_and_hostname_in_private_namespaces(agent_install: Path) -> None:
    """`--init` as pid 1 in private mount/uts/pid namespaces (a stand-in for a Firecracker
    guest, which cannot boot here). The socket lives outside /tmp and /run, which --init
    covers with fresh tmpfs mounts."""
    sock_dir = Path(tempfile.mkdtemp(prefix="aamp-i-", dir="/var/tmp"))
    channel = make_channel(sock_dir / "agent.sock")
    await channel.start()
    host_name = socket.gethostname()
    proc = subprocess.Popen(
        [
            "unshare", "--mount", "--uts", "--pid", "--fork", "--propagation", "private",
            str(agent_install), "--init", "--hostname", "sbx-test",
            "--connect", f"unix:{sock_dir / 'agent.sock'}", "--workspace", "/tmp/ws",
            "--retry-seconds", "0.5",
        ]
    )  # fmt: skip
    try:
        assert (await channel.wait_ready(timeout=10))["pid"] == 2
        _, out, _ = await channel.run(["sh", "-c", "hostname; cat /proc/self/mounts; pwd"])
        lines = out.decode().splitlines()
        assert lines[0] == "sbx-test" and lines[-1] == "/tmp/ws"
        mounted = {line.split()[1]: line.split()[2] for line in lines[1:-1]}
        assert mounted["/proc"] == "proc" and mounted["/sys"] == "sysfs"
        assert mounted["/dev"] == "devtmpfs"
        assert mounted["/tmp"] == "tmpfs" and mounted["/run"] == "tmpfs"
        await channel.close()
        assert await asyncio.to_thread(proc.wait, 10) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await channel.close()
        shutil.rmtree(sock_dir, ignore_errors=True)
    assert socket.gethostname() == host_name


def test_agent_arguments_are_checked():
    from aamp.guest.args import UsageError, parse_args

    opts = parse_args(["--connect", "unix:/x", "--egress=vsock:2:5001", "--init"])
    assert (opts["connect"], opts["egress"], opts["init"]) == ("unix:/x", "vsock:2:5001", True)
    assert parse_args(["--connect", "unix:/x", "--retry-seconds", "2.5"])["retry_seconds"] == 2.5
    for bad, message in (
        ([], "--connect is required"),
        (["--connect"], "--connect needs a value"),
        (["--connect", "unix:/x", "--bogus"], "unknown argument '--bogus'"),
        (["--connect", "unix:/x", "--retry-seconds", "soon"], "must be a number"),
    ):
        with pytest.raises(UsageError, match=message):
            parse_args(bad)
