"""Custom images (`image: custom-NAME`) from an admin's recipe file: a bad file is refused
naming the field; a good one builds like the built-ins (content-hashed, listed) with its
extra Debian packages, wheelhouse packages and files, and a sandbox runs from it."""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from pathlib import Path

import pytest

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from install_layout import shared_image_dir  # noqa: E402  (tests/install_layout.py)
from wheel_files import make_wheel  # noqa: E402  (tests/wheel_files.py)

from aamp.config import Settings  # noqa: E402
from aamp.sandbox.custom_images import CustomRecipeError  # noqa: E402
from aamp.sandbox.images import ImageStore  # noqa: E402
from aamp.sandbox.wheelhouse import Wheelhouse  # noqa: E402

RECIPE = """\
base: base
description: base + jq, a wheel and a settings file
debian: [jq]
packages: [aamphello==1.0]
files:
  etc/acme/report.ini: |
    [report]
    currency = EUR
"""


def _settings(tmp_path: Path, images: Path | None = None) -> Settings:
    return Settings.from_env(
        {
            "AAMP_HOME": str(tmp_path / "home"),
            "AAMP_IMAGE_DIR": str(images or tmp_path / "images"),
            "AAMP_RUNTIME_DIR": f"/run/aamp-t{secrets.token_hex(4)}",
            "AAMP_DOWNLOAD_CACHE": os.environ.get("AAMP_DOWNLOAD_CACHE")
            or "/var/cache/aamp/downloads",
        }
    )


def _recipe(settings: Settings, name: str, text: str) -> None:
    recipes = settings.home / "image-recipes"
    recipes.mkdir(parents=True, exist_ok=True)
    (recipes / f"{name}.yaml").write_text(text)


def test_a_bad_recipe_is_refused_naming_the_field(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    store = ImageStore(settings)
    _recipe(settings, "bad", "base: windows\ndebian: ['rm -rf /']\nextra: 1\n")
    with pytest.raises(CustomRecipeError) as caught:
        store.get("custom-bad")
    text = str(caught.value)
    assert "bad.yaml" in text and "base: must be one of base, browser, docs" in text
    assert "'rm -rf /' is not a Debian package" in text and "extra" in text
    _recipe(settings, "pkg", "base: base\npackages: [aamphello==1.0]\n")
    with pytest.raises(ValueError, match=r"aamphello==1\.0 is not in the wheelhouse"):
        store.build("custom-pkg", progress=lambda _: None)
    with pytest.raises(ValueError, match="unknown image 'custom-none'"):
        store.get("custom-none")


@pytest.mark.slow
async def test_a_custom_image_builds_and_a_sandbox_runs_from_it(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        pytest.skip("image builds and gVisor sandboxes need root and runsc")
    from aamp.sandbox.gvisor import GVisorDriver
    from aamp.sandbox.manager import CreateRequest, SandboxManager

    # Its own image directory beside the shared one, kept between sessions: images are keyed
    # by content hash (recipe, wheel bytes, guest agent, builder format), so a warm session
    # reuses the build only while it is exactly what this code would build.
    images = shared_image_dir().with_name(shared_image_dir().name + "-custom-test")
    settings = _settings(tmp_path, images)
    wheel = make_wheel(tmp_path, "aamphello", "1.0", "def hi():\n    return 'hi from acme'\n")
    Wheelhouse(settings).add_files([wheel], by="admin")
    _recipe(settings, "acme", RECIPE)
    store = ImageStore(settings)
    assert "custom-acme" in store.names()
    image = store.build("custom-acme", progress=print)
    assert [i.name for i in store.list()] == ["custom-acme"]
    assert store.build("custom-acme", progress=print).content_hash == image.content_hash
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    manager = SandboxManager(settings, store, drivers, "gvisor")
    await manager.start()
    try:
        sandbox = await manager.create(CreateRequest(image="custom-acme"))
        async with manager.use(sandbox.id) as channel:
            script = (
                "jq --version && python3 -c 'import aamphello; print(aamphello.hi())' "
                "&& cat /etc/acme/report.ini"
            )
            result, out, err = await channel.run(["sh", "-c", script], timeout=60)
        assert result.exit_code == 0, err
        text = out.decode()
        assert text.startswith("jq-") and "hi from acme" in text and "currency = EUR" in text
        await manager.destroy(sandbox.id)
    finally:
        await manager.shutdown()
        shutil.rmtree(settings.runtime_dir, ignore_errors=True)
    # The recipe is part of the hash: a changed file is a new image.
    _recipe(settings, "acme", RECIPE.replace("EUR", "USD"))
    assert store.content_hash("custom-acme") != image.content_hash
