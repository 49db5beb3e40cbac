"""The knowledge-base quality set, made here with the standard library (deterministic, from a
seed): a few hundred fact passages about invented things — so no model knows the answers —
spread over PDF (a passage per page), DOCX and Markdown (a passage per heading) and HTML, and
for each a question whose answer passage is known (`Question.key`, a phrase only that passage
has). Half the questions reuse the passage's words (BM25's strength), half paraphrase them
(the embeddings'). Shared by the tests and `benchmarks/rag.py`.

The hostile documents of the tests are here too: a zip-bomb DOCX, a PDF declaring a million
pages, malformed HTML.
"""

from __future__ import annotations

import io
import random
import zipfile
from dataclasses import dataclass

from office_files import W

_NAMES = ("Arvel", "Brisk", "Corran", "Dunmore", "Elsby", "Fenwick", "Garrow", "Holt", "Ingle",
          "Jarvis", "Kestrel", "Lowick", "Marsh", "Norcott", "Orme", "Pelham", "Quarry",
          "Rendle", "Stoke", "Tarrant", "Ulver", "Vance", "Wexley", "Yarrow", "Zennor")  # fmt: skip
_THINGS = (
    (
        "pumping station",
        "was commissioned in {year}",
        "When was the {name} pumping station commissioned?",
        "In which year did the {name} pumping station start operating?",
    ),
    (
        "observatory",
        "has a mirror {n} centimetres across",
        "How wide is the mirror of the {name} observatory?",
        "What is the telescope aperture at {name}'s star-watching facility?",
    ),
    (
        "ferry",
        "carries at most {n} passengers",
        "How many passengers can the {name} ferry carry?",
        "What is the boat capacity of the {name} crossing vessel?",
    ),
    (
        "library",
        "holds {n} thousand volumes",
        "How many volumes does the {name} library hold?",
        "How big is the book collection of {name}'s public reading room?",
    ),
    (
        "bridge",
        "spans {n} metres",
        "How long is the span of the {name} bridge?",
        "What distance does the {name} river crossing structure cover?",
    ),
    (
        "vineyard",
        "harvests its grapes in week {week}",
        "In which week does the {name} vineyard harvest?",
        "When are the grapes picked at the {name} wine estate?",
    ),
    (
        "tunnel",
        "was dug by {n} workers",
        "How many workers dug the {name} tunnel?",
        "How large was the crew that excavated the {name} underground passage?",
    ),
    (
        "orchestra",
        "was founded by conductor {person}",
        "Who founded the {name} orchestra?",
        "Which conductor started the {name} symphonic ensemble?",
    ),
)
_PEOPLE = ("Ilse Marrow", "Tomas Quell", "Ruth Abernathy", "Ода Линд", "Kenji Hollis",
           "Marta Oyelaran", "Piet Vandersloot", "Sunniva Aakre")  # fmt: skip
_FILLER = (
    "The site is reached by a narrow road that floods in spring.",
    "Local records from the period are incomplete, and some were lost in a fire.",
    "Visitors are asked to book guided tours two weeks ahead.",
    "A small museum next to the entrance explains the history of the district.",
    "Maintenance is funded jointly by the county and a volunteer trust.",
)


@dataclass(frozen=True)
class Passage:
    key: str  # a phrase only this passage has: how a search hit is judged
    title: str
    text: str


@dataclass(frozen=True)
class Question:
    text: str
    key: str
    document: str
    paraphrased: bool


@dataclass(frozen=True)
class Corpus:
    files: dict[str, bytes]  # document name -> bytes
    passages: dict[str, list[Passage]]  # document name -> its passages in order
    questions: list[Question]


def _passages(count: int, rng: random.Random) -> list[tuple[Passage, str, str]]:
    out = []
    combos = [(n, t) for n in _NAMES for t in _THINGS]
    rng.shuffle(combos)
    for name, (thing, fact, literal, paraphrase) in combos[:count]:
        values = {"year": rng.randint(1820, 1990), "n": rng.randint(12, 9800), "name": name,
                  "week": rng.randint(30, 44), "person": rng.choice(_PEOPLE)}  # fmt: skip
        stated = fact.format(**values)
        key = f"The {name} {thing} {stated}"
        filler = " ".join(rng.sample(_FILLER, 2))
        text = f"{key}. {filler}"
        out.append(
            (Passage(key, f"{name} {thing}", text), literal.format(**values),
             paraphrase.format(**values))
        )  # fmt: skip
    return out


def pdf(pages: list[str]) -> bytes:
    """A PDF with one page per string (Helvetica, wrapped lines), made by hand."""
    objects: list[bytes] = [b"", b""]  # 1: catalog, 2: pages; filled below
    font = len(objects) + 1
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    kids = []
    for text in pages:
        lines, line = [], ""
        for word in text.split():
            if len(line) + len(word) > 80:
                lines.append(line)
                line = ""
            line = f"{line} {word}".strip()
        lines.append(line)
        ops = ["BT", "/F1 11 Tf", "14 TL", "50 780 Td"]
        for ln in lines:
            escaped = ln.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            ops.append(f"({escaped.encode('latin-1', 'replace').decode('latin-1')}) Tj T*")
        ops.append("ET")
        stream = "\n".join(ops).encode("latin-1", "replace")
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
        content = len(objects)
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents %d 0 R "
            b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (content, font)
        )
        kids.append(len(objects))
    objects[0] = b"<< /Type /Catalog /Pages 2 0 R >>"
    refs = " ".join(f"{k} 0 R" for k in kids).encode()
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (refs, len(kids))
    return _pdf_file(objects)


