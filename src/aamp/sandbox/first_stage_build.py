"""Builds the guest agent's first stage (`aamp/guest/first_stage.c`) into an image: one static
binary, compiled by the host's Debian toolchain at image-build time from the source in the
package, so the image never carries a compiler and the binary is exactly the source hashed
into the image's content hash.

Static, so that it needs nothing from the image's own C library; `-O2` and warnings as errors,
so that a toolchain that disagrees with the source fails the build rather than the sandbox.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = "first_stage.c"
INSTALLED_AS = "opt/aamp/agent-init"
CFLAGS = ("-O2", "-static", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-s")


class FirstStageBuildError(Exception):
    """The first stage could not be compiled; the message says why and what to install."""


def compile_first_stage(source: bytes, dest: Path) -> None:
    """Compile `source` (the C text) into the executable `dest` (mode 0755)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FirstStageBuildError(
            "'gcc' is not installed; image builds compile the guest agent's first stage with "
            "it: apt-get install gcc libc6-dev"
        )
    with tempfile.TemporaryDirectory(prefix="aamp-first-stage-") as tmp:
        src = Path(tmp) / SOURCE
        src.write_bytes(source)
        out = Path(tmp) / "agent-init"
        proc = subprocess.run(
            [gcc, *CFLAGS, "-o", str(out), str(src)], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise FirstStageBuildError(
                f"gcc could not build the guest agent's first stage (exit {proc.returncode}; "
                f"a static build needs libc6-dev): {proc.stderr[-2000:]}"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, dest)
    dest.chmod(0o755)
