"""The `aamp` command against a real control plane (`aamp up` in a subprocess)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from installation_settings import make_settings  # tests/installation_settings.py

from aamp.sandbox import procs

pytestmark = pytest.mark.usefixtures("base_image")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ControlPlane:
    """A real `aamp up` process, and a way to run the CLI against it."""

    def __init__(self, settings, extra_env: dict[str, str] | None = None):
        self.settings = settings
        self.port = free_port()
        self.env = {
            **os.environ,
            "AAMP_HOME": str(settings.home),
            "AAMP_RUNTIME_DIR": str(settings.runtime_dir),
            "AAMP_IMAGE_DIR": str(settings.image_dir),
            "AAMP_PORT": str(self.port),
            "AAMP_DRIVER": "gvisor",
            **(extra_env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aamp", "up"],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"aamp up exited: {self.proc.stdout.read().decode()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/v1/health").status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop(signal.SIGKILL)  # not left running for the rest of the session
        raise AssertionError("aamp up did not answer within 60 s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def auth(self) -> dict[str, str]:
        """The installation's admin token (the CLI's), as a request header."""
        token = self.settings.cli_token_path.read_text().strip()
        return {"authorization": f"Bearer {token}"}

    def aamp(self, *args: str, input: bytes | None = None, timeout: float = 120):
        return subprocess.run(
            [sys.executable, "-m", "aamp", *args],
            env=self.env,
            input=input,
            capture_output=True,
            timeout=timeout,
        )


@pytest.fixture(scope="module")
def module_plane(tmp_path_factory, base_image):
    """One `aamp up` for the module's tests that take `cp` (starting one costs seconds)."""
    settings = make_settings(tmp_path_factory.mktemp("cli-plane") / "home")
    plane = ControlPlane(settings)
    plane.start()
    yield plane
    plane.stop()
    shutil.rmtree(settings.runtime_dir, ignore_errors=True)


@pytest.fixture
def cp(module_plane):
    """The module's plane, with no sandbox when a test begins (see `leaves_no_sandbox`)."""
    with leaves_no_sandbox(module_plane):
        yield module_plane


@contextlib.contextmanager
def leaves_no_sandbox(plane: ControlPlane) -> Iterator[None]:
    """For a plane the tests of a module share: it must have no sandbox when a test begins,
    and whatever the test left running is destroyed after it, so each test's `sandbox ls`
    shows only its own. The names a test makes (users, secrets, wheels, knowledge bases,
    hosts, agents) are its own, used by no other test of the module."""
    assert sandbox_ids(plane) == []
    yield
    for sandbox_id in sandbox_ids(plane):
        removed = httpx.delete(f"{plane.api}/v1/sandboxes/{sandbox_id}", headers=plane.auth())
        assert removed.status_code in (204, 404), removed.text  # 404: it ended meanwhile
    deadline = time.monotonic() + 20
    while runsc_processes(plane.settings) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert runsc_processes(plane.settings) == []


def sandbox_ids(plane: ControlPlane) -> list[str]:
    listed = httpx.get(f"{plane.api}/v1/sandboxes", headers=plane.auth())
    assert listed.status_code == 200, listed.text
    return [s["id"] for s in listed.json()]


def runsc_processes(settings) -> list[int]:
    return procs.pids_matching(f"--root={settings.runtime_dir}/runsc")


def test_create_exec_cp_ls_rm(cp, tmp_path):
    created = cp.aamp("sandbox", "create", "--image", "base", "--ttl", "300")
    assert created.returncode == 0, created.stderr
    sandbox_id = created.stdout.decode().strip()
    assert sandbox_id.startswith("sb-")

    ran = cp.aamp("sandbox", "exec", sandbox_id, "--", "python3", "-c", "print(6*7)")
    assert (ran.returncode, ran.stdout) == (0, b"42\n")

    failed = cp.aamp("sandbox", "exec", sandbox_id, "--", "sh", "-c", "echo oops >&2; exit 7")
    assert (failed.returncode, failed.stderr) == (7, b"oops\n")

    piped = cp.aamp("sandbox", "exec", sandbox_id, "--", "wc", "-c", input=b"12345")
    assert piped.stdout.strip() == b"5"

    src = tmp_path / "data.bin"
    src.write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    put = cp.aamp("sandbox", "cp", str(src), f"{sandbox_id}:in/data.bin")
    assert put.returncode == 0, put.stderr
    back = tmp_path / "back.bin"
    got = cp.aamp("sandbox", "cp", f"{sandbox_id}:in/data.bin", str(back))
    assert got.returncode == 0, got.stderr
    assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()

    listed = cp.aamp("sandbox", "ls")
    assert sandbox_id in listed.stdout.decode()

    removed = cp.aamp("sandbox", "rm", sandbox_id)
    assert removed.returncode == 0, removed.stderr
    assert sandbox_id not in cp.aamp("sandbox", "ls").stdout.decode()
    assert not (cp.settings.runtime_dir / "sb" / sandbox_id).exists()


