"""OpenDocument text and presentations (.odt, .odp) at their archive's XML, and EPUB books (.epub) through the
HTML path: only the parts that hold text are rewritten, every other member of the archive is copied as it was.

An OpenDocument paragraph (text:p, text:h) holds its text as mixed content: text between `text:span` elements,
each of which names its style. A paragraph of text and spans is translated whole, the spans placed back by the
alignment (formats.runs_markup); a paragraph that holds more (links, notes, fields, frames, tabs) has each of its
text pieces translated alone.
"""

from __future__ import annotations

import re

from service.documents.formats import (
    Document,
    DocumentError,
    Segment,
    decode_text,
    runs_segment,
    split_runs,
    with_spacing,
)
from service.documents.office import open_archive, parse_part, rewrite_archive, serialize_part

TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
PARAGRAPHS = (f"{{{TEXT}}}p", f"{{{TEXT}}}h")
SPAN = f"{{{TEXT}}}span"
STYLE = f"{{{TEXT}}}style-name"
HARMLESS = {f"{{{TEXT}}}{name}" for name in ("bookmark", "bookmark-start", "bookmark-end", "soft-page-break")}
MIMETYPES = {
    ".odt": "application/vnd.oasis.opendocument.text",
    ".odp": "application/vnd.oasis.opendocument.presentation",
}


class OpenDocument(Document):
    """The paragraphs of content.xml (the body, tables, frames, notes) and styles.xml (headers, footers)."""

    _PARTS = ("content.xml", "styles.xml")

    def __init__(self, data: bytes, kind: str) -> None:
        with open_archive(data, kind) as archive:
            names = archive.namelist()
            mimetype = archive.read("mimetype").decode("ascii", "replace").strip() if "mimetype" in names else ""
            if "content.xml" not in names or mimetype != MIMETYPES[kind]:
                raise DocumentError(f"the file is not a valid {kind} (no {MIMETYPES[kind]} content)")
            self._members = [(info, archive.read(info)) for info in archive.infolist()]
        self._parts = {}
        self.segments = []
        self._places: list[tuple] = []  # per segment: ("node", element, "text" | "tail") or ("runs", p, styles)
        for info, content in self._members:
            if info.filename in self._PARTS:
                element = parse_part(content, kind)
                self._parts[info.filename] = element
                for paragraph in element.iter(*PARAGRAPHS):
                    self._read(paragraph)

    def _read(self, paragraph) -> None:
        children = list(paragraph)
        plain = all(child.tag == SPAN and len(child) == 0 or child.tag in HARMLESS for child in children)
        if not plain:
            for element in paragraph.iter():
                for side in ("text", "tail") if element is not paragraph else ("text",):
                    value = getattr(element, side)
                    if value and value.strip() and not (side == "tail" and element.tag in PARAGRAPHS):
                        self.segments.append(Segment(value.strip()))
                        self._places.append(("node", element, side))
            return
        styles: list[str | None] = [None]  # key 0: the paragraph's own style
        pieces: list[tuple[int, str]] = []

        def add(style: str | None, text: str | None) -> None:
            if not text:
                return
            if style not in styles:
                styles.append(style)
            key = styles.index(style)
            if pieces and pieces[-1][0] == key:
                pieces[-1] = (key, pieces[-1][1] + text)
            else:
                pieces.append((key, text))

        add(None, paragraph.text)
        for child in children:
            if child.tag == SPAN:
                add(child.get(STYLE), child.text)
            add(None, child.tail)
        found = runs_segment(pieces, len(styles))
        if found is not None:
            self.segments.append(found[0])
            self._places.append(("runs", paragraph, styles, found[1]))

    def render(self, translations: list[str]) -> bytes:
        for place, translation, segment in zip(self._places, translations, self.segments, strict=True):
            if place[0] == "node":
                _, element, side = place
                setattr(element, side, with_spacing(getattr(element, side), translation))
                continue
            _, paragraph, styles, main = place
            pieces = split_runs(translation, main) if segment.html else [(main, translation)]
            kept = [child for child in paragraph if child.tag in HARMLESS]
            for child in list(paragraph):
                paragraph.remove(child)
            paragraph.text = None
            last = None
            for key, text in pieces:
                if styles[key] is None:  # the paragraph's own style: bare text
                    if last is None:
                        paragraph.text = (paragraph.text or "") + text
                    else:
                        last.tail = (last.tail or "") + text
                    continue
                last = paragraph.makeelement(SPAN, {STYLE: styles[key]})
                last.text = text
                paragraph.append(last)
            for child in kept:  # bookmarks and page breaks, after the text
                child.tail = None
                paragraph.append(child)
        return rewrite_archive(self._members, {name: serialize_part(e) for name, e in self._parts.items()})


class EbookDocument(Document):
    """.epub: each XHTML content document of the book one HTML segment (its markup kept, its prose translated)."""

    _CONTENT = re.compile(r"\.(x?html?)$", re.IGNORECASE)

    def __init__(self, data: bytes) -> None:
        with open_archive(data, ".epub") as archive:
            names = archive.namelist()
            if "mimetype" not in names or archive.read("mimetype").strip() != b"application/epub+zip":
                raise DocumentError("the file is not a valid .epub (no application/epub+zip mimetype)")
            self._members = [(info, archive.read(info)) for info in archive.infolist()]
        self._names = [info.filename for info, _ in self._members if self._CONTENT.search(info.filename)]
        contents = {info.filename: content for info, content in self._members}
        self.segments = [Segment(decode_text(contents[name], ".epub"), html=True) for name in self._names]

    def render(self, translations: list[str]) -> bytes:
        replaced = {name: text.encode("utf-8") for name, text in zip(self._names, translations, strict=True)}
        return rewrite_archive(self._members, replaced)


READERS = {
    ".odt": lambda data: OpenDocument(data, ".odt"),
    ".odp": lambda data: OpenDocument(data, ".odp"),
    ".epub": EbookDocument,
}

__all__ = ["READERS", "EbookDocument", "OpenDocument"]
