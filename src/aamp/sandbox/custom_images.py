"""Custom images: `image: custom-NAME` is built from the admin's recipe file
`$AAMP_HOME/image-recipes/NAME.yaml`, like the built-in images and cached by content hash::

    base: docs                          # a built-in image it adds to: base, browser or docs
    description: finance reports with the corporate fonts
    debian: [fonts-noto-core]           # more Debian packages (bookworm main)
    packages: [tabulate==0.9.0]         # from the offline wheelhouse only, hashes checked
    files:                              # text files written into the tree
      etc/acme/report.ini: |
        [report]
        currency = EUR

The file is read the way policies are (unknown keys and bad values are errors naming the
field). Everything it says — the wheels' SHA-256 included — is part of the image's hash.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field
from pydantic.dataclasses import dataclass

from aamp.config import Settings
from aamp.policy import DOCUMENT, PolicyError, load_yaml, validate
from aamp.sandbox.image_recipes import RECIPES, Recipe

PREFIX = "custom-"
_DEBIAN_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,99}\Z")
_PACKAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+\Z")
MAX_RECIPE_BYTES = 1_000_000


class CustomRecipeError(ValueError):
    """A recipe file that cannot be used; the message names the file and the field."""


def _base(value: object) -> str:
    names = [r.name for r in RECIPES]
    if value not in names:
        raise ValueError(f"must be one of {', '.join(names)}; got {value!r}")
    return str(value)


def _each(regex: re.Pattern[str], what: str):  # type: ignore[no-untyped-def]
    def check(value: object) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"must be a list of {what}s")
        bad = [v for v in value if not regex.match(v)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a {what}")
        return tuple(value)

    return check


def _files(value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ValueError("must map paths in the image to their text")
    for path, text in value.items():
        if not isinstance(path, str) or not isinstance(text, str):
            raise ValueError("must map paths in the image to their text")
    return tuple(sorted((str(k).lstrip("/"), str(v)) for k, v in value.items()))


@dataclass(frozen=True, config=DOCUMENT)
class CustomRecipe:
    base: Annotated[str, BeforeValidator(_base)] = Field(None, validate_default=True)
    description: str = ""
    debian: Annotated[tuple[str, ...], BeforeValidator(_each(_DEBIAN_RE, "Debian package"))] = ()
    packages: Annotated[tuple[str, ...], BeforeValidator(_each(_PACKAGE_RE, "name==version"))] = ()
    files: Annotated[tuple[tuple[str, str], ...], BeforeValidator(_files)] = ()


def recipe_path(settings: Settings, name: str) -> Path:
    return settings.home / "image-recipes" / f"{name[len(PREFIX) :]}.yaml"


def load(settings: Settings, name: str) -> tuple[Recipe, tuple[str, ...]] | None:
    """The recipe of `custom-NAME` and its wheelhouse packages; None if `name` is not a
    custom image's or there is no recipe file. Raises CustomRecipeError for a bad file."""
    if not name.startswith(PREFIX):
        return None
    path = recipe_path(settings, name)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) > MAX_RECIPE_BYTES:
        raise CustomRecipeError(f"{path}: larger than {MAX_RECIPE_BYTES} bytes")
    try:
        found = validate(CustomRecipe, load_yaml(raw.decode("utf-8")))
    except (ValueError, UnicodeDecodeError, PolicyError) as exc:
        raise CustomRecipeError(f"{path}: {exc}") from None
    if isinstance(found, list):
        problems = "; ".join(f"{where}: {why}" if where else why for where, why in found)
        raise CustomRecipeError(f"{path}: {problems}")
    description = found.description or f"{found.base} + the admin's recipe {path.name}"
    recipe = Recipe(name, description, found.base, found.debian, (), found.files)
    return recipe, found.packages
