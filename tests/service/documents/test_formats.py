"""The document formats read into segments and written back: files made by their own libraries (python-docx),
read again by them after a round trip, structure and formatting compared run by run."""

from __future__ import annotations

import io
import zipfile

import docx
import ebooklib
import odf.draw
import odf.opendocument
import odf.presentation
import odf.style
import odf.teletype
import odf.text
import openpyxl
import pptx
import pytest
from docx.oxml import parse_xml
from docx.oxml.ns import nsdecls
from ebooklib import epub
from odf.opendocument import OpenDocumentPresentation, OpenDocumentText
from openpyxl.cell.rich_text import CellRichText, TextBlock
from openpyxl.cell.text import InlineFont
from pptx.util import Inches
from translate.storage import pypo, xliff

from service.documents.formats import DocumentError, read_document, runs_markup, split_runs


def word(build) -> bytes:
    document = docx.Document()
    build(document)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def runs(document) -> list[list[tuple[str, bool | None, bool | None]]]:
    return [[(r.text, r.bold, r.italic) for r in p.runs] for p in document.paragraphs]


def mixed(document) -> None:
    paragraph = document.add_paragraph("Press ")
    paragraph.add_run("Save").bold = True
    paragraph.add_run(" or ")
    paragraph.add_run("Cancel").italic = True
    paragraph.add_run(" & go <on>.")
    document.add_paragraph("Plain text.")
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text = "Left"
    table.rows[0].cells[1].text = "Right"


def test_a_docx_written_back_unchanged_reads_as_the_original():
    data = word(mixed)
    document = read_document(data, ".docx")
    again = docx.Document(io.BytesIO(document.render([s.text for s in document.segments])))
    original = docx.Document(io.BytesIO(data))
    assert runs(again) == runs(original)
    assert [c.text for c in again.tables[0]._cells] == ["Left", "Right"]


def test_runs_of_other_styles_travel_as_spans_and_come_back_in_their_style():
    document = read_document(word(mixed), ".docx")
    assert document.segments[0].html and document.segments[0].text.count("<span") == 2
    assert "&amp; go &lt;on&gt;." in document.segments[0].text
    translations = [s.text for s in document.segments]
    translations[0] = '<span data-run="2">取消</span>或按<span data-run="1">保存</span> &amp; 走'
    result = docx.Document(io.BytesIO(document.render(translations)))
    assert runs(result)[0] == [("取消", None, True), ("或按", None, None), ("保存", True, None), (" & 走", None, None)]


def test_a_paragraph_with_a_hyperlink_has_each_text_node_translated_in_place():
    def build(document):
        paragraph = document.add_paragraph("See ")
        link = parse_xml(
            f'<w:hyperlink {nsdecls("w", "r")} r:id="rId99"><w:r><w:t>the manual</w:t></w:r></w:hyperlink>'
        )
        paragraph._p.append(link)
        paragraph.add_run(" now.")

    document = read_document(word(build), ".docx")
    assert [s.text for s in document.segments] == ["See", "the manual", "now."]
    result = docx.Document(io.BytesIO(document.render(["看", "手册", "现在。"])))
    xml = result.paragraphs[0]._p.xml
    assert "w:hyperlink" in xml and "手册" in xml
    assert result.paragraphs[0]._p.xpath("string(.)") == "看 手册 现在。"


def test_headers_and_footers_are_segments():
    def build(document):
        document.sections[0].header.paragraphs[0].text = "Top"
        document.sections[0].footer.paragraphs[0].text = "Bottom"
        document.add_paragraph("Body")

    document = read_document(word(build), ".docx")
    assert sorted(s.text for s in document.segments) == ["Body", "Bottom", "Top"]


def test_split_runs_reads_back_what_runs_markup_wrote():
    pieces = [(0, "a < b "), (1, "& c"), (0, " d")]
    assert split_runs(runs_markup(pieces, 0), 0) == pieces


def test_subtitles_with_a_byte_order_mark_and_crlf_keep_their_timings():
    data = "\ufeff1\r\n00:00:01,000 --> 00:00:02,000\r\nHello.\r\n\r\n2\r\n00:00:03,000 --> 00:00:04,500\r\n\r\n"
    document = read_document(data.encode(), ".srt")
    assert [s.text for s in document.segments] == ["Hello."]
    assert document.render(["你好。"]).decode() == (
        "1\n00:00:01,000 --> 00:00:02,000\n你好。\n\n2\n00:00:03,000 --> 00:00:04,500\n"
    )


def test_a_text_file_keeps_its_blank_lines_indentation_and_line_endings():
    document = read_document(b"  One.\r\n\r\nTwo.", ".txt")
    assert [s.text for s in document.segments] == ["One.", "Two."]
    assert document.render(["一。", "二。"]) == "  一。\r\n\r\n二。".encode()


