"""Builds a recipe's native libraries into an image's tree (`image_recipes.NativeLibrary`): a C
file of a pip package already installed in the tree, checked against the upstream hash its
patch was made for, patched (patches in `aamp/sandbox/patches/`, applied exactly: no fuzz, no
offset) and compiled by the host's Debian gcc into a shared library in the package's own
directory, beside the package's library. So the image never carries a compiler, and the
library is exactly the upstream file, the patch and the flags hashed into the image's content
hash. The guest decides at run time whether its CPU can use the library (`aamp.guest.rag_engine`).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from aamp.sandbox.image_recipes import GUEST_SITE_PACKAGES, NativeLibrary, patch_text

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class NativeBuildError(Exception):
    """The library could not be built; the message says why."""


def apply_patch(source: str, patch: str) -> str:
    """`source` with the unified diff `patch` (one file) applied; every hunk must match the
    source exactly where it says. Text before the diff's `---` line is its description."""
    lines = source.splitlines(keepends=True)
    body = patch.splitlines(keepends=True)
    start = next((i for i, line in enumerate(body) if line.startswith("--- ")), None)
    if start is None or not "".join(body[start + 1 : start + 2]).startswith("+++ "):
        raise NativeBuildError("the patch has no unified diff header (---/+++)")
    out: list[str] = []
    at = 0  # next source line (0-based) not yet copied
    i = start + 2
    while i < len(body):
        hunk = _HUNK.match(body[i])
        if hunk is None:
            raise NativeBuildError(f"patch line {i + 1}: expected a hunk header: {body[i]!r}")
        old_start = int(hunk.group(1)) - 1
        if old_start < at:
            raise NativeBuildError(f"patch line {i + 1}: hunks overlap or are out of order")
        out += lines[at:old_start]
        at = old_start
        i += 1
        while i < len(body) and not body[i].startswith("@@"):
            kind, text = body[i][:1], body[i][1:]
            if kind == "\\":  # "\ No newline at end of file"
                i += 1
                continue
            if kind in (" ", "-"):
                if at >= len(lines) or lines[at] != text:
                    raise NativeBuildError(
                        f"patch line {i + 1} does not match source line {at + 1}: the source "
                        "is not the one the patch was made for"
                    )
                at += 1
            if kind in (" ", "+"):
                out.append(text)
            elif kind != "-":
                raise NativeBuildError(f"patch line {i + 1}: not a hunk line: {body[i]!r}")
            i += 1
    return "".join(out + lines[at:])


def build_native(rootfs: Path, library: NativeLibrary) -> Path:
    """Compile `library` into its package's directory in the tree at `rootfs`; its path."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise NativeBuildError(
            f"'gcc' is not installed; this image compiles {library.output} with it: "
            "apt-get install gcc libc6-dev"
        )
    package = rootfs / GUEST_SITE_PACKAGES.lstrip("/") / library.package
    upstream = package / library.source
    try:
        original = upstream.read_bytes()
    except OSError as exc:
        raise NativeBuildError(f"cannot read {upstream}: {exc.strerror}") from None
    digest = hashlib.sha256(original).hexdigest()
    if digest != library.source_sha256:
        raise NativeBuildError(
            f"{library.package}/{library.source} has sha256 {digest}, not the "
            f"{library.source_sha256} that {library.patch} was made for"
        )
    patched = apply_patch(original.decode(), patch_text(library.patch))
    dest = package / library.output
    with tempfile.TemporaryDirectory(prefix="aamp-native-") as tmp:
        # Beside the upstream file, so its own headers are found as they are upstream.
        src = package / f".aamp-{library.source}"
        obj = Path(tmp) / "library.o"
        try:
            src.write_text(patched)
            # Compiled and linked apart, so -fopenmp does not link the host's libgomp:
            # the library links what its `link` arguments name (the wheel's own runtime).
            for argv in (
                [gcc, *library.cflags, "-c", str(src), "-o", str(obj)],
                [gcc, "-shared", "-s", "-o", str(dest), str(obj), *library.link],
            ):
                proc = subprocess.run(
                    argv, cwd=package, capture_output=True, text=True, check=False
                )
                if proc.returncode != 0:
                    raise NativeBuildError(
                        f"gcc could not build {library.output} (exit {proc.returncode}): "
                        f"{proc.stderr[-2000:]}"
                    )
        finally:
            src.unlink(missing_ok=True)
    dest.chmod(0o644)
    return dest
