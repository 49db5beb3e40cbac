"""Reading a document a person wrote — a policy, an agent definition — into frozen values.

One way for every such document, on one library (pydantic v2):

- Its text is read by `source.load_yaml`, which refuses a mapping that repeats a key: a
  repeated `deny:` must not silently drop rules.
- The values are pydantic dataclasses configured with `DOCUMENT` (`extra="forbid"`: an
  unknown key such as `egres:` is an error, never a dropped boundary). A document is
  validated by its keys (the field aliases: `memory`, `ttl`), never by attribute names.
- `validate(kind, data)` returns the value or `problems`: every fault at once, each a
  (field path, message) pair in the words people read — `egress.allow[2]: ...`,
  `resources.memory: expected a size such as 50MB or 1GiB, got 'lots'`. A validator names a
  place below its own field by raising `Problem` (`lifetime.idle`, `tools[3]`).

Leaf checks raise `ValueError` with the message alone; this module adds the path.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar

from pydantic import BeforeValidator, ConfigDict, TypeAdapter, ValidationError

T = TypeVar("T")

# Unknown keys are errors; a document names fields by their keys (aliases), code by attribute.
DOCUMENT = ConfigDict(extra="forbid", validate_by_alias=True, validate_by_name=True)


class Problem(ValueError):
    """Raised by a validator for places below its field: `where` holds (sub-path, message)
    pairs, a sub-path being a key, an index, or a tuple of them (`("idle",)`, `(3,)`)."""

    def __init__(self, where: Iterable[tuple[object, str]]) -> None:
        self.where = [(sub if isinstance(sub, tuple) else (sub,), text) for sub, text in where]
        super().__init__("; ".join(text for _, text in self.where))


def kind_of(value: object) -> str:
    """What a value is, in words (`expected a list, got text`)."""
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "text", bool: "true/false"}.get(
        type(value), type(value).__name__
    )


def path(loc: Iterable[object]) -> str:
    """`('egress', 'allow', 2)` -> `egress.allow[2]`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validate(kind: type[T], data: object) -> T | list[tuple[str, str]]:
    """`data` as a `kind` (a pydantic dataclass), or its problems, each (path, message)."""
    try:
        return _adapter(kind).validate_python(data, by_alias=True, by_name=False)
    except ValidationError as exc:
        return problems(exc, kind)


def problems(exc: ValidationError, root: type) -> list[tuple[str, str]]:
    """A pydantic `ValidationError` about a `root` value as (path, message) pairs."""
    out: list[tuple[str, str]] = []
    for error in exc.errors(include_url=False):
        loc, found = tuple(error["loc"]), error.get("input")
        raised = error.get("ctx", {}).get("error")
        if isinstance(raised, Problem):
            out.extend((path(loc + sub), text) for sub, text in raised.where)
        elif isinstance(raised, ValueError | AssertionError):
            out.append((path(loc), str(raised)))
        elif error["type"] in ("unexpected_keyword_argument", "invalid_key"):
            keys = ", ".join(_keys(root, loc[:-1]))
            where = ".".join(filter(None, (path(loc[:-1]), str(loc[-1]))))  # a key, not an index
            out.append((where, f"unknown key; expected one of: {keys}"))
        elif error["type"] in ("dataclass_type", "dataclass_exact_type", "dict_type"):
            out.append((path(loc), f"expected a mapping, got {kind_of(found)}"))
        elif error["type"] in ("tuple_type", "list_type"):
            out.append((path(loc), f"expected a list, got {kind_of(found)}"))
        elif error["type"] == "string_type":
            out.append((path(loc), f"expected text, got {kind_of(found)}"))
        elif error["type"] == "missing":
            out.append((path(loc), "is required"))
        else:
            out.append((path(loc), error["msg"]))
    return out


def text(check: Callable[[str], str | None]) -> Callable[[object], str]:
    """An item reader for `distinct`: a text that `check` (which returns what is wrong with
    it, or None) accepts."""

    def read(value: object) -> str:
        if not isinstance(value, str):
            raise ValueError(f"expected text, got {kind_of(value)}")
        problem = check(value)
        if problem:
            raise ValueError(problem)
        return value

    return read


def distinct(item: Callable[[object], T], *, not_a_list: str | None = None) -> Any:
    """The type of a list of distinct items, each read by `item` (which raises `ValueError`
    saying what is wrong with it): every bad item and every repeat is named by its index
    (`services[2]: ...`). `not_a_list` is what a value that is no list (or an empty one) is
    told; without it, any list may be empty."""

    def read(value: object) -> tuple[T, ...]:
        if not isinstance(value, list | tuple) or (not_a_list and not value):
            raise ValueError(not_a_list or f"expected a list, got {kind_of(value)}")
        out: list[T] = []
        wrong: list[tuple[object, str]] = []
        for index, raw in enumerate(value):
            try:
                got = item(raw)
            except ValueError as exc:
                wrong.append((index, str(exc)))
                continue
            if got in out:
                wrong.append((index, f"{raw!r} is listed twice"))
            else:
                out.append(got)
        if wrong:
            raise Problem(wrong)
        return tuple(out)

    return Annotated[tuple[Any, ...], BeforeValidator(read)]


@functools.cache
def _adapter(kind: type[T]) -> TypeAdapter[T]:
    return TypeAdapter(kind)


def _keys(root: type, loc: tuple[object, ...]) -> list[str]:
    """The keys the dataclass at `loc` below `root` takes, in order (for "unknown key")."""
    current: Any = root
    for part in loc:
        current = _inner(current)
        if isinstance(part, int):
            args = typing.get_args(current)
            current = args[0] if args else Any
            continue
        fields = {_key(f): f for f in dataclasses.fields(current)} if _is_class(current) else {}
        if part not in fields:
            return []
        current = _hints(current)[fields[part].name]
    current = _inner(current)
    return [_key(f) for f in dataclasses.fields(current)] if _is_class(current) else []


def _is_class(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def _inner(kind: Any) -> Any:
    """A field's type without `Annotated[...]` and `X | None`."""
    while True:
        origin = typing.get_origin(kind)
        if origin is Annotated:
            kind = typing.get_args(kind)[0]
        elif origin in (typing.Union, types.UnionType):
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        else:
            return kind


def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind, include_extras=True)


def _key(field: dataclasses.Field[Any]) -> str:
    """A field's key in a document: its alias if it has one (pydantic keeps the `Field`)."""
    return getattr(field.default, "alias", None) or field.name