def bomb() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", b"\0" * (257 * 2**20))
    return out.getvalue()


@pytest.mark.parametrize(
    "data, extension, fragment",
    [
        (b"not a zip", ".docx", "not a valid .docx"),
        (bomb(), ".docx", "expands past"),
        (word(lambda d: None), ".docx", "no text"),
        (b"", ".srt", "empty"),
        (b"x", ".pdf", "not a supported format"),
    ],
)
def test_unreadable_files_say_why(data, extension, fragment):
    with pytest.raises(DocumentError, match=fragment):
        read_document(data, extension)


def test_a_zip_that_is_not_a_word_file_says_so():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("hello.txt", "hi")
    with pytest.raises(DocumentError, match="not a valid .docx"):
        read_document(out.getvalue(), ".docx")


def with_footnote(data: bytes) -> bytes:
    """A python-docx file with a footnotes part added by hand (python-docx cannot make one)."""
    main = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    notes = f'<w:footnotes {main}><w:footnote w:id="1"><w:p><w:r><w:t>A note.</w:t></w:r></w:p></w:footnote>' \
        "</w:footnotes>"
    source, out = zipfile.ZipFile(io.BytesIO(data)), io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for item in source.infolist():
            content = source.read(item.filename)
            if item.filename == "[Content_Types].xml":
                content = content.replace(b"</Types>", b'<Override PartName="/word/footnotes.xml" ContentType="'
                                          b'application/vnd.openxmlformats-officedocument.wordprocessingml.footnotes'
                                          b'+xml"/></Types>')
            if item.filename == "word/_rels/document.xml.rels":
                content = content.replace(b"</Relationships>", b'<Relationship Id="rId99" Type="http://schemas.'
                                          b'openxmlformats.org/officeDocument/2006/relationships/footnotes" Target='
                                          b'"footnotes.xml"/></Relationships>')
            archive.writestr(item, content)
        archive.writestr("word/footnotes.xml", notes)
    return out.getvalue()


def test_footnotes_are_segments_and_written_back():
    document = read_document(with_footnote(word(lambda d: d.add_paragraph("Body text."))), ".docx")
    assert [s.text for s in document.segments] == ["Body text.", "A note."]
    rendered = document.render(["正文。", "一个注释。"])
    assert "一个注释。" in zipfile.ZipFile(io.BytesIO(rendered)).read("word/footnotes.xml").decode("utf-8")
    assert docx.Document(io.BytesIO(rendered)).paragraphs[0].text == "正文。"


def slides() -> bytes:
    presentation = pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[1])
    slide.shapes.title.text = "Welcome"
    body = slide.placeholders[1].text_frame
    body.text = "First point."
    paragraph = body.add_paragraph()
    for text, bold in (("Press ", None), ("Save", True), (" now.", None)):
        run = paragraph.add_run()
        run.text, run.font.bold = text, bold
    table = slide.shapes.add_table(2, 2, Inches(1), Inches(4), Inches(4), Inches(1)).table
    table.cell(0, 0).text, table.cell(1, 1).text = "Left", "Right"
    slide.notes_slide.notes_text_frame.text = "Speaker note."
    out = io.BytesIO()
    presentation.save(out)
    return out.getvalue()


def test_a_pptx_keeps_its_shapes_runs_table_and_notes():
    document = read_document(slides(), ".pptx")
    assert [s.text for s in document.segments] == [
        "Welcome", "First point.", 'Press <span data-run="1">Save</span> now.', "Left", "Right", "Speaker note.",
    ]
    translations = ["欢迎", "第一点。", '现在按<span data-run="1">保存</span>。', "左", "右", "演讲者备注。"]
    result = pptx.Presentation(io.BytesIO(document.render(translations)))
    (slide,) = result.slides
    title, body, table = slide.shapes
    assert title.text_frame.text == "欢迎"
    assert [[(r.text, r.font.bold) for r in p.runs] for p in body.text_frame.paragraphs] == [
        [("第一点。", None)], [("现在按", None), ("保存", True), ("。", None)],
    ]
    assert [c.text for c in table.table.iter_cells()] == ["左", "", "", "右"]
    assert slide.notes_slide.notes_text_frame.text == "演讲者备注。"


