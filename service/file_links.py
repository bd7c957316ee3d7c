"""Stateless download links for POST /translate_file: the translated file travels inside its own signed link.

LibreTranslate answers /translate_file with a URL under /download_file/ where it stored the result on
disk. Storing would tie a download to the replica (and the disk) that translated it, so here the link
carries the file itself: the file name and translated text, zlib-compressed, signed with a truncated
HMAC-SHA256 under the service's signing secret (the one explanation ids use), in URL-safe base64. Any
replica serves it, after restarts and scale-outs, and nothing is stored or expires. The price is the
link's length, which grows with the file (files are held to LibreTranslate's 20,000-character limit:
a few kB of link for ordinary text, tens of kB for the largest files).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import zlib

TAG_BYTES = 12
MAX_LINK_CHARS = 200_000
_LINK_CHARACTERS = re.compile(r"^[A-Za-z0-9_-]+$")
_PURPOSE = b"translate_file:"


class FileLinkError(ValueError):
    """A download id that is malformed, altered or signed with another secret."""


def encode_file_link(filename: str, text: str, secret: bytes) -> str:
    payload = zlib.compress(json.dumps([filename, text], ensure_ascii=False).encode("utf-8"), 9)
    tag = hmac.new(secret, _PURPOSE + payload, hashlib.sha256).digest()[:TAG_BYTES]
    return base64.urlsafe_b64encode(tag + payload).decode("ascii").rstrip("=")


def decode_file_link(link: str, secret: bytes) -> tuple[str, str]:
    """(file name, translated text) of a download id made by encode_file_link with the same secret."""
    if len(link) > MAX_LINK_CHARS or not _LINK_CHARACTERS.match(link):
        raise FileLinkError("Invalid filename")
    try:
        raw = base64.urlsafe_b64decode(link + "=" * (-len(link) % 4))
    except (binascii.Error, ValueError):
        raise FileLinkError("Invalid filename") from None
    tag, payload = raw[:TAG_BYTES], raw[TAG_BYTES:]
    expected = hmac.new(secret, _PURPOSE + payload, hashlib.sha256).digest()[:TAG_BYTES]
    if len(tag) < TAG_BYTES or not hmac.compare_digest(tag, expected):
        raise FileLinkError("Invalid filename")
    filename, text = json.loads(zlib.decompress(payload).decode("utf-8"))
    return filename, text


__all__ = ["FileLinkError", "decode_file_link", "encode_file_link"]
