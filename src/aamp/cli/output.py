"""How the CLI prints for people: aligned tables, byte sizes, and text from the server made
safe for a terminal."""

from __future__ import annotations

import re

# Text a guest, a document or a host chose reaches the terminal through the server (a tool's
# output, a knowledge base's error, an answer): its escape sequences could rewrite lines, fake
# links or write the clipboard (OSC 52). Every control character but tab and newline is shown.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: object) -> str:
    """`text` for a terminal: control characters (but tab and newline) written as `\\xNN`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def table(rows: list[tuple[str, ...]]) -> None:
    """Print rows (the first is the header) in columns two spaces apart."""
    rows = [tuple(shown(cell) for cell in row) for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def size(n: float) -> str:
    """A byte count for people: 512B, 1.5KiB, 2.0MiB, 3.1GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)
