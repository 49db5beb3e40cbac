"""Fixtures for the guest agent and its channel: the real agent, installed the way an image
installs it, run on the host against a real `GuestChannel` on a real Unix socket."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from guest_helpers import AgentStarter, make_channel

from aamp.sandbox import GuestChannel
from aamp.sandbox.first_stage_build import SOURCE, compile_first_stage

SRC = Path(__file__).resolve().parents[2] / "src" / "aamp"


@pytest.fixture(scope="session")
def agent_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Lay out /opt/aamp as the image builder does (lib/aamp/..., agent = the launcher),
    with the launcher's hard-coded /opt/aamp/lib pointed at this copy. Returns the agent."""
    root = tmp_path_factory.mktemp("opt-aamp")
    guest = root / "lib" / "aamp" / "guest"
    guest.mkdir(parents=True)
    shutil.copy(SRC / "__init__.py", root / "lib" / "aamp" / "__init__.py")
    for module in (SRC / "guest").glob("*.py"):  # every module, as the image builder copies
        shutil.copy(module, guest / module.name)
    launcher = (SRC / "guest" / "launcher.py").read_text()
    assert launcher.count('"/opt/aamp/lib"') == 1
    assert launcher.startswith("#!/usr/bin/python3 -IS\n")
    agent = root / "agent"
    agent.write_text(launcher.replace('"/opt/aamp/lib"', repr(str(root / "lib"))))
    agent.chmod(0o755)
    return agent


@pytest.fixture
def sock_path() -> Iterator[Path]:
    # Unix socket paths are short (107 bytes): keep it out of pytest's deep tmp_path.
    d = Path(tempfile.mkdtemp(prefix="aamp-g-", dir="/tmp"))
    yield d / "agent.sock"
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    return ws


@pytest.fixture(scope="session")
def first_stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first stage, compiled from the package's source as the image builder does."""
    binary = tmp_path_factory.mktemp("first-stage") / "agent-init"
    compile_first_stage((SRC / "guest" / SOURCE).read_bytes(), binary)
    return binary


@pytest.fixture(params=["python", "first-stage"])
def start_agent(
    request: pytest.FixtureRequest,
    agent_install: Path,
    first_stage: Path,
    sock_path: Path,
    workspace: Path,
) -> Iterator[AgentStarter]:
    """Start the real agent (via its shebang: /usr/bin/python3 -IS) dialling `sock_path`:
    alone (as Firecracker starts it), or behind the first stage (as gVisor does), which serves
    the first exec itself and hands everything else to the agent."""
    procs: list[subprocess.Popen[bytes]] = []
    front = (str(first_stage),) if request.param == "first-stage" else ()

    def start(
        *extra: str, prefix: tuple[str, ...] = (), retry: float = 3.0
    ) -> subprocess.Popen[bytes]:
        argv = [
            *prefix,
            *front,
            str(agent_install),
            "--connect",
            f"unix:{sock_path}",
            "--workspace",
            str(workspace),
            "--retry-seconds",
            str(retry),
            *extra,
        ]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
async def channel(sock_path: Path) -> AsyncIterator[GuestChannel]:
    ch = make_channel(sock_path)
    await ch.start()
    yield ch
    await ch.close()


@pytest.fixture
async def ready(channel: GuestChannel, start_agent: AgentStarter) -> GuestChannel:
    """A channel with the real agent connected."""
    start_agent()
    await channel.wait_ready(timeout=10)
    return channel
