"""An agent's browser settings: the optional `browser` block of its definition.

    browser:
      images: true            # the model takes images: screenshots reach it as image content
      image_max_bytes: 1MB    # the most one image sent to the model may weigh (default 1MB)
      dialogs: ask            # confirm/prompt dialogs: ask (the model answers; default),
                              # accept or dismiss (at once, and reported)

Without `images`, a screenshot is still taken, stored in the run's events and described to
the model, but the model's view of the page is the snapshot text.

The block is read the way the rest of a definition is (`aamp.policy.document`): unknown keys
are errors and each field's problem names it (`browser.dialogs: ...`). `BrowserSettings`
checks what each field is; `BrowserBlock`, the type of the definition's field, also holds the
image budget to the bounds a builder may set (code, such as a tool's test, may build any).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator
from pydantic.dataclasses import dataclass

from aamp.policy import DOCUMENT, parse_size

DIALOG_CHOICES = ("ask", "accept", "dismiss")
MIN_IMAGE_BYTES = 10_000
MAX_IMAGE_BYTES = 4_000_000


def _yes_or_no(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _dialogs(value: object) -> str:
    if not isinstance(value, str) or value not in DIALOG_CHOICES:
        raise ValueError(f"expected one of {', '.join(DIALOG_CHOICES)}, got {value!r}")
    return value


@dataclass(frozen=True, config=DOCUMENT)
class BrowserSettings:
    images: Annotated[bool, BeforeValidator(_yes_or_no)] = False
    image_max_bytes: Annotated[int, BeforeValidator(parse_size)] = 1_000_000
    dialogs: Annotated[str, BeforeValidator(_dialogs)] = "ask"

    def stored(self) -> dict[str, Any] | None:
        """The canonical form for a stored definition; None when everything is the default."""
        if self == BrowserSettings():
            return None
        return {
            "images": self.images,
            "image_max_bytes": self.image_max_bytes,
            "dialogs": self.dialogs,
        }


def _image_budget(value: object) -> int:
    budget = parse_size(value)
    if not MIN_IMAGE_BYTES <= budget <= MAX_IMAGE_BYTES:
        raise ValueError(
            f"must be from {MIN_IMAGE_BYTES} to {MAX_IMAGE_BYTES} bytes, got {value!r}"
        )
    return budget


@dataclass(frozen=True, config=DOCUMENT)
class _WrittenBlock(BrowserSettings):
    """The block as a builder writes it: the image budget within the bounds a definition may
    set. Read into a `BrowserSettings` (`BrowserBlock`), so the value is one type."""

    image_max_bytes: Annotated[int, BeforeValidator(_image_budget)] = 1_000_000


def _settings(block: BrowserSettings) -> BrowserSettings:
    return BrowserSettings(block.images, block.image_max_bytes, block.dialogs)


BrowserBlock = Annotated[_WrittenBlock, AfterValidator(_settings)]
