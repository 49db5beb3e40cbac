"""A package's surface table (`aamp.surface`): rows by module, a long row going on indented;
a line that belongs to no row, or a module or name given twice, is refused."""

from __future__ import annotations

import pytest

from aamp.surface import rows, surface


def test_rows_by_module_a_long_row_going_on() -> None:
    table = """
    authz: allowed RULES
    directory: Directory UserInfo
        TokenInfo
    channel.errors: GuestError
    """
    assert rows(table) == {
        "authz": ["allowed", "RULES"],
        "directory": ["Directory", "UserInfo", "TokenInfo"],
        "channel.errors": ["GuestError"],
    }


@pytest.mark.parametrize(
    "table",
    [
        "    allowed RULES\n",  # before any module
        "    authz: allowed\n    more\n",  # not indented past its row
        "    authz: allowed\n    authz: RULES\n",  # one module twice
        "    : allowed\n",  # no module
    ],
)
def test_a_line_of_no_row_is_refused(table: str) -> None:
    with pytest.raises(ValueError, match="surface"):
        rows(table)


def test_a_name_declared_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        surface("aamp.identity", "    authz: allowed\n    model: allowed\n")


def test_a_declared_name_loads_its_module_on_first_use() -> None:
    names, load = surface("aamp.identity", "    authz: allowed\n", modules=("model",))
    assert names == ["allowed", "model"]
    assert load("allowed").__module__ == "aamp.identity.authz"
    with pytest.raises(AttributeError):
        load("Directory")
