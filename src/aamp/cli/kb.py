"""`aamp kb create|add|rm-doc|ls|show|rm`: knowledge bases over the API. `add NAME FILE...`
uploads one document per request — each indexed in its own sandbox on the control plane — and
draws a progress bar on stderr as they finish; a document that fails to index is reported with
the reason, and the others go on."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import quote

from aamp.cli.output import shown, size, table
from aamp.cli.parsing import action, actions

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from typing import Any

    from aamp.client import Client

BAR = 30


def kb_arguments(p: argparse.ArgumentParser) -> None:
    kb = actions(p)
    action(kb, "create", "make an empty knowledge base", "name")
    add = action(kb, "add", "add (or replace) documents and index them", "name")
    add.add_argument("files", nargs="+", metavar="FILE", help="PDF, DOCX, HTML, Markdown, text")
    action(kb, "rm-doc", "remove one document (re-indexes only it)", "name", "document")
    action(kb, "ls", "list the knowledge bases")
    action(kb, "show", "a knowledge base's documents and versions", "name")
    action(kb, "rm", "remove a knowledge base", "name")


def _summary(kbs: list[dict[str, Any]]) -> None:
    rows = [("NAME", "VERSION", "DOCUMENTS", "FAILED", "CREATED BY")]
    for kb in kbs:
        rows.append((kb["name"], str(kb["version"]), str(kb["documents"]), str(kb["failed"]),
                     kb["created_by"]))  # fmt: skip
    table(rows)


def _show(kb: dict[str, Any]) -> None:
    print(f"{shown(kb['name'])}: version {kb['version']}, {kb['documents']} document(s), "
          f"{kb['failed']} failed; index {(kb['index'] or '-')[:16]}")  # fmt: skip
    rows = [("DOCUMENT", "TYPE", "SIZE", "STATUS", "CHUNKS", "SHA-256", "ERROR")]
    for d in kb["document_list"]:
        rows.append((d["name"], d["type"], size(d["size"]), d["status"], str(d["chunks"]),
                     d["sha256"][:16], d["error"] or ""))  # fmt: skip
    table(rows)


def _bar(done: int, total: int, line: str) -> None:
    filled = BAR * done // max(total, 1)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (BAR - filled)}] {done}/{total} {shown(line)}\x1b[K")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _add(client: Client, name: str, files: list[str]) -> int:
    paths = [Path(f) for f in files]
    for path in paths:
        if not path.is_file():
            raise ValueError(f"{path}: no such file")
    failed, latest = 0, None
    _bar(0, len(paths), "")
    for n, path in enumerate(paths, 1):
        url = f"/v1/knowledge-bases/{quote(name)}/documents/{quote(path.name)}"
        latest = client.call("PUT", url, content=path.read_bytes())
        entry = next(d for d in latest["document_list"] if d["name"] == path.name)
        if entry["status"] != "indexed":
            failed += 1
            sys.stderr.write(f"\r{path.name}: failed: {shown(entry['error'])}\x1b[K\n")
        _bar(n, len(paths), f"{path.name}: {entry['status']} ({entry['chunks']} chunks)")
    assert latest is not None
    _show(latest)
    return 1 if failed else 0


def kb(client: Client, args: argparse.Namespace) -> int:
    base = "/v1/knowledge-bases"
    if args.action == "ls":
        _summary(client.call("GET", base))
    elif args.action == "create":
        _summary([client.call("POST", base, json={"name": args.name})])
    elif args.action == "show":
        _show(client.call("GET", f"{base}/{quote(args.name)}"))
    elif args.action == "rm":
        client.call("DELETE", f"{base}/{quote(args.name)}")
        print(f"removed knowledge base {args.name}")
    elif args.action == "rm-doc":
        url = f"{base}/{quote(args.name)}/documents/{quote(args.document)}"
        _show(client.call("DELETE", url))
    else:
        return _add(client, args.name, args.files)
    return 0
