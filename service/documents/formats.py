"""The formats a document may come in: each reader turns a file into its text segments (a paragraph, a cell, a
cue) and a `Document` that writes the translated segments back into a copy of the file, everything else kept.

A segment whose words carry different formatting (a bold word in a sentence) travels as HTML: each run that is
not in the paragraph's main style is wrapped in `<span data-run="k">`, which the translation places by the
alignment as it places inline tags, and `split_runs` reads the translated fragment back into runs.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import PurePath


class DocumentError(ValueError):
    """A file that cannot be read as its format says (corrupt, encrypted, empty, not UTF-8, too large inside)."""


@dataclass(frozen=True)
class Segment:
    """One unit of a document's text, translated as a whole: plain text, or an HTML fragment when `html`."""

    text: str
    html: bool = False


class Document:
    """A read file: its segments, and `render`, which writes their translations into a copy of it."""

    segments: list[Segment]

    def render(self, translations: list[str]) -> bytes:
        """The file with each segment's translation in its place (once per read: a reader may write in place)."""
        raise NotImplementedError

    @property
    def characters(self) -> int:
        """The characters a client is billed for: the text of every segment, markup left out."""
        return sum(len(markup_text(s.text) if s.html else s.text) for s in self.segments)


def decode_text(data: bytes, kind: str) -> str:
    """UTF-8 text (a byte-order mark dropped), or DocumentError."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DocumentError(f"the {kind} file is not UTF-8 text") from None


class TextDocument(Document):
    """.txt: each non-blank line a segment; blank lines, indentation and line endings kept."""

    _LINE = re.compile(r"([^\r\n]*)(\r\n|\n|\r|$)")

    def __init__(self, data: bytes) -> None:
        text = decode_text(data, ".txt")
        self._parts: list[str | int] = []  # raw text, or an index into segments
        self.segments = []
        for match in self._LINE.finditer(text):
            line, end = match.groups()
            if not line and not end:
                continue
            stripped = line.strip()
            if stripped:
                start = line.index(stripped[0])
                self._parts += [line[:start], len(self.segments), line[start + len(stripped) :] + end]
                self.segments.append(Segment(stripped))
            else:
                self._parts.append(line + end)

    def render(self, translations: list[str]) -> bytes:
        return "".join(translations[p] if isinstance(p, int) else p for p in self._parts).encode("utf-8")


@dataclass
class _Cue:
    index: str
    timing: str
    text: str


class SubtitleDocument(Document):
    """.srt (SubRip): each cue's text a segment; its number and timing line kept as written."""

    _TIMING = re.compile(r"^\s*\d+:\d{2}:\d{2}[,.]\d{1,3}\s*-->\s*\d+:\d{2}:\d{2}[,.]\d{1,3}")

    def __init__(self, data: bytes) -> None:
        text = decode_text(data, ".srt").replace("\r\n", "\n").replace("\r", "\n")
        self._cues: list[_Cue] = []
        for number, block in enumerate(re.split(r"\n\s*\n", text.strip()), start=1):
            lines = block.split("\n")
            if len(lines) < 2 or not lines[0].strip().isdigit() or not self._TIMING.match(lines[1]):
                raise DocumentError(f"the .srt file's cue {number} has no number and timing line")
            self._cues.append(_Cue(lines[0].strip(), lines[1].strip(), "\n".join(lines[2:])))
        if not self._cues:
            raise DocumentError("the .srt file holds no cues")
        self.segments = [Segment(cue.text) for cue in self._cues if cue.text.strip()]

    def render(self, translations: list[str]) -> bytes:
        texts = iter(translations)
        blocks = [
            "\n".join([cue.index, cue.timing, *([next(texts)] if cue.text.strip() else [])]) for cue in self._cues
        ]
        return ("\n\n".join(blocks) + "\n").encode("utf-8")


class HtmlDocument(Document):
    """.html: the page one HTML segment (its tags, scripts and styles kept; the text of its blocks translated)."""

    def __init__(self, data: bytes) -> None:
        text = decode_text(data, ".html")
        if not text.strip():
            raise DocumentError("the .html file is empty")
        self.segments = [Segment(text, html=True)]

    def render(self, translations: list[str]) -> bytes:
        return translations[0].encode("utf-8")


