"""A pattern that checks a whole value ends at `\\Z`, never `$`: Python's `$` also matches
before one trailing newline, so `^[a-z]+$` takes `"admin\\n"` (a name with a line break
reached the audit log that way). Read from the source, every compiled pattern under src/."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "aamp"
# Patterns that read lines of a document, where `$` is the line's end by intent.
LINE_PATTERNS = {"web/page.py": {"FIELD_RE"}, "guest/rag_extract.py": {"_ATX"}}


def test_no_whole_value_pattern_ends_with_a_dollar() -> None:
    found = []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        allowed = LINE_PATTERNS.get(str(path.relative_to(SRC)), set())
        for match in re.finditer(r"^(\w+) = re\.compile\((.*?)\)$", text, re.M | re.S):
            name, body = match.groups()
            literal = body.split(",")[0].rstrip().rstrip('"')
            if name not in allowed and literal.endswith("$"):
                found.append(f"{path.relative_to(SRC)}: {name}")
    assert not found, found
