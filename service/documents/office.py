"""Office Open XML documents (.docx, through python-docx): every paragraph of the body, its tables, text boxes,
headers, footers and notes a segment, its runs' formatting kept, everything that is not text left as it was.

A paragraph of plain text runs is translated whole, its runs grouped by formatting and placed back by the
alignment (formats.runs_markup); a paragraph that holds more (hyperlinks, fields, tabs, drawings) has each of
its text nodes translated alone, so nothing around them moves.
"""

from __future__ import annotations

import copy
import io
import zipfile
from collections.abc import Iterator

from service.documents.formats import Document, DocumentError, Segment, runs_markup, split_runs

MAX_UNPACKED_BYTES = 256 * 1024 * 1024  # what an archive may expand to (a zip bomb stops here)
MAX_ARCHIVE_MEMBERS = 10_000


def open_archive(data: bytes, kind: str) -> None:
    """DocumentError unless `data` is a zip archive that expands within the limits."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError):
        raise DocumentError(
            f"the file is not a valid {kind} (not a zip archive: corrupt, encrypted, or another format)"
        ) from None
    if len(members) > MAX_ARCHIVE_MEMBERS or sum(m.file_size for m in members) > MAX_UNPACKED_BYTES:
        raise DocumentError(f"the {kind} archive expands past {MAX_UNPACKED_BYTES // 2**20} MiB")


class WordDocument(Document):
    def __init__(self, data: bytes) -> None:
        open_archive(data, ".docx")
        import docx
        from docx.oxml.ns import qn

        try:
            self._document = docx.Document(io.BytesIO(data))
        except Exception as error:  # python-docx raises KeyError, ValueError or lxml's errors on broken parts
            raise DocumentError(f"the file is not a valid .docx ({type(error).__name__}: {error})") from None
        self._run, self._text, self._properties = qn("w:r"), qn("w:t"), qn("w:rPr")
        self._plain_children = {qn(name) for name in (
            "w:pPr", "w:bookmarkStart", "w:bookmarkEnd", "w:proofErr", "w:commentRangeStart", "w:commentRangeEnd",
        )}  # fmt: skip
        self._run_children = {self._text, self._properties, qn("w:lastRenderedPageBreak")}
        self.segments = []
        self._parsed_parts: list[tuple] = []  # (a part python-docx holds as bytes, its parsed XML)
        self._places: list[tuple] = []  # per segment: ("runs", paragraph, templates, main) or ("node", w:t)
        for paragraph in self._paragraphs():
            self._read(paragraph)

    def _paragraphs(self) -> Iterator:
        """Every w:p of the main text and of the headers, footers, footnotes and endnotes, each once."""
        from docx.oxml import parse_xml
        from docx.oxml.ns import qn

        paragraph = qn("w:p")
        yield from self._document.element.body.iter(paragraph)
        for part in self._document.part.package.iter_parts():
            name = str(part.partname)
            if any(kind in name for kind in ("/header", "/footer", "/footnotes", "/endnotes")):
                element = getattr(part, "element", None)
                if element is None:  # python-docx keeps notes as bytes: parsed here, written back in render
                    element = parse_xml(part.blob)
                    self._parsed_parts.append((part, element))
                yield from element.iter(paragraph)

    def _read(self, paragraph) -> None:
        runs = [child for child in paragraph if child.tag == self._run]
        plain = all(child.tag == self._run or child.tag in self._plain_children for child in paragraph) and all(
            grandchild.tag in self._run_children for run in runs for grandchild in run
        )
        if not plain:
            for node in paragraph.iter(self._text):
                if node.text and node.text.strip():
                    self.segments.append(Segment(node.text.strip()))
                    self._places.append(("node", node))
            return
        from lxml import etree

        keys: dict[bytes, int] = {}
        templates: list = []
        pieces: list[tuple[int, str]] = []
        for run in runs:
            properties = run.find(self._properties)
            style = etree.tostring(properties) if properties is not None else b""
            if style not in keys:
                keys[style] = len(templates)
                templates.append(run)
            text = "".join(node.text or "" for node in run.iter(self._text))
            if pieces and pieces[-1][0] == keys[style]:
                pieces[-1] = (keys[style], pieces[-1][1] + text)
            elif text:
                pieces.append((keys[style], text))
        if not "".join(text for _, text in pieces).strip():
            return
        weights = [0] * len(templates)
        for key, text in pieces:
            weights[key] += len(text)
        main = weights.index(max(weights))
        used = {key for key, _ in pieces}
        if len(used) == 1:
            self.segments.append(Segment("".join(text for _, text in pieces)))
        else:
            self.segments.append(Segment(runs_markup(pieces, main), html=True))
        self._places.append(("runs", paragraph, templates, main, runs))

    def render(self, translations: list[str]) -> bytes:
        for place, translation, segment in zip(self._places, translations, self.segments, strict=True):
            if place[0] == "node":
                node = place[1]
                original = node.text
                lead = original[: len(original) - len(original.lstrip())]
                trail = original[len(original.rstrip()) :]
                self._set_text(node, lead + translation + trail)
                continue
            _, paragraph, templates, main, runs = place
            pieces = split_runs(translation, main) if segment.html else [(main, translation)]
            position = paragraph.index(runs[0])
            for run in runs:
                paragraph.remove(run)
            for offset, (key, text) in enumerate(pieces):
                run = copy.deepcopy(templates[key])
                for child in list(run):
                    if child.tag != self._properties:
                        run.remove(child)
                node = run.makeelement(self._text, {})
                self._set_text(node, text)
                run.append(node)
                paragraph.insert(position + offset, run)
        from lxml import etree

        for part, element in self._parsed_parts:
            part._blob = etree.tostring(element, xml_declaration=True, encoding="UTF-8", standalone=True)
        out = io.BytesIO()
        self._document.save(out)
        return out.getvalue()

    @staticmethod
    def _set_text(node, text: str) -> None:
        node.text = text
        node.set("{http://www.w3.org/XML/1998/namespace}space", "preserve")


READERS = {".docx": WordDocument}

__all__ = ["READERS", "WordDocument", "open_archive"]
