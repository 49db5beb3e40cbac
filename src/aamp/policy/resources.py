"""What a sandbox may use — cpus, memory, processes, disk — with the bounds every driver honours.

A policy's `resources:` section reads into this value (`memory: 1GiB`, `disk: 2GiB`), and the
isolation drivers take the same value in their `SandboxSpec` (`aamp.sandbox.driver`): one type
and one set of bounds, so a policy that parses is one every driver can run. Code builds it by
attribute (`Resources(memory_bytes=...)`); out of bounds is a `ValueError` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic.dataclasses import dataclass

from aamp.policy.document import DOCUMENT
from aamp.policy.units import GiB, MiB, parse_size


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number, got {value!r}")
    return value


def _cpus(value: float) -> float:
    if not 0 < value <= 64:
        raise ValueError(f"must be in (0, 64], got {value}")
    return value


def _pids(value: int) -> int:
    if not 8 <= value <= 65536:
        raise ValueError(f"must be in [8, 65536], got {value}")
    return value


def _at_least(size: int, shown: str) -> Callable[[int], int]:
    def check(value: int) -> int:
        if value < size:
            raise ValueError(f"must be at least {shown}")
        return value

    return check


@dataclass(frozen=True, config=DOCUMENT)
class Resources:
    cpus: Annotated[float, BeforeValidator(_number), AfterValidator(_cpus)] = 1.0
    memory_bytes: Annotated[
        int, BeforeValidator(parse_size), AfterValidator(_at_least(64 * MiB, "64MiB"))
    ] = Field(1 * GiB, alias="memory")
    pids: Annotated[int, BeforeValidator(_whole), AfterValidator(_pids)] = 256
    disk_bytes: Annotated[
        int, BeforeValidator(parse_size), AfterValidator(_at_least(16 * MiB, "16MiB"))
    ] = Field(2 * GiB, alias="disk")
