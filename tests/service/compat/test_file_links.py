"""service/compat/file_links.py: a download link carries its file, and only links signed with the secret open."""

import pytest

from service.compat.file_links import decode_file_link, encode_file_link
from service.errors import FileLinkError

SECRET = b"test-secret"


def test_a_link_gives_back_its_file_name_and_text():
    text = "我喜欢茶。\nI like tea.\n" * 50
    link = encode_file_link("notes_zh.txt", text, SECRET)
    assert decode_file_link(link, SECRET) == ("notes_zh.txt", text)
    assert len(link) < len(text.encode("utf-8"))  # compressed


@pytest.mark.parametrize("link", ["", "a/b", "%%%", "A" * 10, "A" * 300_000])
def test_malformed_links_are_refused(link):
    with pytest.raises(FileLinkError):
        decode_file_link(link, SECRET)


def test_a_link_signed_with_another_secret_or_altered_is_refused():
    link = encode_file_link("a.txt", "text", SECRET)
    with pytest.raises(FileLinkError):
        decode_file_link(link, b"other")
    with pytest.raises(FileLinkError):
        decode_file_link(link[:-3] + ("AAA" if link[-3:] != "AAA" else "BBB"), SECRET)