def workbook() -> bytes:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Prices"
    sheet.append(["Item", "Price", "Total"])
    sheet.append(["Green tea", 12.5, "=B2*2"])
    sheet["D1"] = CellRichText(TextBlock(InlineFont(b=True), "Note"), ": every price is per box")
    book.create_sheet("Thanks")["A1"] = "Thank you."
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def test_an_xlsx_has_its_text_cells_translated_and_its_numbers_and_formulas_untouched():
    document = read_document(workbook(), ".xlsx")
    translation = {
        "Item": "项目", "Price": "价格", "Total": "总计", "Green tea": "绿茶", "Thank you.": "谢谢。",
        '<span data-run="0">Note</span>: every price is per box': '<span data-run="0">注</span>：每盒价格',
    }
    assert sorted(s.text for s in document.segments) == sorted(translation)  # numbers and formulas are no text
    rendered = document.render([translation[s.text] for s in document.segments])
    result = openpyxl.load_workbook(io.BytesIO(rendered), rich_text=True)
    assert result.sheetnames == ["Prices", "Thanks"]
    prices = result["Prices"]
    rows = [[c.value for c in row[:3]] for row in prices.iter_rows()]
    assert rows == [["项目", "价格", "总计"], ["绿茶", 12.5, "=B2*2"]]
    note = prices["D1"].value
    assert [(block.text, bool(block.font.b)) for block in note if not isinstance(block, str)] == [("注", True)]
    assert str(note) == "注：每盒价格" and result["Thanks"]["A1"].value == "谢谢。"


CATALOG = """msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"
"Plural-Forms: nplurals=1; plural=0;\\n"

#: src/main.c:10
msgid "Open file"
msgstr ""

msgctxt "menu"
msgid "Save"
msgstr "保存"

#, c-format
msgid "%d file deleted"
msgid_plural "%d files deleted"
msgstr[0] ""

#, fuzzy
msgid "Close"
msgstr "关"
"""


def test_a_po_catalog_gets_its_untranslated_and_fuzzy_entries_translated_and_marked_fuzzy():
    document = read_document(CATALOG.encode(), ".po")
    assert [s.text for s in document.segments] == ["Open file", "%d file deleted", "Close"]
    result = pypo.pofile(document.render(["打开文件", "已删除 %d 个文件", "关闭"]))
    units = {(unit.getcontext(), unit.source if not unit.hasplural() else unit.source.strings[0]): unit
             for unit in result.units if not unit.isheader()}
    assert units["", "Open file"].target == "打开文件" and units["", "Open file"].isfuzzy()
    assert units["", "Open file"].getlocations() == ["src/main.c:10"]
    assert units["menu", "Save"].target == "保存" and not units["menu", "Save"].isfuzzy()  # a translation kept
    plural = units["", "%d file deleted"]
    assert plural.hasplural() and plural.target.strings == ["已删除 %d 个文件"] and "c-format" in plural.typecomments[0]
    assert units["", "Close"].target == "关闭"


XLIFF = """<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
<file source-language="en" target-language="zh" datatype="plaintext" original="ui"><body>
<trans-unit id="1"><source>Hello world</source></trans-unit>
<trans-unit id="2"><source>Click <g id="b">here</g> now</source><target></target></trans-unit>
<trans-unit id="3"><source>Done</source><target>完成</target></trans-unit>
</body></file></xliff>"""


def test_an_xliff_gets_targets_for_its_untranslated_units_with_their_inline_codes():
    document = read_document(XLIFF.encode(), ".xliff")
    assert [s.text for s in document.segments] == ["Hello world", "Click", "here", "now"]
    rendered = document.render(["你好世界", "点击", "这里", "现在"])
    units = {unit.xmlelement.get("id"): unit for unit in xliff.xlifffile(rendered).units}
    assert {key: unit.target for key, unit in units.items()} == {"1": "你好世界", "2": "点击 这里 现在", "3": "完成"}
    name = "{urn:oasis:names:tc:xliff:document:1.2}"
    second = units["2"].xmlelement.find(f"{name}target")
    assert [(child.tag, child.get("id"), child.text) for child in second] == [(f"{name}g", "b", "这里")]
    states = [units[key].xmlelement.find(f"{name}target").get("state") for key in ("1", "2", "3")]
    assert states == ["needs-review-translation", "needs-review-translation", None]  # a translation kept as it was


@pytest.mark.parametrize("data, extension", [(b'msgid "a"\nmsgstr ""\nmsgid', ".po"), (b"<xliff>", ".xliff"),
                                             (b"<html/>", ".xlf")])
def test_broken_localisation_files_say_why(data, extension):
    with pytest.raises(DocumentError):
        read_document(data, extension)


def text_document() -> bytes:
    document = OpenDocumentText()
    bold = odf.style.Style(name="Bold", family="text")
    bold.addElement(odf.style.TextProperties(fontweight="bold"))
    document.automaticstyles.addElement(bold)
    document.text.addElement(odf.text.H(outlinelevel=1, text="Tea"))
    paragraph = odf.text.P(text="We went to ")
    paragraph.addElement(odf.text.Span(stylename=bold, text="school"))
    paragraph.addText(" today.")
    document.text.addElement(paragraph)
    linked = odf.text.P(text="See ")
    linked.addElement(odf.text.A(href="https://example.com/", text="the site"))
    document.text.addElement(linked)
    out = io.BytesIO()
    document.write(out)
    return out.getvalue()


