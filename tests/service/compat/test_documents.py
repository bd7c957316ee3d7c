"""DeepL's document API on the running service, called by the official deepl SDK's translate_document: files made
by their own libraries go in, and what comes back opens in them with its structure kept and every text node
translated. The oracle for a segment's text is DeepL's /v2/translate with the same text, through the same SDK.
"""

from __future__ import annotations

import concurrent.futures
import io
import time
import zipfile
from html.parser import HTMLParser

import deepl
import docx
import httpx
import openpyxl
import pptx
import pytest
from pptx.util import Inches
from translate.storage import pypo, xliff

from tests.harness.documents import word_file as plain_word_file
from tests.service.conftest import API_KEYS

pytestmark = pytest.mark.slow

PARAGRAPHS = ["I like tea.", "We went to school today.", "The cat sat on the mat."]
# Sentences with one bold word: where the alignment places the word, a bold run carries its translation.
MIXED = [("We went to ", "school", " today."), ("I like ", "tea", " very much."), ("The ", "cat", " sat on the mat."),
         ("We drink ", "water", ".")]
CELLS = ["Good morning.", "Thank you.", "I am a student.", "Where is the station?"]
SUBTITLES = b"""1
00:00:01,000 --> 00:00:03,500
I like tea.

2
00:00:04,000 --> 00:00:06,250
We went to school today.
The cat sat.

3
00:00:07,000 --> 00:00:09,000
Thank you.
"""
PAGE = (
    "<!DOCTYPE html><html><head><title>Tea</title><style>p { color: red; }</style></head>"
    "<body><h1>I like tea.</h1><p>We went to <b>school</b> today.</p><p>Thank you.</p></body></html>"
)


@pytest.fixture(scope="module")
def translator(service_url: str) -> deepl.Translator:
    return deepl.Translator("any-key", server_url=service_url)


def translated(translator: deepl.Translator, text: str, **options) -> str:
    return translator.translate_text(text, source_lang="EN", target_lang="ZH", **options).text


def has_chinese(text: str) -> bool:
    return any("\u4e00" <= character <= "\u9fff" for character in text)


