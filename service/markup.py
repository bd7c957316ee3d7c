"""HTML in, HTML out: the text nodes are translated, tags, attributes, comments and entities' meaning kept.

`parse_markup` reads a fragment with the standard library's tolerant parser and keeps every tag as
the client wrote it (start tags byte for byte, end tags as `</name>`). The text between two tags is
one unit of translation (cut into sentences like any text); the contents of script, style, code, pre,
textarea and of elements marked translate="no" or class="notranslate" are not translated. Rule for
inline tags: a tag always stays between the same two text units, so `I like <b>cats</b>.` is
translated as the three units "I like ", "cats" and "."; the markup can never break, at the price of
the sentence being translated in pieces. The output is well-formed whenever the input was, and
escapes &, < and > in the translated text.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from html.parser import HTMLParser

UNTRANSLATED_ELEMENTS = {"script", "style", "code", "pre", "textarea", "kbd", "samp", "var"}
VOID_ELEMENTS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Markup:
    """A fragment as raw markup strings and text units (indices into `units`)."""

    parts: list[str | int] = field(default_factory=list)
    units: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The translatable text, for language detection."""
        return "\n".join(self.units)

    def render(self, translations: list[str]) -> str:
        out = []
        for part in self.parts:
            out.append(html.escape(translations[part], quote=False) if isinstance(part, int) else part)
        return "".join(out)


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.markup = Markup()
        self.skipping: list[str] = []  # open elements whose text stays untranslated

    def _raw(self, text: str) -> None:
        self.markup.parts.append(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._raw(self.get_starttag_text() or f"<{tag}>")
        values = dict(attrs)
        marked = values.get("translate") == "no" or "notranslate" in (values.get("class") or "").split()
        if tag not in VOID_ELEMENTS and (self.skipping or tag in UNTRANSLATED_ELEMENTS or marked):
            self.skipping.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._raw(self.get_starttag_text() or f"<{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        self._raw(f"</{tag}>")
        if tag in self.skipping:
            while self.skipping and self.skipping.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if self.skipping or self.cdata_elem is not None or not data.strip():
            # script/style contents come raw (cdata); other untranslated text is escaped again
            self._raw(data if self.cdata_elem is not None else html.escape(data, quote=False))
            return
        self.markup.parts.append(len(self.markup.units))
        self.markup.units.append(data)

    def handle_comment(self, data: str) -> None:
        self._raw(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self._raw(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self._raw(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self._raw(f"<![{data}]>")


def parse_markup(fragment: str) -> Markup:
    reader = _Reader()
    reader.feed(fragment)
    reader.close()
    return reader.markup


__all__ = ["Markup", "parse_markup"]
