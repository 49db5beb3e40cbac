"""Text a guest, a document or a model chose reaches a person's terminal through the CLI (a
tool's output and the answer while a run is followed, a knowledge base's document errors,
every table): its escape sequences are shown, not obeyed — they could rewrite lines, fake
links or write the clipboard (OSC 52). Tabs and newlines stay."""

from __future__ import annotations

from aamp.cli.kb import _show
from aamp.cli.output import shown, table
from aamp.cli.runs import describe

ESC = "\x1b]52;c;cHduZWQ=\x07\x1b[2K\x1b[1A\r\x9b"  # clipboard write, erase line, up, CR, CSI


def _clean(text: str) -> None:
    for c in "\x1b\x07\r\x9b":
        assert c not in text, repr(text)


def test_a_followed_runs_tool_output_and_answer_are_shown_escaped() -> None:
    result = describe("tool.result", {"ok": True, "text": "x" + ESC})
    _clean(result)
    assert "\\x1b]52;c;" in result
    finished = describe("run.finished", {"status": "succeeded", "answer": "a\tb\n" + ESC})
    _clean(finished)
    assert "a\tb\n\\x1b" in finished  # tabs and line breaks kept


def test_tables_and_a_knowledge_bases_errors_are_shown_escaped(capsys) -> None:
    doc = {"name": "a" + ESC + ".pdf", "type": "pdf", "size": 1, "status": "failed",
           "chunks": 0, "sha256": "0" * 64, "error": "bad " + ESC}  # fmt: skip
    _show({"name": "kb", "version": 1, "documents": 1, "failed": 1, "index": None,
           "document_list": [doc]})  # fmt: skip
    table([("A",), (ESC,)])
    out = capsys.readouterr().out
    _clean(out)
    assert "bad \\x1b]52" in out


def test_shown_leaves_plain_text_alone() -> None:
    assert shown("plain — text, ünïcode\tand\nlines") == "plain — text, ünïcode\tand\nlines"
    assert shown("\x00\x7f") == "\\x00\\x7f"