def test_exec_streams_output_as_it_comes(cp):
    sandbox_id = cp.aamp("sandbox", "create").stdout.decode().strip()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aamp",
            "sandbox",
            "exec",
            sandbox_id,
            "--",
            "sh",
            "-c",
            "echo first; sleep 3; echo second",
        ],
        env=cp.env,
        stdout=subprocess.PIPE,
    )
    started = time.monotonic()
    first = proc.stdout.readline()
    first_after = time.monotonic() - started
    rest = proc.stdout.read()
    total = time.monotonic() - started
    proc.wait(timeout=30)
    assert (first, rest) == (b"first\n", b"second\n")
    assert total - first_after >= 2.5  # the first line came well before the command ended


def test_one_shot_exec_leaves_no_sandbox(cp):
    ran = cp.aamp("sandbox", "exec", "--image", "base", "--", "python3", "-c", "print(6*7)")
    assert (ran.returncode, ran.stdout) == (0, b"42\n")
    assert cp.aamp("sandbox", "ls").stdout.decode().count("sb-") == 0


def test_timeout_exit_code(cp):
    sandbox_id = cp.aamp("sandbox", "create").stdout.decode().strip()
    ran = cp.aamp("sandbox", "exec", "--timeout", "1", sandbox_id, "--", "sleep", "30")
    assert ran.returncode == 124, ran.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sandbox", "create", "--image", "nope"], b"nope"),
        (["sandbox", "exec", "sb-000000000000", "--", "true"], b"no sandbox"),
        (["sandbox", "rm", "sb-000000000000"], b"no sandbox"),
        (["sandbox", "create", "--ttl", "-5"], b"between 1 and 86400"),
        (["sandbox", "create", "--ttl", "soon"], b"not a number"),
        (["sandbox", "create", "--driver", "qemu"], b"unknown driver"),
    ],
)
def test_bad_input_is_refused_clearly(cp, args, message):
    before = cp.aamp("sandbox", "ls").stdout
    done = cp.aamp(*args)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert cp.aamp("sandbox", "ls").stdout == before


def test_cp_refuses_escapes_and_oversize(settings, tmp_path):
    plane = ControlPlane(settings, {"AAMP_MAX_FILE_BYTES": str(1024 * 1024)})
    plane.start()
    try:
        sandbox_id = plane.aamp("sandbox", "create").stdout.decode().strip()
        small = tmp_path / "small.txt"
        small.write_text("hello")
        for target in ("../../etc/passwd", "/etc/passwd", "in/../../x"):
            done = plane.aamp("sandbox", "cp", str(small), f"{sandbox_id}:{target}")
            assert done.returncode != 0
            assert b"workspace" in done.stderr, done.stderr
        dest = tmp_path / "stolen"
        done = plane.aamp("sandbox", "cp", f"{sandbox_id}:/etc/shadow", str(dest))
        assert done.returncode != 0 and not dest.exists()
        big = tmp_path / "big.bin"
        big.write_bytes(b"x" * (1024 * 1024 + 1))
        done = plane.aamp("sandbox", "cp", str(big), f"{sandbox_id}:big.bin")
        assert done.returncode != 0
        assert b"limit" in done.stderr, done.stderr
        # Made inside the guest, too big to come out.
        plane.aamp(
            "sandbox",
            "exec",
            sandbox_id,
            "--",
            "sh",
            "-c",
            "head -c 2000000 /dev/zero > /workspace/big.out",
        )
        done = plane.aamp("sandbox", "cp", f"{sandbox_id}:big.out", str(dest))
        assert done.returncode != 0 and not dest.exists()
        assert b"limit" in done.stderr, done.stderr
    finally:
        plane.stop()


def test_kill_9_then_restart_reaps_everything(settings):
    plane = ControlPlane(settings)
    plane.start()
    ids = [plane.aamp("sandbox", "create").stdout.decode().strip() for _ in range(2)]
    assert all(i.startswith("sb-") for i in ids)
    assert runsc_processes(settings)
    plane.stop(signal.SIGKILL)
    assert runsc_processes(settings)  # orphans, until a host process comes back

    again = ControlPlane(settings)
    again.start()
    try:
        assert runsc_processes(settings) == []
        for sandbox_id in ids:
            assert not (settings.runtime_dir / "sb" / sandbox_id).exists()
            for controller in Path("/sys/fs/cgroup").iterdir():
                assert not (controller / settings.runtime_dir.name / sandbox_id).exists()
        assert again.aamp("sandbox", "ls").stdout.decode().count("sb-") == 0
    finally:
        again.stop()