class _Bold(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth, self.runs = 0, []

    def handle_starttag(self, tag, attrs):
        self.depth += tag == "b"

    def handle_endtag(self, tag):
        self.depth -= tag == "b"

    def handle_data(self, data):
        self.runs.append((data, self.depth > 0))


def merged(runs: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    for text, bold in runs:
        if text and out and out[-1][1] == bold:
            out[-1] = (out[-1][0] + text, bold)
        elif text:
            out.append((text, bold))
    return out


def bold_runs(fragment: str) -> list[tuple[str, bool]]:
    """An HTML fragment's text as runs (text, bold), adjacent runs of one kind merged."""
    parser = _Bold()
    parser.feed(fragment)
    parser.close()
    return merged(parser.runs)


def word_file() -> bytes:
    document = docx.Document()
    document.sections[0].header.paragraphs[0].text = "Thank you."
    for text in PARAGRAPHS:
        document.add_paragraph(text)
    for before, word, after in MIXED:
        mixed = document.add_paragraph(before)
        mixed.add_run(word).bold = True
        mixed.add_run(after)
    table = document.add_table(rows=2, cols=2)
    for cell, text in zip(table._cells, CELLS, strict=True):
        cell.text = text
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def translate_document(
    translator: deepl.Translator, data: bytes, filename: str, target_lang: str = "ZH", **options
) -> bytes:
    out = io.BytesIO()
    translator.translate_document(data, out, target_lang=target_lang, filename=filename, **options)
    return out.getvalue()


def test_a_docx_keeps_its_paragraphs_runs_cells_header_and_bold_run(translator, tmp_path):
    (tmp_path / "notes.docx").write_bytes(word_file())
    translator.translate_document_from_filepath(
        tmp_path / "notes.docx", tmp_path / "notes-zh.docx", source_lang="EN", target_lang="ZH"
    )
    result = docx.Document(tmp_path / "notes-zh.docx")
    paragraphs = [p for p in result.paragraphs if p.text]
    assert [p.text for p in paragraphs[:3]] == [translated(translator, text) for text in PARAGRAPHS]
    assert_bold_placed_as_html_is(translator, paragraphs[3:7])
    assert not any(run.bold for paragraph in paragraphs[:3] for run in paragraph.runs)
    (table,) = result.tables
    assert (len(table.rows), len(table.columns)) == (2, 2)
    assert [cell.text for cell in table._cells] == [translated(translator, text) for text in CELLS]
    assert result.sections[0].header.paragraphs[0].text == translated(translator, "Thank you.")


def assert_bold_placed_as_html_is(translator: deepl.Translator, paragraphs: list) -> None:
    """Each mixed paragraph's runs are what /v2/translate answers for it as HTML, its <b> placed by the alignment."""
    for paragraph, (before, word, after) in zip(paragraphs, MIXED, strict=True):
        assert paragraph.text == translated(translator, before + word + after)
        expected = bold_runs(translated(translator, f"{before}<b>{word}</b>{after}", tag_handling="html"))
        assert merged([(run.text, bool(run.bold)) for run in paragraph.runs]) == expected


def test_on_the_shipped_model_each_bold_word_stays_a_bold_run_on_its_translation(shipped_url):
    translator = deepl.Translator("any-key", server_url=shipped_url + "/")  # the SDK joins paths to it
    result = docx.Document(io.BytesIO(translate_document(translator, word_file(), "notes.docx", source_lang="EN")))
    mixed = [p for p in result.paragraphs if p.text][3:7]
    assert_bold_placed_as_html_is(translator, mixed)
    for paragraph in mixed:  # the shipped model aligns every one of these words: none is left without its run
        bold = [run for run in paragraph.runs if run.bold]
        assert len(bold) == 1 and has_chinese(bold[0].text), [(run.text, run.bold) for run in paragraph.runs]


def test_a_pptx_keeps_its_slides_shapes_table_and_notes(translator):
    presentation, texts = pptx.Presentation(), (("Welcome", "I like tea."), ("Thank you.", "We went to school today."))
    for title, point in texts:
        slide = presentation.slides.add_slide(presentation.slide_layouts[1])
        slide.shapes.title.text, slide.placeholders[1].text = title, point
        slide.notes_slide.notes_text_frame.text = "Where is the station?"
    table = presentation.slides[0].shapes.add_table(1, 2, Inches(1), Inches(5), Inches(4), Inches(1)).table
    table.cell(0, 0).text, table.cell(0, 1).text = CELLS[:2]
    out = io.BytesIO()
    presentation.save(out)
    translated_file = translate_document(translator, out.getvalue(), "talk.pptx", source_lang="EN")
    result = pptx.Presentation(io.BytesIO(translated_file))
    assert len(result.slides) == 2
    for slide, (title, point) in zip(result.slides, texts, strict=True):
        assert slide.shapes.title.text == translated(translator, title)
        assert slide.placeholders[1].text == translated(translator, point)
        assert slide.notes_slide.notes_text_frame.text == translated(translator, "Where is the station?")
    (table,) = [shape.table for shape in result.slides[0].shapes if shape.has_table]
    assert [c.text for c in table.iter_cells()] == [translated(translator, text) for text in CELLS[:2]]


def test_an_xlsx_has_its_text_cells_translated_and_its_numbers_and_formulas_kept(translator):
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Orders"
    sheet.append(["Thank you.", 3, 2.5, "=B1*C1"])
    sheet.append(["I like tea.", None, 1000000, "=SUM(C1:C2)"])
    out = io.BytesIO()
    book.save(out)
    result = openpyxl.load_workbook(io.BytesIO(translate_document(translator, out.getvalue(), "orders.xlsx",
                                                                  source_lang="EN")))
    assert result.sheetnames == ["Orders"]
    rows = [[cell.value for cell in row] for row in result["Orders"].iter_rows()]
    assert rows == [[translated(translator, "Thank you."), 3, 2.5, "=B1*C1"],
                    [translated(translator, "I like tea."), None, 1000000, "=SUM(C1:C2)"]]


def test_a_po_catalogs_untranslated_entries_are_filled_and_marked_fuzzy(translator):
    catalog = (
        'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
        '#: ui.c:1\nmsgid "Thank you."\nmsgstr ""\n\nmsgid "I like tea."\nmsgstr "我喜欢茶。"\n'
    )
    result = pypo.pofile(translate_document(translator, catalog.encode(), "ui.po", source_lang="EN"))
    units = {unit.source: unit for unit in result.units if not unit.isheader()}
    assert units["Thank you."].target == translated(translator, "Thank you.") and units["Thank you."].isfuzzy()
    assert units["I like tea."].target == "我喜欢茶。" and not units["I like tea."].isfuzzy()


def test_an_xliff_gets_a_target_for_each_untranslated_unit(translator):
    document = (
        '<?xml version="1.0" encoding="UTF-8"?><xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">'
        '<file source-language="en" target-language="zh" datatype="plaintext" original="ui"><body>'
        + "".join(f'<trans-unit id="{i}"><source>{text}</source></trans-unit>' for i, text in enumerate(CELLS))
        + "</body></file></xliff>"
    )
    result = xliff.xlifffile(translate_document(translator, document.encode(), "ui.xlf", source_lang="EN"))
    assert [unit.target for unit in result.units] == [translated(translator, text) for text in CELLS]


def test_a_paragraph_comes_out_as_v1_translate_gives_it_alone(translator, client):
    texts = [*PARAGRAPHS, *CELLS]
    translated_file = translate_document(translator, plain_word_file(texts), "a.docx", source_lang="EN")
    result = docx.Document(io.BytesIO(translated_file))
    alone = [
        client.post("/v1/translate", json={"texts": [text], "source_lang": "en", "target_lang": "zh"}).json()[
            "translations"][0]["text"]
        for text in texts
    ]
    assert [p.text for p in result.paragraphs] == alone


def test_subtitles_keep_every_cue_number_and_timing(translator):
    result = translate_document(translator, SUBTITLES, "film.srt", source_lang="EN").decode("utf-8")
    cues = [block.split("\n") for block in result.strip().split("\n\n")]
    originals = [block.split("\n") for block in SUBTITLES.decode().strip().split("\n\n")]
    assert [cue[:2] for cue in cues] == [original[:2] for original in originals]
    for cue, original in zip(cues, originals, strict=True):
        assert "\n".join(cue[2:]) == translated(translator, "\n".join(original[2:]))


def test_a_text_file_is_translated_line_by_line_with_its_blank_lines(translator):
    text = "I like tea.\n\n  Thank you.\nThe cat sat.\n"
    result = translate_document(translator, text.encode(), "notes.txt", source_lang="EN").decode("utf-8")
    lines = result.split("\n")
    assert lines[1] == "" and lines[2].startswith("  ") and result.endswith("\n")
    assert [line.strip() for line in lines if line.strip()] == [
        translated(translator, line.strip()) for line in text.split("\n") if line.strip()
    ]


def test_an_html_page_is_translated_as_v2_translate_translates_it(translator):
    result = translate_document(translator, PAGE.encode(), "page.html", source_lang="EN").decode("utf-8")
    assert result == translated(translator, PAGE, tag_handling="html")
    assert "<style>p { color: red; }</style>" in result and "<b>" in result and has_chinese(result)


def test_the_source_language_is_detected_when_not_given(translator):
    result = translate_document(translator, "我喜欢茶。\n".encode(), "tea.txt", target_lang="EN-US").decode("utf-8")
    assert result == translator.translate_text("我喜欢茶。", source_lang="ZH", target_lang="EN-US").text + "\n"


def test_a_glossarys_terms_are_kept_in_a_document(translator):
    glossary = translator.create_glossary("docs", "EN", "ZH", {"cat": "猫"})
    try:
        result = translate_document(translator, b"I like the cat.\n", "cat.txt", source_lang="EN", glossary=glossary)
        expected = translated(translator, "I like the cat.", glossary=glossary)
    finally:
        translator.delete_glossary(glossary)
    assert "猫" in expected and result.decode("utf-8") == expected + "\n"


def test_placeholders_urls_and_numbers_in_a_document_come_back_byte_for_byte(translator):
    spans = ["%s", "{{name}}", "https://example.com/a?b=1", "1,234,567"]
    lines = [f"Hello {spans[0]}, I like tea.", f"Thank you, {spans[1]}.", f"See {spans[2]} today.",
             f"We sold {spans[3]} cups."]
    result = translate_document(translator, "\n".join(lines).encode(), "ui.txt", source_lang="EN").decode("utf-8")
    for line, span in zip(result.split("\n"), spans, strict=True):
        assert line.count(span) == 1, (line, span)


def test_four_documents_at_once_all_finish(translator):
    files = [(word_file(), "a.docx"), (SUBTITLES, "b.srt"), (PAGE.encode(), "c.html"), (b"I like tea.\n", "d.txt")]
    # four at once: both ingress replicas' workers take two each (documents.workers_per_replica)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda item: translate_document(translator, *item, source_lang="EN"), files))
    assert all(results)
    assert docx.Document(io.BytesIO(results[0])).paragraphs[0].text == translated(translator, PARAGRAPHS[0])


def zip_bomb() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        with archive.open("word/document.xml", "w") as member:
            block = b"\0" * 2**20
            for _ in range(300):
                member.write(block)
    return out.getvalue()


@pytest.mark.parametrize(
    "data, filename, fragment",
    [
        (b"PK\x03\x04 not really a zip", "broken.docx", "not a valid .docx"),
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 512, "encrypted.docx", "not a valid .docx"),
        (zip_bomb(), "bomb.docx", "expands past"),
        (b"", "empty.txt", "empty"),
        (b"%PDF-1.4", "paper.pdf", "not a supported format"),
        (b"I like tea.", "notes", "not a supported format"),
        (b"\xff\xfe\x00bad", "notes.txt", "not UTF-8"),
        (b"1\nno timing here\nHello\n", "film.srt", "timing"),
    ],
)
def test_bad_files_are_refused_with_a_400_that_says_why(translator, data, filename, fragment):
    with pytest.raises(deepl.DeepLException, match=fragment) as refused:
        translate_document(translator, data, filename, source_lang="EN")
    assert refused.value.http_status_code == 400


def test_a_file_past_the_size_limit_is_413(client):
    files = {"file": ("big.txt", b"a" * (10 * 2**20 + 1), "text/plain")}
    response = client.post("/v2/document", data={"target_lang": "ZH"}, files=files)
    assert response.status_code == 413, response.text
    assert "limit" in response.json()["message"]


def upload(client: httpx.Client, text: bytes = b"I like tea.\n") -> dict:
    files = {"file": ("notes.txt", text, "text/plain")}
    response = client.post("/v2/document", data={"target_lang": "ZH", "source_lang": "EN"}, files=files)
    assert response.status_code == 200, response.text
    return response.json()


def wait_done(client: httpx.Client, handle: dict) -> dict:
    for _ in range(600):
        status = client.post(f"/v2/document/{handle['document_id']}", json={"document_key": handle["document_key"]})
        assert status.status_code == 200, status.text
        if status.json()["status"] in ("done", "error"):
            return status.json()
        time.sleep(0.1)
    raise AssertionError("the document never finished")


def test_the_result_is_handed_over_once_and_then_the_document_is_gone(client):
    handle = upload(client)
    status = wait_done(client, handle)
    assert status == {"document_id": handle["document_id"], "status": "done", "billed_characters": 11}
    key = {"document_key": handle["document_key"]}
    first = client.post(f"/v2/document/{handle['document_id']}/result", json=key)
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/plain")
    assert 'filename="notes.txt"' in first.headers["content-disposition"]
    again = client.post(f"/v2/document/{handle['document_id']}/result", json=key)
    assert again.status_code == 404 and again.json() == {"message": "Document not found"}
    assert client.post(f"/v2/document/{handle['document_id']}", json=key).status_code == 404


def test_a_wrong_key_and_an_unknown_id_are_both_404(client):
    handle = upload(client)
    wrong = client.post(f"/v2/document/{handle['document_id']}", json={"document_key": "0" * 64})
    unknown = client.post(f"/v2/document/{'A' * 32}", json={"document_key": handle["document_key"]})
    traversal = client.post("/v2/document/..%2F..%2Fetc", json={"document_key": handle["document_key"]})
    assert [r.status_code for r in (wrong, unknown)] == [404, 404]
    assert traversal.status_code in (404, 400)
    missing = client.post(f"/v2/document/{handle['document_id']}", json={})
    assert missing.status_code == 400 and "document_key" in missing.json()["message"]


def test_with_api_keys_a_document_belongs_to_the_key_that_uploaded_it(guarded_url):
    one, two = ({"Authorization": f"DeepL-Auth-Key {key}"} for key in API_KEYS)
    files = {"file": ("notes.txt", b"I like tea.", "text/plain")}
    with httpx.Client(base_url=guarded_url, timeout=60) as guarded:
        assert guarded.post("/v2/document", data={"target_lang": "ZH"}, files=files).status_code == 403
        handle = guarded.post("/v2/document", data={"target_lang": "ZH"}, files=files, headers=one).json()
        path, key = f"/v2/document/{handle['document_id']}", {"document_key": handle["document_key"]}
        assert guarded.post(path, json=key, headers=one).json()["status"] == "queued"  # this app runs no worker
        for other in (two, {}):
            refused = guarded.post(path, json=key, headers=other)
            assert refused.status_code == (404 if other else 403), refused.text
        assert guarded.post(f"{path}/result", json=key, headers=two).status_code == 404


def test_upload_refusals_use_deepls_error_shape(client):
    files = {"file": ("notes.txt", b"I like tea.", "text/plain")}
    cases = [
        ({"source_lang": "EN"}, files, "target_lang"),
        ({"target_lang": "DE"}, files, "DE is not supported"),
        ({"target_lang": "ZH", "output_format": "pdf"}, files, "output_format"),
        ({"target_lang": "ZH", "glossary_id": "x"}, files, "requires the source_lang"),
        ({"target_lang": "ZH"}, None, "file"),
    ]
    for data, sent, fragment in cases:
        response = client.post("/v2/document", data=data, files=sent)
        assert response.status_code in (400, 404), response.text
        assert fragment in response.json()["message"], response.text
