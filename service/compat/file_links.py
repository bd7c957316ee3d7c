"""Stateless download links for POST /translate_file: the translated file travels inside its own signed link
(file name and text, zlib-compressed, HMAC-signed with the service's signing secret, URL-safe base64), so any
replica serves it, after restarts and scale-outs, and nothing is stored or expires.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import zlib

from service.errors import FileLinkError

TAG_BYTES = 12
MAX_LINK_CHARS = 200_000
_LINK_CHARACTERS = re.compile(r"^[A-Za-z0-9_-]+$")
_PURPOSE = b"translate_file:"


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


__all__ = ["decode_file_link", "encode_file_link"]
