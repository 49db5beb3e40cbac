"""A package's public surface: declared once in its `__init__`, loaded name by name on use.

A package's `__init__` lists, by module, the names other packages may import from it::

    __all__, __getattr__ = surface(__name__, {
        "authz": ("allowed",),
        "directory": ("Directory",),
    })

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
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any


def surface(
    package: str,
    names_by_module: Mapping[str, Iterable[str]],
    *,
    modules: Iterable[str] = (),
) -> tuple[list[str], Callable[[str], Any]]:
    """`__all__` and the module `__getattr__` (PEP 562) for `package`'s declared names."""
    where: dict[str, str | None] = dict.fromkeys(modules)  # None: the name is a module
    for module, names in names_by_module.items():
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