def test_an_odt_keeps_its_headings_spans_and_links():
    document = read_document(text_document(), ".odt")
    assert [s.text for s in document.segments] == [
        "Tea", 'We went to <span data-run="1">school</span> today.', "See", "the site",
    ]
    rendered = document.render(["茶", '我们今天去了<span data-run="1">学校</span>。', "看", "网站"])
    result = odf.opendocument.load(io.BytesIO(rendered))
    (heading,) = result.getElementsByType(odf.text.H)
    paragraph, linked = result.getElementsByType(odf.text.P)
    assert odf.teletype.extractText(heading) == "茶" and odf.teletype.extractText(paragraph) == "我们今天去了学校。"
    spans = paragraph.getElementsByType(odf.text.Span)
    assert [(span.getAttribute("stylename"), odf.teletype.extractText(span)) for span in spans] == [("Bold", "学校")]
    (link,) = linked.getElementsByType(odf.text.A)
    assert link.getAttribute("href") == "https://example.com/" and odf.teletype.extractText(link) == "网站"
    assert zipfile.ZipFile(io.BytesIO(rendered)).infolist()[0].filename == "mimetype"  # stored first, as ODF asks


def test_an_odp_keeps_its_frames_and_notes():
    document = OpenDocumentPresentation()
    page = odf.draw.Page(name="one", masterpagename="")
    document.presentation.addElement(page)
    frame = odf.draw.Frame(width="20cm", height="3cm", x="1cm", y="1cm")
    page.addElement(frame)
    box = odf.draw.TextBox()
    frame.addElement(box)
    box.addElement(odf.text.P(text="Welcome to the talk."))
    notes, notes_frame, notes_box = odf.presentation.Notes(), odf.draw.Frame(), odf.draw.TextBox()
    page.addElement(notes)
    notes.addElement(notes_frame)
    notes_frame.addElement(notes_box)
    notes_box.addElement(odf.text.P(text="Speak slowly."))
    out = io.BytesIO()
    document.write(out)
    read = read_document(out.getvalue(), ".odp")
    assert [s.text for s in read.segments] == ["Welcome to the talk.", "Speak slowly."]
    result = odf.opendocument.load(io.BytesIO(read.render(["欢迎。", "慢慢说。"])))
    assert [odf.teletype.extractText(p) for p in result.getElementsByType(odf.text.P)] == ["欢迎。", "慢慢说。"]
    assert len(result.getElementsByType(odf.draw.Page)) == 1 and result.getElementsByType(odf.presentation.Notes)


def book() -> bytes:
    made = epub.EpubBook()
    made.set_identifier("tea-1")
    made.set_title("Tea")
    made.set_language("en")
    chapter = epub.EpubHtml(title="One", file_name="one.xhtml", lang="en")
    chapter.content = "<html><body><h1>I like tea.</h1><p>We went to <b>school</b> today.</p></body></html>"
    made.add_item(chapter)
    made.toc = (chapter,)
    made.add_item(epub.EpubNcx())
    made.add_item(epub.EpubNav())
    made.spine = ["nav", chapter]
    out = io.BytesIO()
    epub.write_epub(out, made)
    return out.getvalue()


def test_an_epub_has_each_content_document_as_one_html_segment_and_stays_a_book(tmp_path):
    document = read_document(book(), ".epub")
    assert len(document.segments) == 2 and all(s.html for s in document.segments)  # the chapter and the nav
    rendered = document.render([s.text.replace("I like tea.", "我喜欢茶。") for s in document.segments])
    (tmp_path / "tea.epub").write_bytes(rendered)
    result = epub.read_epub(str(tmp_path / "tea.epub"))
    chapter = next(item for item in result.get_items_of_type(ebooklib.ITEM_DOCUMENT) if item.file_name == "one.xhtml")
    assert "<h1>我喜欢茶。</h1>" in chapter.get_content().decode("utf-8")
    assert result.get_metadata("DC", "title")[0][0] == "Tea"


@pytest.mark.parametrize("extension", [".odt", ".odp", ".epub"])
def test_an_archive_of_another_kind_under_an_opendocument_or_epub_name_says_so(extension):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("mimetype", "application/zip")
        archive.writestr("content.xml", "<x/>")
    with pytest.raises(DocumentError, match=f"not a valid \\{extension}"):
        read_document(out.getvalue(), extension)