def test_graceful_stop_destroys_sandboxes(settings):
    plane = ControlPlane(settings)
    plane.start()
    plane.aamp("sandbox", "create")
    assert runsc_processes(settings)
    plane.stop(signal.SIGTERM)
    assert runsc_processes(settings) == []


def test_api_needs_the_token(cp):
    r = httpx.get(f"http://127.0.0.1:{cp.port}/v1/sandboxes")
    assert r.status_code == 401
    assert r.json()["code"] == "unauthenticated"
    r = httpx.get(
        f"http://127.0.0.1:{cp.port}/v1/sandboxes", headers={"authorization": "Bearer nope"}
    )
    assert r.status_code == 401


def test_identity_commands_and_local_audit(cp, tmp_path):
    added = cp.aamp("user", "add", "bea", "--role", "builder")
    assert added.returncode == 0, added.stderr
    assert b"password:" in added.stdout
    listed = cp.aamp("user", "ls").stdout.decode()
    assert "bea" in listed and "builder" in listed and "admin" in listed
    assert cp.aamp("user", "role", "bea", "operator").returncode == 0
    assert "operator" in cp.aamp("user", "ls").stdout.decode()
    refused = cp.aamp("user", "role", "admin", "operator")
    assert refused.returncode != 0 and b"own role" in refused.stderr
    made = cp.aamp("token", "create", "--name", "ci")
    token_id, secret = made.stdout.decode().split()
    assert secret.startswith("aamp_")
    as_token = subprocess.run(
        [sys.executable, "-m", "aamp", "user", "ls"],
        env={**cp.env, "AAMP_TOKEN": secret},
        capture_output=True,
    )
    assert as_token.returncode == 0
    assert cp.aamp("token", "revoke", token_id).returncode == 0
    secret_value = b"cli-secret-value-991"
    assert cp.aamp("secret", "set", "crm_token", input=secret_value).returncode == 0
    assert secret_value not in cp.aamp("secret", "ls").stdout
    rotated = cp.aamp("secret", "rotate-master-key")
    assert rotated.returncode == 0 and rotated.stdout.startswith(b"new master key "), rotated
    verified = cp.aamp("audit", "verify")
    assert verified.returncode == 0 and verified.stdout.startswith(b"OK"), verified.stdout
    out = tmp_path / "audit.jsonl"
    exported = cp.aamp("audit", "export", "--since", "2000-01-01T00:00:00Z", "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    text = out.read_text()
    assert '"action":"user.created"' in text and secret_value.decode() not in text


def test_create_with_a_policy_file(cp, tmp_path):
    good = tmp_path / "policy.yaml"
    good.write_text(
        "name: small\nimage: base\nlifetime: {ttl: 2m, idle: 1m}\n"
        "resources: {cpus: 1, memory: 512MiB, pids: 64}\n"
        "egress: {default: block, allow: [a.test]}\n"
    )
    made = cp.aamp("sandbox", "create", "--policy", str(good))
    assert made.returncode == 0, made.stderr
    sandbox_id = made.stdout.decode().strip()
    token = cp.settings.cli_token_path.read_text().strip()
    info = httpx.get(
        f"http://127.0.0.1:{cp.port}/v1/sandboxes/{sandbox_id}",
        headers={"authorization": f"Bearer {token}"},
    ).json()
    assert info["ttl_seconds"] == 120 and info["idle_seconds"] == 60
    assert info["resources"]["memory_bytes"] == 512 * 1024 * 1024
    assert info["resources"]["pids"] == 64
    blocked = cp.aamp(
        "sandbox", "exec", sandbox_id, "--",
        "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://b.test/",
    )  # fmt: skip
    assert blocked.stdout == b"403"  # refused by `default: block` before any lookup

    bad = tmp_path / "bad.yaml"
    bad.write_text("image: base\negress: {default: maybe}\n")

    def ids() -> set[str]:
        return {w for w in cp.aamp("sandbox", "ls").stdout.decode().split() if w.startswith("sb-")}

    before = ids()
    done = cp.aamp("sandbox", "create", "--policy", str(bad))
    assert done.returncode != 0
    assert b"egress.default" in done.stderr, done.stderr
    assert ids() == before
    missing = cp.aamp("sandbox", "create", "--policy", str(tmp_path / "nope.yaml"))
    assert missing.returncode != 0 and b"cannot read the policy file" in missing.stderr
    both = cp.aamp("sandbox", "create", "--policy", str(good), "--image", "browser")
    assert both.returncode != 0 and b"image: the policy sets" in both.stderr, both.stderr
    assert ids() == before


def test_wheelhouse_add_from_a_directory_ls_rm_and_a_refused_policy(cp, tmp_path):
    """`aamp wheelhouse add --from DIR` (wheels brought on media), `ls`, `rm`, and `aamp policy
    put` refusing a package the wheelhouse lacks, by name."""
    from wheel_files import make_wheel  # tests/wheel_files.py

    media = tmp_path / "media"
    media.mkdir()
    wheel = make_wheel(media, "aampdemo", "2.0", "X = 2\n")
    added = cp.aamp("wheelhouse", "add", "--from", str(media))
    assert added.returncode == 0, added.stderr
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    listed = cp.aamp("wheelhouse", "ls").stdout.decode()
    assert "aampdemo" in listed and "2.0" in listed and digest[:16] in listed
    ok = tmp_path / "ok.yaml"
    ok.write_text("name: demo\nimage: base\npackages: [aampdemo==2.0]\n")
    assert cp.aamp("policy", "put", str(ok)).returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: demo\nimage: base\npackages: [aampdemo==3.0]\n")
    refused = cp.aamp("policy", "put", str(bad))
    assert refused.returncode == 1
    assert "aampdemo==3.0 is not in the wheelhouse (versions there: 2.0)" in refused.stderr.decode()
    assert cp.aamp("wheelhouse", "rm", "aampdemo").returncode == 0
    assert "aampdemo" not in cp.aamp("wheelhouse", "ls").stdout.decode()
    neither = cp.aamp("wheelhouse", "add")
    assert neither.returncode == 1 and b"give requirements or --from DIR" in neither.stderr


def test_host_add_ls_drain_rm(cp):
    """`aamp up` registers its own machine as host `local`; an admin adds, drains and
    removes another host from the command line."""
    listed = cp.aamp("host", "ls")
    assert listed.returncode == 0, listed.stderr
    local = next(line for line in listed.stdout.decode().splitlines() if line.startswith("local"))
    assert local.split()[1:3] == ["active", "1"]

    added = cp.aamp("host", "add", "rack1-node2")
    assert added.returncode == 0, added.stderr
    assert added.stdout.decode().strip().startswith("aamph_")
    again = cp.aamp("host", "add", "rack1-node2")
    assert again.returncode == 1 and b"already exists" in again.stderr
    active = cp.aamp("host", "rm", "local")
    assert active.returncode == 1 and b"drain it first" in active.stderr

    assert cp.aamp("host", "drain", "rack1-node2").stdout == b"draining\n"
    assert cp.aamp("host", "rm", "rack1-node2").returncode == 0
    assert "rack1-node2" not in cp.aamp("host", "ls").stdout.decode()


@pytest.mark.usefixtures("rag_image")
def test_kb_commands_index_documents_with_a_progress_bar_and_report_failures(cp, tmp_path):
    from rag_corpus import markdown, zip_bomb_docx

    guide = tmp_path / "guide.md"
    guide.write_bytes(markdown("Guide", [("Ferries", "The Orme ferry carries 412 people.")]))
    bomb = tmp_path / "bomb.docx"
    bomb.write_bytes(zip_bomb_docx())
    assert cp.aamp("kb", "create", "handbook").returncode == 0
    added = cp.aamp("kb", "add", "handbook", str(guide), str(bomb), timeout=600)
    err = added.stderr.decode()
    assert added.returncode == 1, err  # one document failed: said, and the exit code says so
    assert f"[{'#' * 15}{'.' * 15}] 1/2 guide.md: indexed (1 chunks)" in err
    assert f"[{'#' * 30}] 2/2 bomb.docx: failed (0 chunks)" in err
    assert "bomb.docx: failed: refused: word/document.xml unpacks" in err
    shown = cp.aamp("kb", "show", "handbook").stdout.decode()
    assert "version 2, 2 document(s), 1 failed" in shown and "guide.md" in shown
    listed = cp.aamp("kb", "ls").stdout.decode()
    assert "handbook" in listed.splitlines()[1]
    removed = cp.aamp("kb", "rm-doc", "handbook", "guide.md", timeout=300)
    assert removed.returncode == 0 and "version 3, 1 document(s)" in removed.stdout.decode()
    missing = cp.aamp("kb", "show", "nope")
    assert missing.returncode == 1 and "no knowledge base named 'nope'" in missing.stderr.decode()
    assert cp.aamp("kb", "rm", "handbook").returncode == 0
    assert "handbook" not in cp.aamp("kb", "ls").stdout.decode()
