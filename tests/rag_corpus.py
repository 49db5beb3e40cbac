"""The knowledge-base quality set, made here with the standard library (deterministic, from a
seed): a few hundred fact passages about invented things — so no model knows the answers —
spread over PDF (a passage per page), DOCX and Markdown (a passage per heading) and HTML, and
for each four questions whose answer passage is known (`Question.key`, a phrase only that
passage has), one of each `Question.kind`:
- `literal` reuses the passage's words (every search finds it);
- `paraphrased` says it in other English words (the embeddings' strength);
- `multilingual` asks the paraphrase in German, French or Spanish, naming the place only:
  BM25 has the name alone, shared by the eight passages of that place, while the
  multilingual model understands the question;
- `code` asks by the passage's register code alone (`KX-4471B`): a made-up string that
  embeds like any other, so only the lexical index finds it.
Shared by the tests and `benchmarks/rag.py`.

The hostile documents of the tests are here too: a zip-bomb DOCX, PDFs of a million pages
(declared; through shared page-tree nodes; as a million page objects, the count lying), a
page tree that loops, malformed HTML.
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
# The paraphrased question of each kind of thing above, in German, French and Spanish.
_TRANSLATED = (
    ("In welchem Jahr ging das Wasserwerk von {name} in Betrieb?",
     "En quelle année la station de pompage de {name} a-t-elle commencé à fonctionner ?",
     "¿En qué año empezó a funcionar la estación de bombeo de {name}?"),
    ("Welchen Durchmesser hat der Spiegel der Sternwarte von {name}?",
     "Quel est le diamètre du miroir de l'observatoire de {name} ?",
     "¿Qué diámetro tiene el espejo del observatorio de {name}?"),
    ("Wie viele Fahrgäste darf die Fähre von {name} befördern?",
     "Combien de voyageurs le bac de {name} peut-il transporter ?",
     "¿Cuántos pasajeros puede llevar el transbordador de {name}?"),
    ("Wie viele Bücher besitzt die Bibliothek von {name}?",
     "Combien de livres la bibliothèque de {name} possède-t-elle ?",
     "¿Cuántos libros tiene la biblioteca de {name}?"),
    ("Wie lang ist die Brücke von {name}?",
     "Quelle est la longueur du pont de {name} ?",
     "¿Cuánto mide el puente de {name}?"),
    ("Wann werden die Trauben auf dem Weingut von {name} gelesen?",
     "Quand les raisins sont-ils cueillis au domaine viticole de {name} ?",
     "¿Cuándo se vendimian las uvas en la bodega de {name}?"),
    ("Wie viele Arbeiter haben den Tunnel von {name} gegraben?",
     "Combien d'ouvriers ont creusé le tunnel de {name} ?",
     "¿Cuántos obreros excavaron el túnel de {name}?"),
    ("Welcher Dirigent hat das Orchester von {name} gegründet?",
     "Quel chef d'orchestre a fondé l'orchestre de {name} ?",
     "¿Qué director fundó la orquesta de {name}?"),
)  # fmt: skip
_CODE_QUESTION = "Which entry is filed under register code {code}?"
KINDS = ("literal", "paraphrased", "multilingual", "code")
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
    kind: str  # one of KINDS


@dataclass(frozen=True)
class Corpus:
    files: dict[str, bytes]  # document name -> bytes
    passages: dict[str, list[Passage]]  # document name -> its passages in order
    questions: list[Question]


def _code(rng: random.Random, taken: set[str]) -> str:
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    while True:
        code = f"{rng.choice(letters)}{rng.choice(letters)}-{rng.randint(1000, 9999)}"
        code += rng.choice(letters)
        if code not in taken:
            taken.add(code)
            return code


def _passages(count: int, rng: random.Random) -> list[tuple[Passage, dict[str, str]]]:
    """Each passage, with its question of each kind."""
    out = []
    combos = [(n, i) for n in _NAMES for i in range(len(_THINGS))]
    rng.shuffle(combos)
    codes: set[str] = set()
    for name, i in combos[:count]:
        thing, fact, literal, paraphrase = _THINGS[i]
        values = {"year": rng.randint(1820, 1990), "n": rng.randint(12, 9800), "name": name,
                  "week": rng.randint(30, 44), "person": rng.choice(_PEOPLE),
                  "code": _code(rng, codes)}  # fmt: skip
        stated = fact.format(**values)
        key = f"The {name} {thing} {stated}"
        filler = " ".join(rng.sample(_FILLER, 2))
        text = f"{key}. It is filed under register code {values['code']}. {filler}"
        questions = {
            "literal": literal.format(**values),
            "paraphrased": paraphrase.format(**values),
            "multilingual": rng.choice(_TRANSLATED[i]).format(**values),
            "code": _CODE_QUESTION.format(**values),
        }
        out.append((Passage(key, f"{name} {thing}", text), questions))
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
    """`passages` fact passages over eight documents (two of each kind), with a question of
    each of KINDS each."""
    rng = random.Random(seed)
    made = _passages(passages, rng)
    kinds = ("pdf", "docx", "html", "md")
    names = [f"{kind}-guide-{n}.{kind}" for n in (1, 2) for kind in kinds]
    files: dict[str, bytes] = {}
    by_doc: dict[str, list[Passage]] = {n: [] for n in names}
    questions = []
    for i, (passage, asked) in enumerate(made):
        doc = names[i % len(names)]
        by_doc[doc].append(passage)
        questions.extend(Question(asked[kind], passage.key, doc, kind) for kind in KINDS)
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


def shared_million_page_pdf() -> bytes:
    """A PDF of a million (empty) pages in 12 KB whose page tree says it has one: the root
    names one node a thousand times, which names one page a thousand times — to a reader,
    a million pages (each reference is a page)."""
    thousand = b" ".join([b"3 0 R"] * 1000)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + thousand + b"] /Count 1 >>",
        b"<< /Type /Pages /Parent 2 0 R /Kids [" + thousand.replace(b"3", b"4") + b"] /Count 1 >>",
        b"<< /Type /Page /Parent 3 0 R /MediaBox [0 0 595 842] >>",
    ]
    return _pdf_file(objects)


def real_million_page_pdf() -> bytes:
    """A PDF of a million distinct empty page objects (79 MiB, made in about 5 s) whose page
    tree says it has one."""
    count = 1_000_000
    kids = b" ".join(b"%d 0 R" % n for n in range(3, count + 3))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + kids + b"] /Count 1 >>",
        *[b"<< /Type /Page /Parent 2 0 R >>"] * count,
    ]
    return _pdf_file(objects)


def looping_page_tree_pdf() -> bytes:
    """A PDF whose page tree's one node is its own kid."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [2 0 R] /Count 1 >>",
    ]
    return _pdf_file(objects)


def malformed_html() -> bytes:
    """Unclosed, misnested and garbage markup around one findable sentence."""
    return (b"<html><body><h2>Broken <b>heading<p>The Quillfeather archive keeps its "
            b"ledgers in vault seven.<div><table><tr><td>cell<script>if (a < b) {"
            b"</h2></i></body>\xff\xfe<<<>>> &bogus; &#xffffffff; <!-- unterminated")  # fmt: skip
