"""Settings are read-only and compared by value; a changed copy is made with `replace`."""

from __future__ import annotations

from pathlib import Path

import pytest

from aamp.config import Settings


def test_replace_makes_a_changed_copy_and_leaves_the_original() -> None:
    first = Settings(home=Path("/h"), runtime_dir=Path("/r"), image_dir=Path("/i"), env={"A": "1"})
    second = first.replace(listen_port=9999, env={"A": "2"})
    assert (second.listen_port, second.env, second.home) == (9999, {"A": "2"}, Path("/h"))
    assert (first.listen_port, first.env) != (9999, {"A": "2"})
    assert first.replace() == first
    with pytest.raises(TypeError, match="no colour"):
        first.replace(colour="red")
    with pytest.raises(AttributeError, match="read-only"):
        first.listen_port = 1  # type: ignore[misc]
