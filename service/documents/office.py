"""Office Open XML files: .docx through python-docx (every paragraph of the body, its tables and text boxes,
headers, footers and notes), .pptx through python-pptx (every paragraph of every slide's shapes and tables, and
of the speaker notes), .xlsx at the archive's XML (every text cell, in the shared strings and inline; numbers and
formulas are not text and stay as they are, as does every part the text is not in).

All three hold paragraphs of runs. A paragraph of plain text runs is translated whole, its runs grouped by
formatting and placed back by the alignment (formats.runs_markup); a paragraph that holds more (hyperlinks,
fields, tabs, drawings) has each of its text nodes translated alone, so nothing around them moves.
"""

from __future__ import annotations

import copy
import io
import re
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from service.documents.formats import Document, DocumentError, Segment, runs_segment, split_runs, with_spacing

MAX_UNPACKED_BYTES = 256 * 1024 * 1024  # what an archive may expand to (a zip bomb stops here)
MAX_ARCHIVE_MEMBERS = 10_000
WORD = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
DRAWING = "http://schemas.openxmlformats.org/drawingml/2006/main"
SHEET = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"


def open_archive(data: bytes, kind: str) -> zipfile.ZipFile:
    """`data` as a zip archive that expands within the limits, else DocumentError."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, ValueError):
        raise DocumentError(
            f"the file is not a valid {kind} (not a zip archive: corrupt, encrypted, or another format)"
        ) from None
    if len(members) > MAX_ARCHIVE_MEMBERS or sum(m.file_size for m in members) > MAX_UNPACKED_BYTES:
        raise DocumentError(f"the {kind} archive expands past {MAX_UNPACKED_BYTES // 2**20} MiB")
    return archive


@dataclass(frozen=True)
class Grammar:
    """How one format's paragraphs hold runs: its element names (Clark notation)."""

    paragraph: str
    run: str
    text: str
    properties: str
    plain_children: frozenset[str]  # a paragraph's children besides runs that translating it whole leaves alone
    run_children: frozenset[str]  # a plain run's children

    @classmethod
    def of(cls, namespace: str, paragraph: str, plain: Iterable[str], run_extra: Iterable[str] = ()) -> Grammar:
        name = lambda local: f"{{{namespace}}}{local}"  # noqa: E731
        return cls(
            name(paragraph), name("r"), name("t"), name("rPr"), frozenset(map(name, plain)),
            frozenset(map(name, ("t", "rPr", *run_extra))),
        )


WORD_GRAMMAR = Grammar.of(
    WORD, "p", ("pPr", "bookmarkStart", "bookmarkEnd", "proofErr", "commentRangeStart", "commentRangeEnd"),
    ("lastRenderedPageBreak",),
)
DRAWING_GRAMMAR = Grammar.of(DRAWING, "p", ("pPr", "endParaRPr"))
SHEET_GRAMMARS = (Grammar.of(SHEET, "si", ("rPh", "phoneticPr")), Grammar.of(SHEET, "is", ("rPh", "phoneticPr")))


class RunParagraphs:
    """The segments of paragraphs made of runs, and their translations written back in place."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self._places: list[tuple] = []  # per segment: ("node", text element) or ("runs", grammar, p, ...)

    def read(self, paragraph, grammar: Grammar) -> None:
        runs = [child for child in paragraph if child.tag == grammar.run]
        plain = all(child.tag == grammar.run or child.tag in grammar.plain_children for child in paragraph) and all(
            grandchild.tag in grammar.run_children for run in runs for grandchild in run
        )
        if not plain:
            for node in paragraph.iter(grammar.text):
                if node.text and node.text.strip():
                    self.segments.append(Segment(node.text.strip()))
                    self._places.append(("node", node))
            return
        from lxml import etree

        keys: dict[bytes, int] = {}
        templates: list = []
        pieces: list[tuple[int, str]] = []
        for run in runs:
            properties = run.find(grammar.properties)
            style = etree.tostring(properties) if properties is not None else b""
            if style not in keys:
                keys[style] = len(templates)
                templates.append(run)
            text = "".join(node.text or "" for node in run.iter(grammar.text))
            if pieces and pieces[-1][0] == keys[style]:
                pieces[-1] = (keys[style], pieces[-1][1] + text)
            elif text:
                pieces.append((keys[style], text))
        found = runs_segment(pieces, len(templates))
        if found is not None:
            self.segments.append(found[0])
            self._places.append(("runs", grammar, paragraph, templates, found[1], runs))

    def render(self, translations: list[str]) -> None:
        for place, translation, segment in zip(self._places, translations, self.segments, strict=True):
            if place[0] == "node":
                set_text(place[1], with_spacing(place[1].text, translation))
                continue
            _, grammar, paragraph, templates, main, runs = place
            pieces = split_runs(translation, main) if segment.html else [(main, translation)]
            position = paragraph.index(runs[0])
            for run in runs:
                paragraph.remove(run)
            for offset, (key, text) in enumerate(pieces):
                run = copy.deepcopy(templates[key])
                for child in list(run):
                    if child.tag != grammar.properties:
                        run.remove(child)
                node = run.makeelement(grammar.text, {})
                set_text(node, text)
                run.append(node)
                paragraph.insert(position + offset, run)


def set_text(node, text: str) -> None:
    node.text = text
    node.set(XML_SPACE, "preserve")


def parse_part(data: bytes, kind: str):
    """An archive member's XML, parsed without entities or network access."""
    from lxml import etree

    parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)
    try:
        return etree.fromstring(data, parser)
    except etree.XMLSyntaxError as error:
        raise DocumentError(f"the {kind} holds a part that is not XML ({error})") from None