def runs_markup(runs: list[tuple[int, str]], main: int) -> str:
    """Runs (style key, text) as one HTML fragment: the `main` style's text bare, every other run in a span."""
    parts = []
    for key, text in runs:
        escaped = html.escape(text, quote=False)
        parts.append(escaped if key == main else f'<span data-run="{key}">{escaped}</span>')
    return "".join(parts)


class _RunReader(HTMLParser):
    def __init__(self, main: int) -> None:
        super().__init__(convert_charrefs=True)
        self.stack = [main]
        self.runs: list[tuple[int, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "span":
            value = dict(attrs).get("data-run")
            self.stack.append(int(value) if value is not None and value.isdigit() else self.stack[-1])

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" and len(self.stack) > 1:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self.runs and self.runs[-1][0] == self.stack[-1]:
            self.runs[-1] = (self.stack[-1], self.runs[-1][1] + data)
        else:
            self.runs.append((self.stack[-1], data))


def runs_segment(pieces: list[tuple[int, str]], styles: int) -> tuple[Segment, int] | None:
    """A paragraph's runs (style key, text; keys below `styles`) as its segment and its main style: plain text when
    one style holds all of it, else `runs_markup` around the main style (the one with the most characters). None
    for a paragraph without text."""
    if not "".join(text for _, text in pieces).strip():
        return None
    weights = [0] * styles
    for key, text in pieces:
        weights[key] += len(text)
    main = weights.index(max(weights))
    if len({key for key, _ in pieces}) == 1:
        return Segment("".join(text for _, text in pieces)), main
    return Segment(runs_markup(pieces, main), html=True), main


def with_spacing(original: str, translation: str) -> str:
    """A text node's translation inside the original's leading and trailing whitespace."""
    lead = original[: len(original) - len(original.lstrip())]
    return lead + translation + original[len(original.rstrip()) :]


def split_runs(fragment: str, main: int) -> list[tuple[int, str]]:
    """A translated `runs_markup` fragment back into runs (style key, text), adjacent runs of one style merged."""
    reader = _RunReader(main)
    reader.feed(fragment)
    reader.close()
    return [(key, text) for key, text in reader.runs if text]


def markup_text(fragment: str) -> str:
    """An HTML fragment's text, tags left out and entities read."""
    return html.unescape(re.sub(r"<[^>]*>", "", fragment))


def _lazy(module: str, extension: str) -> Callable[[bytes], Document]:
    """A reader in another module, imported when its first file comes (python-docx and its kin are large)."""

    def read(data: bytes) -> Document:
        import importlib

        return importlib.import_module(f"service.documents.{module}").READERS[extension](data)

    return read


READERS: dict[str, Callable[[bytes], Document]] = {
    ".txt": TextDocument,
    ".srt": SubtitleDocument,
    ".html": HtmlDocument,
    ".htm": HtmlDocument,
    ".docx": _lazy("office", ".docx"),
    ".pptx": _lazy("office", ".pptx"),
    ".xlsx": _lazy("office", ".xlsx"),
    ".odt": _lazy("opendocument", ".odt"),
    ".odp": _lazy("opendocument", ".odp"),
    ".epub": _lazy("opendocument", ".epub"),
    ".po": _lazy("localisation", ".po"),
    ".xliff": _lazy("localisation", ".xliff"),
    ".xlf": _lazy("localisation", ".xlf"),
}
FORMATS = tuple(READERS)


def extension_of(filename: str) -> str:
    """A file name's extension, lower case, dot included ("" without one)."""
    return PurePath(filename.replace("\\", "/")).suffix.lower()


def read_document(data: bytes, extension: str) -> Document:
    """The file read as its extension says; DocumentError when it cannot be, or holds no text."""
    reader = READERS.get(extension)
    if extension == ".pdf":
        raise DocumentError(
            ".pdf is not a supported format: its layout cannot be rebuilt as a document here (convert it to .docx "
            "first, e.g. with LibreOffice: soffice --convert-to docx file.pdf)"
        )
    if reader is None:
        raise DocumentError(
            f"{extension or 'a file without an extension'} is not a supported format (supported: "
            f"{', '.join(READERS)})"
        )
    if not data:
        raise DocumentError("the file is empty")
    document = reader(data)
    if not document.segments:
        raise DocumentError("the file holds no text to translate")
    return document


__all__ = [
    "FORMATS", "Document", "DocumentError", "Segment", "extension_of", "markup_text", "read_document",
    "runs_markup", "runs_segment", "split_runs", "with_spacing",
]
