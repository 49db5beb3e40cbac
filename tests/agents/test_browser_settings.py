"""An agent's optional `browser` block: checked field by field, stored only when it says
something, and read back the same."""

from __future__ import annotations

import json

import pytest

from aamp.agents.browser_settings import BrowserSettings
from aamp.agents.definition import DefinitionError, definition_from_dict, stored_form

BASE = {"model": {"endpoint": "llm", "name": "m"}, "policy": "p"}


def test_the_browser_block_round_trips_and_is_left_out_when_default() -> None:
    d = definition_from_dict({**BASE, "browser": {"images": True, "image_max_bytes": "300kB"}})
    assert d.browser == BrowserSettings(images=True, image_max_bytes=300_000, dialogs="ask")
    stored = json.loads(stored_form(d))
    assert stored["browser"] == {"images": True, "image_max_bytes": 300000, "dialogs": "ask"}
    assert definition_from_dict(stored) == d
    plain = definition_from_dict(BASE)
    assert plain.browser == BrowserSettings() and "browser" not in json.loads(stored_form(plain))


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"images": "yes"}, "browser.images"),
        ({"image_max_bytes": "5GB"}, "browser.image_max_bytes"),
        ({"image_max_bytes": "lots"}, "browser.image_max_bytes"),
        ({"dialogs": "maybe"}, "browser.dialogs"),
        ({"dialog": "accept"}, "browser.dialog"),
        ("on", "browser"),
    ],
)
def test_a_bad_browser_block_names_the_field(block: object, field: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        definition_from_dict({**BASE, "browser": block})
    assert f"{field}:" in str(caught.value)
