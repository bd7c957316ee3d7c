"""Stateless explanation ids: (model id, weights digest, source and target token ids, the alignment method) packed
as varints and signed (truncated HMAC-SHA256) in a URL-safe string, so any replica recomputes an explanation, with
the alignment it was given with, and nothing is stored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass

from model import AlignmentMethod

FORMAT_VERSION = 2  # 2 added the alignment method; version 1 ids (no method) were made with the head's one-best
ALIGNMENT_METHOD_CODES = {AlignmentMethod.HEAD: 0, AlignmentMethod.AGREEMENT: 1}
TAG_BYTES = 12
DIGEST_BYTES = 8  # the 16 hex characters of Translator.weights_digest
MAX_ID_CHARS = 8192
MAX_TOKENS = 4096
_ID_CHARACTERS = re.compile(r"^[A-Za-z0-9_-]+$")


class ExplanationIdError(ValueError):
    """The id is not well formed (wrong characters, too long): a client error."""


class ExplanationNotFoundError(LookupError):
    """The id is well formed but does not verify, or names weights that are not served."""


@dataclass(frozen=True)
class ExplanationKey:
    model_id: str
    weights_digest: str  # 16 hex characters
    source_ids: tuple[int, ...]
    target_ids: tuple[int, ...]
    alignment_method: AlignmentMethod = AlignmentMethod.HEAD  # the alignment the explanation was given with


def _write_varint(value: int, out: bytearray) -> None:
    if value < 0:
        raise ValueError("varints are unsigned")
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.position = data, 0

    def byte(self) -> int:
        if self.position >= len(self.data):
            raise ExplanationNotFoundError("explanation id is truncated")
        value = self.data[self.position]
        self.position += 1
        return value

    def varint(self) -> int:
        value, shift = 0, 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 35:
                raise ExplanationNotFoundError("explanation id holds an oversized number")

    def take(self, count: int) -> bytes:
        if self.position + count > len(self.data):
            raise ExplanationNotFoundError("explanation id is truncated")
        chunk = self.data[self.position : self.position + count]
        self.position += count
        return chunk

    def ids(self) -> tuple[int, ...]:
        count = self.varint()
        if count > MAX_TOKENS:
            raise ExplanationNotFoundError("explanation id holds too many tokens")
        return tuple(self.varint() for _ in range(count))


def _tag(secret: bytes, payload: bytes) -> bytes:
    return hmac.new(secret, payload, hashlib.sha256).digest()[:TAG_BYTES]


def encode_explanation_id(key: ExplanationKey, secret: bytes) -> str:
    """The compact, URL-safe, signed id of an explanation."""
    payload = bytearray([FORMAT_VERSION])
    model = key.model_id.encode("utf-8")
    _write_varint(len(model), payload)
    payload += model
    payload += bytes.fromhex(key.weights_digest)[:DIGEST_BYTES].ljust(DIGEST_BYTES, b"\0")
    for ids in (key.source_ids, key.target_ids):
        _write_varint(len(ids), payload)
        for token_id in ids:
            _write_varint(token_id, payload)
    payload.append(ALIGNMENT_METHOD_CODES[key.alignment_method])
    signed = bytes(payload) + _tag(secret, bytes(payload))
    return base64.urlsafe_b64encode(signed).rstrip(b"=").decode("ascii")


def decode_explanation_id(explanation_id: str, secret: bytes) -> ExplanationKey:
    """Verify and unpack an id; ExplanationIdError if malformed, ExplanationNotFoundError if it does not verify
    (truncated, altered or forged)."""
    if len(explanation_id) > MAX_ID_CHARS:
        raise ExplanationIdError(f"explanation ids are at most {MAX_ID_CHARS} characters")
    if not _ID_CHARACTERS.match(explanation_id):
        raise ExplanationIdError("explanation ids use only the URL-safe base64 alphabet (A-Z a-z 0-9 - _)")
    try:
        signed = base64.urlsafe_b64decode(explanation_id + "=" * (-len(explanation_id) % 4))
    except (binascii.Error, ValueError):
        raise ExplanationNotFoundError("no explanation with this id") from None
    if len(signed) <= TAG_BYTES:
        raise ExplanationNotFoundError("no explanation with this id")
    payload, tag = signed[:-TAG_BYTES], signed[-TAG_BYTES:]
    if not hmac.compare_digest(tag, _tag(secret, payload)):
        raise ExplanationNotFoundError("no explanation with this id")
    reader = _Reader(payload)
    version = reader.byte()
    if version not in (1, FORMAT_VERSION):
        raise ExplanationNotFoundError("explanation id has an unknown format version")
    try:
        model_id = reader.take(reader.varint()).decode("utf-8")
    except UnicodeDecodeError:
        raise ExplanationNotFoundError("no explanation with this id") from None
    digest = reader.take(DIGEST_BYTES).hex()
    source_ids, target_ids = reader.ids(), reader.ids()
    method = AlignmentMethod.HEAD
    if version >= 2:
        code = reader.byte()
        method = next((name for name, value in ALIGNMENT_METHOD_CODES.items() if value == code), None)
        if method is None:
            raise ExplanationNotFoundError("explanation id names an unknown alignment method")
    if reader.position != len(payload):
        raise ExplanationNotFoundError("no explanation with this id")
    return ExplanationKey(model_id, digest, source_ids, target_ids, method)
