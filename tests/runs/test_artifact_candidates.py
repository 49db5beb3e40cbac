"""Which files of a finished run's workspace may become artifacts, from the guest's (untrusted)
listing: /workspace/out by its path there, the browser's /workspace/downloads as
`downloads/NAME`; a download never replaces an out/ file of the same name, and a name that
could leave its folder is refused before anything is copied."""

from __future__ import annotations

import pytest

from aamp.policy.model import DataRule
from aamp.runs import artifacts as art


def test_out_and_downloads_are_candidates_and_out_wins_a_clash() -> None:
    listing = [
        ["in/sales.csv", 10],
        ["out/report.csv", 20],
        ["downloads/invoices.csv", 30],
        ["out/downloads/invoices.csv", 40],
        ["downloads/export.csv", 50],
        ["elsewhere.csv", 1],
        ["out/x", "big"],
        "garbage",
    ]
    found, clashes = art.candidates(listing)
    assert [(c.name, c.size, c.guest_path) for c in found] == [
        ("report.csv", 20, "/workspace/out/report.csv"),
        ("downloads/invoices.csv", 40, "/workspace/out/downloads/invoices.csv"),
        ("downloads/export.csv", 50, "/workspace/downloads/export.csv"),
    ]
    ((clash, reason),) = clashes
    assert clash.guest_path == "/workspace/downloads/invoices.csv"
    assert "a file in /workspace/out has this name already" in reason
    assert art.candidates(None) == ([], [])


@pytest.mark.parametrize("path", ["downloads/../../etc/passwd", "out/../in/secret.csv"])
def test_a_name_that_could_leave_its_folder_is_refused(path: str) -> None:
    (candidate,), _ = art.candidates([[path, 5]])
    rule = DataRule(max_bytes=1000, types=("csv", "passwd"))
    with pytest.raises(art.ArtifactRefused, match="not a usable artifact name"):
        art.check(candidate, rule, 0)
