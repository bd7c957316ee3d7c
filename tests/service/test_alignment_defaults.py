"""The alignment method's defaults come from one table (model.DEFAULT_ALIGNMENT), and the enum reads as its strings
wherever the layers pass it (JSON bodies, explanation ids)."""

from __future__ import annotations

import json

from model import ALIGNMENT_METHODS, DEFAULT_ALIGNMENT, AlignmentMethod
from service.explanations import ExplanationKey, decode_explanation_id, encode_explanation_id
from service.messages import ExplainView, TranslateCall
from service.schemas import ExplainRequest, TranslateRequest


def test_the_api_defaults_are_the_tables():
    assert TranslateRequest.model_fields["alignment_method"].default == DEFAULT_ALIGNMENT["translate"]
    assert TranslateCall(["x"], None).alignment_method == DEFAULT_ALIGNMENT["translate"]
    assert ExplainRequest.model_fields["alignment_method"].default is None  # None: the id's, else the table's
    assert ExplainView("cross", None, 0, 0).alignment_method is None
    assert DEFAULT_ALIGNMENT == {"translate": "head", "explain": "agreement", "explanation": "head"}


def test_the_enum_is_its_strings():
    assert tuple(AlignmentMethod) == tuple(AlignmentMethod(v) for v in ALIGNMENT_METHODS)
    assert json.dumps({"m": AlignmentMethod.AGREEMENT}) == '{"m": "agreement"}'
    assert {"head": 1}[AlignmentMethod.HEAD] == 1 and str(AlignmentMethod.HEAD) == "head"


def test_an_explanation_id_round_trips_the_method_given_as_enum_or_string():
    for method in ("agreement", AlignmentMethod.AGREEMENT, "head"):
        key = ExplanationKey("en-zh", "0" * 16, (5, 6, 0), (7, 0), method)
        decoded = decode_explanation_id(encode_explanation_id(key, b"secret"), b"secret")
        assert decoded.alignment_method == method and isinstance(decoded.alignment_method, AlignmentMethod)
