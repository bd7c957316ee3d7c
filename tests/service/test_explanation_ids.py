"""Explanation ids: compact, URL-safe, round-trip exactly, and reject every alteration."""

import pytest

from service.explanations import (
    MAX_ID_CHARS,
    ExplanationIdError,
    ExplanationKey,
    ExplanationNotFoundError,
    decode_explanation_id,
    encode_explanation_id,
)

SECRET = b"test-secret"
KEY = ExplanationKey("en-zh", "0123456789abcdef", (12, 300, 5, 0), (7, 70000, 0))


def test_an_id_round_trips_to_the_same_key():
    assert decode_explanation_id(encode_explanation_id(KEY, SECRET), SECRET) == KEY


def test_an_id_is_url_safe_and_compact():
    explanation_id = encode_explanation_id(KEY, SECRET)
    assert explanation_id.replace("-", "").replace("_", "").isalnum()
    assert len(explanation_id) < 64


def test_a_long_sentence_still_gives_a_short_id():
    key = ExplanationKey("en-zh", "0123456789abcdef", tuple(range(1000, 1100)), tuple(range(2000, 2120)))
    assert len(encode_explanation_id(key, SECRET)) < 700  # about 2 bytes per token, base64


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_a_truncated_id_is_not_found(cut):
    explanation_id = encode_explanation_id(KEY, SECRET)
    with pytest.raises(ExplanationNotFoundError):
        decode_explanation_id(explanation_id[:-cut], SECRET)


def test_an_altered_id_is_not_found():
    explanation_id = encode_explanation_id(KEY, SECRET)
    for position in range(len(explanation_id)):
        replacement = "A" if explanation_id[position] != "A" else "B"
        forged = explanation_id[:position] + replacement + explanation_id[position + 1 :]
        try:
            decoded = decode_explanation_id(forged, SECRET)
        except ExplanationNotFoundError:
            continue
        assert decoded == KEY  # only a change in base64 padding bits may decode to the same bytes


def test_an_id_signed_with_another_secret_is_not_found():
    with pytest.raises(ExplanationNotFoundError):
        decode_explanation_id(encode_explanation_id(KEY, b"other"), SECRET)


@pytest.mark.parametrize("bad", ["has space", "slash/", "dot.", "plus+", "é", "x" * (MAX_ID_CHARS + 1)])
def test_a_malformed_id_is_a_client_error(bad):
    with pytest.raises(ExplanationIdError):
        decode_explanation_id(bad, SECRET)


@pytest.mark.parametrize("garbage", ["A", "AAAA", "abc_-xyz", "0" * 40])
def test_random_well_formed_text_is_not_found(garbage):
    with pytest.raises(ExplanationNotFoundError):
        decode_explanation_id(garbage, SECRET)


def test_the_alignment_method_round_trips():
    key = ExplanationKey("en-zh", "0123456789abcdef", (12, 300, 5, 0), (7, 70000, 0), "agreement")
    assert decode_explanation_id(encode_explanation_id(key, SECRET), SECRET) == key
    assert encode_explanation_id(key, SECRET) != encode_explanation_id(KEY, SECRET)


def test_an_id_made_before_alignment_methods_names_the_heads_one_best():
    # format 1, written out by hand: version, model id, digest, source ids, target ids (one-byte varints), HMAC tag
    import base64
    import hashlib
    import hmac

    payload = bytes([1, 5, *b"en-zh", *bytes.fromhex("0123456789abcdef"), 2, 12, 0, 2, 7, 0])
    tag = hmac.new(SECRET, payload, hashlib.sha256).digest()[:12]
    old_id = base64.urlsafe_b64encode(payload + tag).rstrip(b"=").decode("ascii")
    key = decode_explanation_id(old_id, SECRET)
    assert (key.model_id, key.source_ids, key.target_ids, key.alignment_method) == ("en-zh", (12, 0), (7, 0), "head")
