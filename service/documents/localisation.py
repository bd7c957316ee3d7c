"""Localisation files: gettext catalogs (.po, through polib) and XLIFF (1.2 and 2.x, at their XML). The source
strings a catalog has no translation for are translated (plural forms and message contexts kept); translations a
catalog already holds stay as they are. What the model wrote is marked for review: `fuzzy` in a .po,
`state="needs-review-translation"` (1.2) or `state="initial"` (2.x) in an XLIFF.
"""

from __future__ import annotations

import copy

from service.documents.formats import Document, DocumentError, Segment, decode_text, with_spacing
from service.documents.office import parse_part, serialize_part

XLIFF_1 = "urn:oasis:names:tc:xliff:document:1.2"
XLIFF_2 = "urn:oasis:names:tc:xliff:document:2.0"


class CatalogDocument(Document):
    """.po: each untranslated (or fuzzy) entry's msgid a segment, and its msgid_plural for the plural forms."""

    def __init__(self, data: bytes) -> None:
        import polib

        text = decode_text(data, ".po")
        try:
            self._catalog = polib.pofile(text if "\n" in text else text + "\n")
        except (OSError, ValueError) as error:
            raise DocumentError(f"the .po file cannot be read ({error})") from None
        self.segments = []
        self._places: list[tuple] = []  # per segment: (entry, plural index or None)
        for entry in self._catalog:
            if entry.obsolete or not entry.msgid or (entry.translated() and "fuzzy" not in entry.flags):
                continue
            if entry.msgid_plural:
                forms = sorted(entry.msgstr_plural) or [0]
                for form in forms:
                    self.segments.append(Segment(entry.msgid if form == 0 else entry.msgid_plural))
                    self._places.append((entry, form))
            else:
                self.segments.append(Segment(entry.msgid))
                self._places.append((entry, None))

    def render(self, translations: list[str]) -> bytes:
        for (entry, form), translation in zip(self._places, translations, strict=True):
            if form is None:
                entry.msgstr = translation
            else:
                entry.msgstr_plural[form] = translation
            if "fuzzy" not in entry.flags:
                entry.flags.append("fuzzy")
        return str(self._catalog).encode("utf-8")


class XliffDocument(Document):
    """.xliff / .xlf: each untranslated unit's source a segment (a source with inline codes: each of its text
    pieces), its target written beside it."""

    def __init__(self, data: bytes) -> None:
        root = parse_part(data, ".xliff")
        namespace = root.tag.partition("}")[0].lstrip("{")
        if namespace not in (XLIFF_1, XLIFF_2):
            raise DocumentError("the file is not XLIFF 1.2 or 2.x")
        self._root, self._version = root, 1 if namespace == XLIFF_1 else 2
        holder = f"{{{namespace}}}{'trans-unit' if self._version == 1 else 'segment'}"
        self._source, self._target = f"{{{namespace}}}source", f"{{{namespace}}}target"
        self.segments = []
        self._places: list[tuple] = []  # per segment: (element, "text" or "tail")
        for unit in root.iter(holder):
            source, target = unit.find(self._source), unit.find(self._target)
            if source is None or (target is not None and "".join(target.itertext()).strip()):
                continue
            if target is not None:
                unit.remove(target)
            target = copy.deepcopy(source)
            target.tag = self._target
            target.attrib.pop("{http://www.w3.org/XML/1998/namespace}lang", None)
            if self._version == 1:
                target.set("state", "needs-review-translation")
            else:
                unit.set("state", "initial")
            source.addnext(target)
            for element in target.iter():
                for side in ("text", "tail") if element is not target else ("text",):
                    value = getattr(element, side)
                    if value and value.strip():
                        self.segments.append(Segment(value.strip()))
                        self._places.append((element, side))

    def render(self, translations: list[str]) -> bytes:
        for (element, side), translation in zip(self._places, translations, strict=True):
            setattr(element, side, with_spacing(getattr(element, side), translation))
        return serialize_part(self._root)


READERS = {".po": CatalogDocument, ".xliff": XliffDocument, ".xlf": XliffDocument}

__all__ = ["READERS", "CatalogDocument", "XliffDocument"]
