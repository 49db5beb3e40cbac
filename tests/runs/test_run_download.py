"""What `--download DIR` refuses before writing anything, from the untrusted side: listings
whose names would leave DIR, clash, carry terminal escapes, or lack a usable hash; and a DIR
whose tree points elsewhere. (test_cli_runs.py downloads real runs' artifacts end to end.)"""

from __future__ import annotations

import hashlib

import pytest

from aamp.cli.download import DownloadError, plan

SHA = hashlib.sha256(b"8").hexdigest()


def item(name: object, size: object = 1, sha: object = SHA) -> dict[str, object]:
    return {"name": name, "size": size, "sha256": sha}


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("../escape.txt", "would leave the download directory"),
        ("a/../../escape.txt", "would leave the download directory"),
        ("/etc/cron.d/x.txt", "would leave the download directory"),
        ("a//b.txt", "would leave the download directory"),
        ("./a.txt", "would leave the download directory"),
        ("a/", "would leave the download directory"),
        ("", "not a usable file name"),
        ("x" * 256, "not a usable file name"),
        (None, "not a usable file name"),
        ("report\x1b]0;owned\x07.txt", "contains control characters"),
        ("two\nlines.txt", "contains control characters"),
    ],
)
def test_a_name_that_could_leave_the_directory_is_refused(tmp_path, name, words) -> None:
    dest = tmp_path / "dl"
    with pytest.raises(DownloadError, match=words):
        plan(dest, [item("fine.txt"), item(name)])
    assert not dest.exists()


@pytest.mark.parametrize(
    ("listing", "words"),
    [
        ([item("a.txt"), item("a.txt")], "listed an artifact name twice"),
        ([item("a"), item("a/b.txt")], "'a' would be both a file and a directory"),
        ([item("a.txt", size=-1)], "no usable size and SHA-256"),
        ([item("a.txt", size="1")], "no usable size and SHA-256"),
        ([item("a.txt", sha="0" * 63)], "no usable size and SHA-256"),
        ([item("a.txt", sha=SHA.upper())], "no usable size and SHA-256"),
        ({"name": "a.txt"}, "not a list of artifacts"),
        (["a.txt"], "not a list of artifacts"),
    ],
)
def test_a_listing_that_does_not_add_up_is_refused(tmp_path, listing, words) -> None:
    with pytest.raises(DownloadError, match=words):
        plan(tmp_path / "dl", listing)


def test_nothing_on_the_way_may_be_a_link_or_a_file(tmp_path) -> None:
    dest, outside = tmp_path / "dl", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "sub").symlink_to(outside)
    with pytest.raises(DownloadError, match="is a symbolic link; not followed"):
        plan(dest, [item("sub/x.txt")])
    (dest / "x.txt").symlink_to(outside / "x.txt")
    with pytest.raises(DownloadError, match="is a symbolic link; not followed"):
        plan(dest, [item("x.txt")])
    (dest / "plain").write_bytes(b"")
    with pytest.raises(DownloadError, match="exists and is not a directory"):
        plan(dest, [item("plain/x.txt")])
    (dest / "adir.txt").mkdir()
    with pytest.raises(DownloadError, match="exists and is not a regular file"):
        plan(dest, [item("adir.txt")])
    assert list(outside.iterdir()) == []


def test_a_file_already_there_is_kept_or_refused_never_replaced(tmp_path) -> None:
    dest = tmp_path / "dl"
    (dest / "sub").mkdir(parents=True)
    (dest / "sub" / "same.txt").write_bytes(b"8")
    (dest / "other.txt").write_bytes(b"mine")
    [kept] = plan(dest, [item("sub/same.txt")])
    assert kept.present and kept.dest == dest / "sub" / "same.txt"
    with pytest.raises(DownloadError, match="already exists with other content"):
        plan(dest, [item("other.txt")])
    assert (dest / "other.txt").read_bytes() == b"mine"
