"""Real wheel files made on the spot, for the wheelhouse tests (no index needed)."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    code: str,
    requires: Sequence[str] = (),
    extra: Mapping[str, str] | None = None,
) -> Path:
    """A real (pure-Python) wheel: a module, METADATA, WHEEL, the `extra` files (path: text)
    and a RECORD with hashes. The same arguments make the same bytes (every entry dated
    1980-01-01, as reproducible wheels are), so an image built with it is found again by its
    content hash."""
    dist = f"{name}-{version}.dist-info"
    files = {
        **(extra or {}),
        f"{name}.py": code,
        f"{dist}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            entry = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            entry.external_attr = 0o600 << 16  # what `writestr(name, ...)` gives an entry
            z.writestr(entry, text)
    return wheel


def linked_image_dir(tmp_path: Path, base_image) -> Path:
    """An image directory of this test's own holding the shared base image as hard links, so
    the derived layers this test builds are its own (and go with it)."""
    images = tmp_path / "images"
    (images / "base").mkdir(parents=True)
    subprocess.run(
        ["cp", "-al", str(base_image.root.parent), str(images / "base" / base_image.content_hash)],
        check=True,
    )
    (images / "base" / "current").symlink_to(base_image.content_hash)
    return images
