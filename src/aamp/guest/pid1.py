"""The agent as the sandbox's first process: pid 1 mounts what a container runtime would have
(``--init``, Firecracker), forks the agent, reaps every orphan and exits with its status."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket

TYPE_CHECKING = False  # typing is not imported at run time (see `aamp.guest.agent`)
if TYPE_CHECKING:
    from collections.abc import Callable

MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8


def _mount(source: str, target: str, fstype: str, flags: int, data: str = "") -> None:
    import ctypes  # only pid 1 in a Firecracker guest needs it

    if os.path.ismount(target):
        return
    os.makedirs(target, exist_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.mount(
        source.encode(), target.encode(), fstype.encode(), ctypes.c_ulong(flags), data.encode()
    )
    if rc != 0:
        err = ctypes.get_errno()
        if err != errno.EBUSY:
            raise OSError(err, f"mount {fstype} on {target}: {os.strerror(err)}")


def init_system(hostname: str) -> None:
    """What a container runtime would otherwise have done for us."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755")
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    _mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    socket.sethostname(hostname)


def run_as_pid1(agent_main: Callable[[], int]) -> int:
    """Fork: the child is the agent; this process stays pid 1, reaps every orphan that is
    re-parented to it, forwards SIGTERM/SIGINT to the agent, and exits with its status."""
    child = os.fork()
    if child == 0:
        code = 1
        try:
            code = agent_main()
        finally:
            os._exit(code)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code
