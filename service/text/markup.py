"""HTML in, HTML out: a fragment parsed into raw markup and blocks of prose whose text nodes are translated, with
every tag, attribute, comment and entity kept; `render` puts the translations back and never breaks the markup.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from html.parser import HTMLParser

UNTRANSLATED_ELEMENTS = {"script", "style", "code", "pre", "textarea", "kbd", "samp", "var"}
# Elements that wrap words inside a sentence; any other tag ends a block.
INLINE_ELEMENTS = {
    "a", "abbr", "b", "bdi", "bdo", "cite", "del", "dfn", "em", "font", "i", "ins", "mark", "q", "s", "small",
    "span", "strong", "sub", "sup", "time", "u",
}  # fmt: skip
VOID_ELEMENTS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass(frozen=True)
class TagRules:
    """Which tags do what beyond the defaults (DeepL's tag_handling options): `ignore` elements keep their content
    untranslated; `non_splitting` ones sit inside a sentence like <b>; `splitting` ones end a block like <p>."""

    ignore: frozenset[str] = frozenset()
    non_splitting: frozenset[str] = frozenset()
    splitting: frozenset[str] = frozenset()


@dataclass(frozen=True)
class InlineElement:
    """An inline element of a block: its tags as written, and the characters [start, end) of block text it wraps."""

    start_tag: str
    end_tag: str
    start: int
    end: int


@dataclass
class Block:
    """Text nodes and inline tags with nothing else between them: one stretch of prose."""

    parts: list[str | int] = field(default_factory=list)  # raw markup and indices into Markup.units
    text: str = ""  # the text nodes and the whitespace between the inline tags, as read
    elements: list[InlineElement] = field(default_factory=list)
    flat: bool = True  # every inline tag closed within the block, none inside another
    _open: list[tuple[str, str, int]] = field(default_factory=list, repr=False)  # (name, start tag, start offset)


@dataclass
class Markup:
    """A fragment as raw markup strings and blocks (indices into `blocks`); text nodes are `units`."""

    parts: list[str | int] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    units: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The translatable text, for language detection."""
        return "\n".join(self.units)

    def render(self, translations: list[str], placed: dict[int, str] | None = None) -> str:
        """The fragment with each text node replaced by its translation, or a block by its finished HTML."""
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif placed is not None and part in placed:
                out.append(placed[part])
            else:
                for piece in self.blocks[part].parts:
                    out.append(html.escape(translations[piece], quote=False) if isinstance(piece, int) else piece)
        return "".join(out)


class _Reader(HTMLParser):
    def __init__(self, rules: TagRules) -> None:
        super().__init__(convert_charrefs=True)
        self.inline = (INLINE_ELEMENTS | rules.non_splitting) - rules.splitting
        self.untranslated = UNTRANSLATED_ELEMENTS | rules.ignore
        self.markup = Markup()
        self.skipping: list[str] = []  # open elements whose text stays untranslated
        self.block: Block | None = None

    def _raw(self, text: str) -> None:
        self._close_block()
        self.markup.parts.append(text)

    def _current_block(self) -> Block:
        if self.block is None:
            self.block = Block()
            self.markup.parts.append(len(self.markup.blocks))
            self.markup.blocks.append(self.block)
        return self.block

    def _close_block(self) -> None:
        if self.block is not None and self.block._open:
            self.block.flat = False  # an inline element left open: its end tag is in another block
        self.block = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        raw = self.get_starttag_text() or f"<{tag}>"
        values = dict(attrs)
        marked = values.get("translate") == "no" or "notranslate" in (values.get("class") or "").split()
        if tag in self.inline and not self.skipping and not marked:
            block = self._current_block()
            block.parts.append(raw)
            if block._open:
                block.flat = False  # nested: placed the way every tag is, between its text nodes
            block._open.append((tag, raw, len(block.text)))
            return
        self._raw(raw)
        if tag not in VOID_ELEMENTS and (self.skipping or tag in self.untranslated or marked):
            self.skipping.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._raw(self.get_starttag_text() or f"<{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.inline and not self.skipping:
            block = self._current_block()
            block.parts.append(f"</{tag}>")
            if block._open and block._open[-1][0] == tag:
                _, start_tag, start = block._open.pop()
                block.elements.append(InlineElement(start_tag, f"</{tag}>", start, len(block.text)))
            else:
                block.flat = False  # an end tag whose start is elsewhere, or crossing another element
            return
        self._raw(f"</{tag}>")
        if tag in self.skipping:
            while self.skipping and self.skipping.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if self.skipping or self.cdata_elem is not None:
            # script/style contents come raw (cdata); other untranslated text is escaped again
            self._raw(data if self.cdata_elem is not None else html.escape(data, quote=False))
            return
        if not data.strip():
            if self.block is None:
                self.markup.parts.append(html.escape(data, quote=False))
            else:  # whitespace between inline tags is part of the prose
                self.block.parts.append(html.escape(data, quote=False))
                self.block.text += data
            return
        block = self._current_block()
        block.parts.append(len(self.markup.units))
        block.text += data
        self.markup.units.append(data)

    def handle_comment(self, data: str) -> None:
        self._raw(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self._raw(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self._raw(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self._raw(f"<![{data}]>")


def parse_markup(fragment: str, rules: TagRules | None = None) -> Markup:
    """A fragment as raw markup and blocks, read with the standard library's tolerant parser.

    Every tag is kept as the client wrote it (start tags byte for byte, end tags as `</name>`). A block is a run of
    text nodes and inline tags (INLINE_ELEMENTS: b, i, em, strong, a, span, …) with no other tag, comment or
    untranslated content inside; its `text` is what a reader reads as one piece of prose, its `elements` say which
    characters each inline element wraps. The contents of script, style, code, pre, textarea and of elements marked
    translate="no" or class="notranslate" are not translated. `render` with per-text-node translations always
    holds the markup: a tag stays between the same two text nodes; the output escapes &, < and > in translations.
    `rules` adds tags to leave untranslated, to read as inline, or to read as block breaks (DeepL's options).
    """
    reader = _Reader(rules or TagRules())
    reader.feed(fragment)
    reader.close()
    reader._close_block()
    return reader.markup


__all__ = ["Block", "INLINE_ELEMENTS", "InlineElement", "Markup", "TagRules", "parse_markup"]
