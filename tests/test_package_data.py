"""Every file under src/aamp that is not Python source ships in the package: a built wheel
(not only an editable checkout) builds guest images, serves the UI and migrates the store.
Checked against pyproject.toml's `package-data` patterns (the guest's C first stage was
missing, so an installed wheel could not build an image)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "aamp"


def test_every_data_file_is_in_the_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["aamp"]
    data = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    ]
    assert data, "no data files found"
    missing = [f for f in data if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert not missing, f"not shipped in the package: {missing}"
