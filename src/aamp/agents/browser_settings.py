"""An agent's browser settings: the optional `browser` block of its definition.

    browser:
      images: true            # the model takes images: screenshots reach it as image content
      image_max_bytes: 1MB    # the most one image sent to the model may weigh (default 1MB)
      dialogs: ask            # confirm/prompt dialogs: ask (the model answers; default),
                              # accept or dismiss (at once, and reported)

Without `images`, a screenshot is still taken, stored in the run's events and described to
the model, but the model's view of the page is the snapshot text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aamp.policy.units import parse_size

DIALOG_CHOICES = ("ask", "accept", "dismiss")
MIN_IMAGE_BYTES = 10_000
MAX_IMAGE_BYTES = 4_000_000
KEYS = ("images", "image_max_bytes", "dialogs")


@dataclass(frozen=True)
class BrowserSettings:
    images: bool = False
    image_max_bytes: int = 1_000_000
    dialogs: str = "ask"

    def stored(self) -> dict[str, Any] | None:
        """The canonical form for a stored definition; None when everything is the default."""
        if self == BrowserSettings():
            return None
        return {
            "images": self.images,
            "image_max_bytes": self.image_max_bytes,
            "dialogs": self.dialogs,
        }


def parse_browser_settings(raw: object, fail: Callable[[str, str], None]) -> BrowserSettings:
    """The `browser` block; every problem goes to `fail(path, message)`."""
    default = BrowserSettings()
    if not isinstance(raw, dict):
        fail("browser", f"expected a mapping with {', '.join(KEYS)}, got {type(raw).__name__}")
        return default
    for key in raw:
        if key not in KEYS:
            fail(f"browser.{key}", f"unknown field; use {KEYS}")
    images = raw.get("images", default.images)
    if not isinstance(images, bool):
        fail("browser.images", f"expected true or false, got {images!r}")
        images = default.images
    budget = default.image_max_bytes
    if "image_max_bytes" in raw:
        try:
            budget = int(parse_size(raw["image_max_bytes"]))
        except ValueError as exc:
            fail("browser.image_max_bytes", str(exc))
        else:
            if not MIN_IMAGE_BYTES <= budget <= MAX_IMAGE_BYTES:
                fail(
                    "browser.image_max_bytes",
                    f"must be from {MIN_IMAGE_BYTES} to {MAX_IMAGE_BYTES} bytes, got "
                    f"{raw['image_max_bytes']!r}",
                )
                budget = default.image_max_bytes
    dialogs = raw.get("dialogs", default.dialogs)
    if dialogs not in DIALOG_CHOICES:
        fail("browser.dialogs", f"expected one of {', '.join(DIALOG_CHOICES)}, got {dialogs!r}")
        dialogs = default.dialogs
    return BrowserSettings(images, budget, dialogs)