def _pdf_file(objects: list[bytes]) -> bytes:
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n"
              % (len(objects) + 1, xref))  # fmt: skip
    return out.getvalue()


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_DOCX_TYPES = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
    '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.'
    'relationships+xml"/><Default Extension="xml" ContentType="application/xml"/>'
    '<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-'
    'officedocument.wordprocessingml.document.main+xml"/>'
    '<Override PartName="/word/styles.xml" ContentType="application/vnd.openxmlformats-'
    'officedocument.wordprocessingml.styles+xml"/></Types>'
)
_RELS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_PKG_RELS = "http://schemas.openxmlformats.org/package/2006/relationships"


def docx(sections: list[tuple[str, str]]) -> bytes:
    """A Word file of (heading, paragraph) sections, headings in Word's style Heading 1 (a
    styles part, as Word writes one)."""
    body = "".join(
        f'<w:p><w:pPr><w:pStyle w:val="Heading1"/></w:pPr><w:r><w:t>{_xml(h)}</w:t></w:r></w:p>'
        f'<w:p><w:r><w:t xml:space="preserve">{_xml(t)}</w:t></w:r></w:p>'
        for h, t in sections
    )
    styles = (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:styles xmlns:w="{W}">'
        '<w:style w:type="paragraph" w:default="1" w:styleId="Normal"><w:name w:val="Normal"/>'
        '</w:style><w:style w:type="paragraph" w:styleId="Heading1">'
        '<w:name w:val="heading 1"/><w:basedOn w:val="Normal"/></w:style></w:styles>'
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", _DOCX_TYPES)
        z.writestr(
            "_rels/.rels",
            f'<Relationships xmlns="{_PKG_RELS}"><Relationship Id="rId1" '
            f'Type="{_RELS}/officeDocument" Target="word/document.xml"/></Relationships>',
        )
        z.writestr("word/_rels/document.xml.rels", f'<Relationships xmlns="{_PKG_RELS}">'
                   f'<Relationship Id="rId1" Type="{_RELS}/styles" Target="styles.xml"/>'
                   "</Relationships>")  # fmt: skip
        z.writestr("word/styles.xml", styles)
        z.writestr(
            "word/document.xml",
            f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="{W}">'
            f"<w:body>{body}</w:body></w:document>",
        )
    return out.getvalue()


def html(title: str, sections: list[tuple[str, str]]) -> bytes:
    parts = "".join(f"<h2>{_xml(h)}</h2>\n<p>{_xml(t)}</p>\n" for h, t in sections)
    return (f"<!doctype html><html><head><title>{_xml(title)}</title>"
            f"<style>p {{ color: #333 }}</style><script>var x = 'not text';</script></head>"
            f"<body><h1>{_xml(title)}</h1>\n{parts}</body></html>").encode()  # fmt: skip


def markdown(title: str, sections: list[tuple[str, str]]) -> bytes:
    return (f"# {title}\n\n" + "".join(f"## {h}\n\n{t}\n\n" for h, t in sections)).encode()


def make_corpus(passages: int = 200, seed: int = 15) -> Corpus:
    """`passages` fact passages over eight documents (two of each kind), with two questions
    each (literal and paraphrased)."""
    rng = random.Random(seed)
    made = _passages(passages, rng)
    kinds = ("pdf", "docx", "html", "md")
    names = [f"{kind}-guide-{n}.{kind}" for n in (1, 2) for kind in kinds]
    files: dict[str, bytes] = {}
    by_doc: dict[str, list[Passage]] = {n: [] for n in names}
    questions = []
    for i, (passage, literal, paraphrase) in enumerate(made):
        doc = names[i % len(names)]
        by_doc[doc].append(passage)
        questions.append(Question(literal, passage.key, doc, False))
        questions.append(Question(paraphrase, passage.key, doc, True))
    for doc, items in by_doc.items():
        sections = [(p.title, p.text) for p in items]
        kind = doc.rsplit(".", 1)[1]
        if kind == "pdf":
            files[doc] = pdf([p.text for p in items])
        elif kind == "docx":
            files[doc] = docx(sections)
        elif kind == "html":
            files[doc] = html(doc, sections)
        else:
            files[doc] = markdown(doc, sections)
    return Corpus(files, by_doc, questions)


def zip_bomb_docx() -> bytes:
    """A DOCX whose document part unpacks 100 MB of zeros from about 100 KB."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", b"\0" * 100_000_000)
    return out.getvalue()


def million_page_pdf() -> bytes:
    """A small PDF whose page tree declares a million (empty) pages: one page object
    referenced a million times would be gigabytes; the declared count is the attack."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1000000 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] >>",
    ]
    return _pdf_file(objects)


def malformed_html() -> bytes:
    """Unclosed, misnested and garbage markup around one findable sentence."""
    return (b"<html><body><h2>Broken <b>heading<p>The Quillfeather archive keeps its "
            b"ledgers in vault seven.<div><table><tr><td>cell<script>if (a < b) {"
            b"</h2></i></body>\xff\xfe<<<>>> &bogus; &#xffffffff; <!-- unterminated")  # fmt: skip
