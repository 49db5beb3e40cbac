"""How the CLI prints for people: aligned tables and byte sizes."""

from __future__ import annotations


def table(rows: list[tuple[str, ...]]) -> None:
    """Print rows (the first is the header) in columns two spaces apart."""
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
