"""A host file shown read-only in a real gVisor sandbox (`SandboxSpec.read_only_files`, the way a
run gets its knowledge-base index): the guest reads it whole, and every way it tries to change
it — write, append, truncate, rename, rename over it, remove, chmod, a hard link written
through — fails in the guest, while the host file's SHA-256 stays what it was. A place outside
the workspace is refused before any sandbox starts, and a driver that cannot mount files
refuses such a request instead of quietly copying."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from driver_double import DriverDouble

from aamp.sandbox.driver import ReadOnlyFile
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import CreateRequest, InvalidRequest, SandboxManager

pytestmark = pytest.mark.usefixtures("base_image")

TARGET = "/workspace/.knowledge-bases/handbook.sqlite"
# Each attempt to change the file, from inside the guest; each must raise OSError.
ATTACKS = r"""
import errno, hashlib, json, os, sys
path = sys.argv[1]
out = {"sha256": hashlib.sha256(open(path, "rb").read()).hexdigest()}
def attempt(name, do):
    try:
        do()
        out[name] = "succeeded"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
def write(mode):
    with open(path, mode) as f:
        f.write(b"overwritten")
open("/workspace/other", "wb").write(b"other")
attempt("write", lambda: write("r+b"))
attempt("append", lambda: write("ab"))
attempt("truncate", lambda: os.truncate(path, 0))
attempt("rename", lambda: os.rename(path, "/workspace/moved.sqlite"))
attempt("replace", lambda: os.replace("/workspace/other", path))
attempt("unlink", lambda: os.unlink(path))
attempt("chmod", lambda: os.chmod(path, 0o777))
attempt("link", lambda: os.link(path, "/workspace/linked.sqlite"))
try:
    write_link = open("/workspace/linked.sqlite", "r+b")
    write_link.write(b"through a link")
    write_link.close()
    out["write_link"] = "succeeded"
except OSError as exc:
    out["write_link"] = errno.errorcode.get(exc.errno, str(exc.errno))
out["after"] = hashlib.sha256(open(path, "rb").read()).hexdigest()
print(json.dumps(out))
"""


@pytest.fixture
async def manager(settings):
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    m = SandboxManager(settings, ImageStore(settings), drivers, "gvisor", warm_pool={"base": 1})
    await m.start()
    yield m
    await m.shutdown()


async def test_the_guest_reads_a_read_only_file_and_cannot_change_it(manager, tmp_path) -> None:
    stored = tmp_path / "index.sqlite"
    stored.write_bytes(os.urandom(3 * 2**20 + 5))
    before = hashlib.sha256(stored.read_bytes()).hexdigest()
    mounted = ReadOnlyFile(stored, TARGET)
    sandbox = await manager.create(CreateRequest(read_only_files=(mounted,)))
    assert not sandbox.warm  # bound in at boot: never one of the pool's
    async with manager.use(sandbox.id) as channel:
        result, out, err = await channel.run(["python3", "-c", ATTACKS, TARGET], timeout=60)
    assert result.exit_code == 0, err.decode()
    seen = json.loads(out)
    assert seen.pop("sha256") == before == seen.pop("after")
    assert seen == {
        "write": "EROFS",  # a read-only mount: no byte of it can be written ...
        "append": "EROFS",
        "truncate": "EROFS",
        "chmod": "EROFS",
        "rename": "EBUSY",  # ... and a mount point cannot be moved, replaced or removed
        "replace": "EBUSY",
        "unlink": "EBUSY",
        "link": "EXDEV",  # nor linked to from the writable workspace
        "write_link": "ENOENT",
    }
    await manager.destroy(sandbox.id)
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == before
    assert stored.exists()


@pytest.mark.parametrize(
    "target",
    ["/opt/aamp/agent", "/run/aamp/agent.sock", "/workspace/../etc/passwd", "relative", "/proc/x"],
)
def test_a_read_only_file_goes_under_the_workspace_only(tmp_path: Path, target: str) -> None:
    source = tmp_path / "f"
    source.write_bytes(b"x")
    with pytest.raises(ValueError, match="plain path under /workspace/"):
        ReadOnlyFile(source, target)


def test_a_read_only_file_is_a_regular_host_file(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    for source in (tmp_path / "link", tmp_path, tmp_path / "missing"):
        with pytest.raises(ValueError, match="not a regular file"):
            ReadOnlyFile(source, TARGET)


async def test_a_driver_that_cannot_mount_files_refuses_rather_than_copies(
    settings, tmp_path
) -> None:
    stored = tmp_path / "index.sqlite"
    stored.write_bytes(b"x")
    double = DriverDouble()
    manager = SandboxManager(settings, ImageStore(settings), {"double": double}, "double")
    await manager.start()
    try:
        assert not manager.can_mount_files()
        with pytest.raises(InvalidRequest, match="cannot show host files read-only"):
            await manager.create(CreateRequest(read_only_files=(ReadOnlyFile(stored, TARGET),)))
        assert double.create_attempts == []
    finally:
        await manager.shutdown()
