"""A package's public surface: declared once in its `__init__`, loaded name by name on use.

A package's `__init__` lists, one module a row, the names other packages may import from it
(a row too long for a line goes on, indented, on the next; the module's own order is kept)::

    __all__, __getattr__ = surface(
        __name__,
        '''
        authz: allowed RULES
        directory: Directory UserInfo
            TokenInfo
        ''',
    )

`from aamp.identity import allowed` then imports `aamp.identity.authz` alone: a part that
needs one light module (deciding a request) does not load the rest of the package (a
database, a driver). A whole module may be the surface (`modules=("guest_scripts",)`): its
public names are then the package's. Names not listed are the package's own business;
`tests/test_layout.py` refuses an import of them from another package. This module imports
nothing of aamp.
"""

from __future__ import annotations

import importlib
import sys

TYPE_CHECKING = False  # the CLI loads this module (`aamp`'s SDK names): typing costs ~15 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any


def rows(table: str) -> dict[str, list[str]]:
    """`table`'s names by module: `module: name name` rows, a row going on on the lines
    after it that are indented further and name no module."""
    by_module: dict[str, list[str]] = {}
    names: list[str] | None = None
    indent = 0
    for line in table.splitlines():
        if not line.strip():
            continue
        head, colon, rest = line.partition(":")
        depth = len(line) - len(line.lstrip())
        if colon:
            module = head.strip()
            if not module or module in by_module or " " in module:
                raise ValueError(f"a surface row names no module, or one twice: {line.strip()!r}")
            names, indent = by_module.setdefault(module, []), depth
            names.extend(rest.split())
        elif names is not None and depth > indent:
            names.extend(line.split())
        else:
            raise ValueError(f"a surface line belongs to no module's row: {line.strip()!r}")
    return by_module


def surface(
    package: str, table: str, *, modules: Iterable[str] = ()
) -> tuple[list[str], Callable[[str], Any]]:
    """`__all__` and the module `__getattr__` (PEP 562) for the names `table` declares."""
    where: dict[str, str | None] = dict.fromkeys(modules)  # None: the name is a module
    for module, names in rows(table).items():
        for name in names:
            if name in where:
                raise ValueError(f"{package}: {name!r} is declared twice")
            where[name] = f"{package}.{module}"

    def load(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = where[name]
        if module is None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    return sorted(where), load