def rewrite_archive(members: list[tuple[zipfile.ZipInfo, bytes]], replaced: dict[str, bytes]) -> bytes:
    """The archive again, member by member in its order and with its compression (an OpenDocument's or an EPUB's
    stored `mimetype` first), `replaced` members' contents swapped."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for info, content in members:
            archive.writestr(info, replaced.get(info.filename, content))
    return out.getvalue()


def serialize_part(element) -> bytes:
    from lxml import etree

    return etree.tostring(element, xml_declaration=True, encoding="UTF-8", standalone=True)


def open_word(stream: io.BytesIO):
    import docx

    return docx.Document(stream)


def open_slides(stream: io.BytesIO):
    import pptx

    return pptx.Presentation(stream)


class PackageDocument(Document):
    """A file python-docx or python-pptx opens (`opener`): the paragraphs of the parts `parts` names, written back
    by the library."""

    kind: str
    grammar: Grammar
    parts: re.Pattern
    opener: Callable[[io.BytesIO], object]

    def __init__(self, data: bytes) -> None:
        open_archive(data, self.kind).close()
        try:
            self._package = type(self).opener(io.BytesIO(data))
        except Exception as error:  # the libraries raise KeyError, ValueError or lxml's errors on broken parts
            raise DocumentError(f"the file is not a valid {self.kind} ({type(error).__name__}: {error})") from None
        self._paragraphs = RunParagraphs()
        self._parsed: list[tuple] = []  # (a part the library holds as bytes, its parsed XML)
        for element in self._elements():
            for paragraph in element.iter(self.grammar.paragraph):
                self._paragraphs.read(paragraph, self.grammar)
        self.segments = self._paragraphs.segments

    def _elements(self) -> Iterable:
        for part in self._package.part.package.iter_parts():
            if not self.parts.match(str(part.partname)):
                continue
            element = getattr(part, "_element", None)
            if element is None:  # a part the library keeps as bytes: parsed here, written back in render
                element = parse_part(part.blob, self.kind)
                self._parsed.append((part, element))
            yield element

    def render(self, translations: list[str]) -> bytes:
        self._paragraphs.render(translations)
        for part, element in self._parsed:
            part._blob = serialize_part(element)
        out = io.BytesIO()
        self._package.save(out)
        return out.getvalue()


class WordDocument(PackageDocument):
    kind, grammar, opener = ".docx", WORD_GRAMMAR, open_word
    parts = re.compile(r"^/word/(document|header\d*|footer\d*|footnotes|endnotes)\.xml$")


class SlidesDocument(PackageDocument):
    kind, grammar, opener = ".pptx", DRAWING_GRAMMAR, open_slides
    parts = re.compile(r"^/ppt/(slides/slide|notesSlides/notesSlide)\d+\.xml$")


class SpreadsheetDocument(Document):
    """.xlsx: the text of its cells lives in xl/sharedStrings.xml (and, inline, in the sheets); only those parts
    are rewritten, every other member of the archive is copied as it was."""

    _PARTS = re.compile(r"^xl/(sharedStrings|worksheets/sheet\d+)\.xml$")

    def __init__(self, data: bytes) -> None:
        with open_archive(data, ".xlsx") as archive:
            names = archive.namelist()
            if "xl/workbook.xml" not in names:
                raise DocumentError("the file is not a valid .xlsx (no xl/workbook.xml)")
            self._members = [(info, archive.read(info)) for info in archive.infolist()]
        self._parts = {}
        self._paragraphs = RunParagraphs()
        for info, content in self._members:
            if self._PARTS.match(info.filename):
                element = parse_part(content, ".xlsx")
                self._parts[info.filename] = element
                for grammar in SHEET_GRAMMARS:
                    for paragraph in element.iter(grammar.paragraph):
                        self._paragraphs.read(paragraph, grammar)
        self.segments = self._paragraphs.segments

    def render(self, translations: list[str]) -> bytes:
        self._paragraphs.render(translations)
        return rewrite_archive(self._members, {name: serialize_part(e) for name, e in self._parts.items()})


READERS = {".docx": WordDocument, ".pptx": SlidesDocument, ".xlsx": SpreadsheetDocument}

__all__ = ["READERS", "PackageDocument", "RunParagraphs", "SlidesDocument", "SpreadsheetDocument", "WordDocument",
           "open_archive", "parse_part", "rewrite_archive", "serialize_part"]
