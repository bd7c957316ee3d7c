"""LibreTranslate's POST /translate_file and the /download_file/ link it answers, on the running service.

The client is libretranslate-aio's translate_file (it sends the multipart body LibreTranslate's web page
sends); the oracle for the file's contents is POST /translate with the same text, and for a .docx or .html
what python-docx and Python's html.parser read back.
"""

from __future__ import annotations

import io

import docx
import ebooklib
import httpx
import libretranslate_aio
import odf.opendocument
import odf.teletype
import odf.text
import pytest
from ebooklib import epub
from lxml import etree
from odf.opendocument import OpenDocumentText

from tests.service.conftest import API_KEYS

pytestmark = pytest.mark.slow

TEXT = "I like tea. The cat sat.\nWe went to school today.\n"


def translated_text(client: httpx.Client, text: str) -> str:
    response = client.post("/translate", json={"q": text, "source": "en", "target": "zh"})
    assert response.status_code == 200, response.text
    return response.json()["translatedText"]


def test_a_text_file_is_translated_like_translate_and_downloaded_from_its_link(service_url, client, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text(TEXT, encoding="utf-8")
    with libretranslate_aio.LibreTranslate(service_url) as api:
        url = api.translate_file(path, source="en", target="zh").translated_file_url
    assert url.startswith(f"{service_url}/download_file/")
    download = client.get(url)
    assert download.status_code == 200, download.text
    assert download.content.decode("utf-8") == translated_text(client, TEXT)
    assert download.headers["content-type"].startswith("text/plain")
    assert 'filename="notes_zh.txt"' in download.headers["content-disposition"]


def test_auto_detects_the_files_language(client):
    files = {"file": ("chinese.txt", "我喜欢茶。".encode(), "text/plain")}
    response = client.post("/translate_file", data={"source": "auto", "target": "en"}, files=files)
    assert response.status_code == 200, response.text
    expected = client.post("/translate", json={"q": "我喜欢茶。", "source": "zh", "target": "en"}).json()
    assert client.get(response.json()["translatedFileUrl"]).text == expected["translatedText"]


@pytest.mark.parametrize(
    "data, files, fragment",
    [
        ({"source": "en", "target": "zh"}, None, "missing file parameter"),
        ({"target": "zh"}, {"file": ("a.txt", b"Hi", "text/plain")}, "missing source parameter"),
        ({"source": "en", "target": "zh"}, {"file": ("a.pdf", b"%PDF", "application/pdf")}, "not supported"),
        ({"source": "en", "target": "zh"}, {"file": ("a.txt", b"\xff\xfe\x00bad", "text/plain")}, "UTF-8"),
        ({"source": "en", "target": "zh"}, {"file": ("a.docx", b"PK\x03\x04", "application/zip")}, "not a valid"),
        ({"source": "en", "target": "zh"}, {"file": ("a.txt", b" \n", "text/plain")}, "no text"),
        ({"source": "en", "target": "de"}, {"file": ("a.txt", b"Hi", "text/plain")}, "de is not supported"),
    ],
)
def test_bad_uploads_are_400_with_libretranslates_error_shape(client, data, files, fragment):
    response = client.post("/translate_file", data=data, files=files or {"unrelated": ("x", b"", "text/plain")})
    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error"} and fragment in response.json()["error"]


def test_an_altered_or_unknown_link_is_refused(client):
    files = {"file": ("a.txt", b"I like tea.", "text/plain")}
    url = client.post("/translate_file", data={"source": "en", "target": "zh"}, files=files).json()["translatedFileUrl"]
    link = url.rsplit("/", 1)[1]
    assert client.get(f"/download_file/{link}").status_code == 200
    assert client.get(f"/download_file/{link}").status_code == 200  # kept for more downloads until it expires
    altered = link[:-2] + ("AA" if link[-2:] != "AA" else "BB")
    for bad in (altered, "nothing", "x.y", link.split(".")[0]):
        response = client.get(f"/download_file/{bad}")
        assert response.status_code == 400 and response.json() == {"error": "Invalid filename"}


def test_the_frontend_settings_announce_the_document_formats(client):
    settings = client.get("/frontend/settings").json()
    assert settings["filesTranslation"] is True
    assert {".txt", ".docx", ".html", ".srt"} <= set(settings["supportedFilesFormat"])


def test_a_docx_comes_back_a_docx_with_its_paragraphs_and_table(service_url, client, tmp_path):
    document = docx.Document()
    for text in ("I like tea.", "We went to school today."):
        document.add_paragraph(text)
    document.add_table(rows=1, cols=2).rows[0].cells[1].text = "Thank you."
    document.save(tmp_path / "notes.docx")
    with libretranslate_aio.LibreTranslate(service_url) as api:
        url = api.translate_file(tmp_path / "notes.docx", source="en", target="zh").translated_file_url
    download = client.get(url)
    assert download.status_code == 200
    assert download.headers["content-type"].startswith("application/vnd.openxmlformats")
    assert 'filename="notes_zh.docx"' in download.headers["content-disposition"]
    result = docx.Document(io.BytesIO(download.content))
    expected = [translated_text(client, text) for text in ("I like tea.", "We went to school today.")]
    assert [p.text for p in result.paragraphs] == expected
    assert [c.text for c in result.tables[0]._cells] == ["", translated_text(client, "Thank you.")]


@pytest.mark.parametrize(
    "name, content, media",
    [
        ("page.html", b"<html><body><p>I like <b>tea</b>.</p></body></html>", "text/html"),
        ("film.srt", b"1\n00:00:01,000 --> 00:00:02,000\nI like tea.\n", "application/x-subrip"),
    ],
)
def test_html_and_subtitles_come_back_in_their_type(client, name, content, media):
    files = {"file": (name, content, "application/octet-stream")}
    response = client.post("/translate_file", data={"source": "en", "target": "zh"}, files=files)
    assert response.status_code == 200, response.text
    download = client.get(response.json()["translatedFileUrl"])
    assert download.headers["content-type"].startswith(media)
    if name.endswith(".html"):
        expected = client.post("/translate", json={"q": content.decode(), "source": "en", "target": "zh",
                                                   "format": "html"}).json()["translatedText"]
        assert download.text == expected
    else:
        assert download.text == "1\n00:00:01,000 --> 00:00:02,000\n" + translated_text(client, "I like tea.") + "\n"


def test_an_odt_comes_back_an_odt_with_its_heading_and_paragraphs(service_url, client, tmp_path):
    document = OpenDocumentText()
    document.text.addElement(odf.text.H(outlinelevel=1, text="Thank you."))
    for text in ("I like tea.", "We went to school today."):
        document.text.addElement(odf.text.P(text=text))
    document.save(str(tmp_path / "notes.odt"))
    with libretranslate_aio.LibreTranslate(service_url) as api:
        url = api.translate_file(tmp_path / "notes.odt", source="en", target="zh").translated_file_url
    download = client.get(url)
    assert download.headers["content-type"] == "application/vnd.oasis.opendocument.text"
    result = odf.opendocument.load(io.BytesIO(download.content))
    (heading,) = result.getElementsByType(odf.text.H)
    assert odf.teletype.extractText(heading) == translated_text(client, "Thank you.")
    assert [odf.teletype.extractText(p) for p in result.getElementsByType(odf.text.P)] == [
        translated_text(client, text) for text in ("I like tea.", "We went to school today.")
    ]


def test_an_epub_comes_back_a_book_whose_chapters_are_well_formed_xhtml(service_url, client, tmp_path):
    made = epub.EpubBook()
    made.set_identifier("tea-1")
    made.set_title("Tea")
    made.set_language("en")
    chapter = epub.EpubHtml(title="One", file_name="one.xhtml", lang="en")
    chapter.content = (
        "<html><body><h1>I like tea.</h1><p>We went to <b>school</b> today.<br/>Thank you.</p></body></html>"
    )
    made.add_item(chapter)
    made.add_item(epub.EpubNcx())
    made.add_item(epub.EpubNav())
    made.spine = ["nav", chapter]
    epub.write_epub(str(tmp_path / "tea.epub"), made)
    with libretranslate_aio.LibreTranslate(service_url) as api:
        url = api.translate_file(tmp_path / "tea.epub", source="en", target="zh").translated_file_url
    (tmp_path / "tea_zh.epub").write_bytes(client.get(url).content)
    result = epub.read_epub(str(tmp_path / "tea_zh.epub"))
    (translated_chapter,) = [i for i in result.get_items_of_type(ebooklib.ITEM_DOCUMENT) if i.file_name == "one.xhtml"]
    root = etree.fromstring(translated_chapter.get_content())  # XHTML must stay XML
    heading = root.find(".//{http://www.w3.org/1999/xhtml}h1")
    assert heading.text == translated_text(client, "I like tea.")
    assert root.find(".//{http://www.w3.org/1999/xhtml}br") is not None


def test_a_key_in_the_multipart_body_is_accepted_and_a_link_needs_none(guarded_url, client, tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("I like tea.", encoding="utf-8")
    with httpx.Client(base_url=guarded_url, timeout=60) as guarded:
        files = {"file": ("a.txt", io.BytesIO(b"I like tea."), "text/plain")}
        wrong_key = {"source": "en", "target": "zh", "api_key": "wrong"}
        assert guarded.post("/translate_file", data=wrong_key, files=files).status_code == 403
        with libretranslate_aio.LibreTranslate(guarded_url, api_key=API_KEYS[0]) as api:
            # the guarded app's batch wait exceeds its timeout (conftest.py): the key passes, then the model times out
            with pytest.raises(libretranslate_aio.ServerError):  # LibreTranslate's 500, not 400 or 403
                api.translate_file(path, source="en", target="zh")
        # a link is its own key: without an API key, an unknown one is refused as a link, not for the key
        response = guarded.get(f"/download_file/{'A' * 32}.{'B' * 64}")
        assert response.status_code == 400 and response.json() == {"error": "Invalid filename"}
