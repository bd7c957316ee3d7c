"""Documents the tests and benchmarks send: made by the format's own library."""

from __future__ import annotations

import io

import docx


def word_file(paragraphs: list[str]) -> bytes:
    """A .docx of one plain paragraph per text."""
    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()
