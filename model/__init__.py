"""Marian-compatible Transformer engine: load, translate, explain. No web code lives here.

The public names load on first use (PEP 562): `from model import DecodingOptions` imports model.options and
nothing else, so a process that only checks requests (the service's ingress) never loads torch. The names of
model.choices, model.options and model.errors import no torch; the others do.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from model.cpu_isa import limit_libraries

limit_libraries()  # TRANSLATE_CPU_ISA's limits for ATen, oneDNN and MKL, which read them at their first use

# public name → (module, name in that module)
_PUBLIC = {
    "ModelConfig": ("model.config", "ModelConfig"),
    "Batch": ("model.decoding.scheduler", "Batch"),
    "Hypothesis": ("model.decoding.search", "Hypothesis"),
    **{
        name: ("model.errors", name)
        for name in (
            "CheckpointError",
            "DecoderBusyError",
            "InputTooLongError",
            "InvalidInputError",
            "TranslatorError",
            "UnknownModelError",
        )
    },
    **{
        name: ("model.choices", name)
        for name in (
            "ALIGNMENT_METHODS",
            "DEFAULT_ALIGNMENT",
            "AlignmentMethod",
            "ATTRIBUTION_DEFAULT_STEPS",
            "ATTRIBUTION_MAX_STEPS",
            "ATTRIBUTION_METHODS",
            "DEFAULT_TRUST_MODE",
            "FLAG_KINDS",
            "TRUST_MODES",
        )
    },
    **{
        name: ("model.explanations.agreement", name)
        for name in ("AgreedAlignment", "AlignmentRows", "agreed_alignment")
    },
    "Attributions": ("model.explanations.attribution", "Attributions"),
    "AttentionSteps": ("model.explanations.explain", "AttentionSteps"),
    "MAX_BEAM_SIZE": ("model.options", "MAX_BEAM_SIZE"),
    "DecodingOptions": ("model.options", "DecodingOptions"),
    "Transformer": ("model.transformer", "Transformer"),
    **{
        name: ("model.results", name)
        for name in ("Explanation", "StreamedToken", "Translation")
    },
    "Translator": ("model.translator", "Translator"),
    "ReverseReading": ("model.agreeing", "ReverseReading"),
    "Trust": ("model.trust", "Trust"),
    "TrustFlag": ("model.trust", "TrustFlag"),
}

__all__ = [  # the keys of _PUBLIC (tests/model/test_public_api.py)
    "ALIGNMENT_METHODS",
    "ATTRIBUTION_DEFAULT_STEPS",
    "ATTRIBUTION_MAX_STEPS",
    "ATTRIBUTION_METHODS",
    "AgreedAlignment",
    "AlignmentMethod",
    "AlignmentRows",
    "AttentionSteps",
    "Attributions",
    "Batch",
    "CheckpointError",
    "DEFAULT_ALIGNMENT",
    "DEFAULT_TRUST_MODE",
    "DecoderBusyError",
    "DecodingOptions",
    "Explanation",
    "FLAG_KINDS",
    "Hypothesis",
    "InputTooLongError",
    "InvalidInputError",
    "MAX_BEAM_SIZE",
    "ModelConfig",
    "ReverseReading",
    "StreamedToken",
    "TRUST_MODES",
    "Transformer",
    "Translation",
    "Translator",
    "TranslatorError",
    "Trust",
    "TrustFlag",
    "UnknownModelError",
    "agreed_alignment",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'model' has no attribute {name!r}")
    module, attribute = _PUBLIC[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


if TYPE_CHECKING:  # what type checkers and editors see
    from model.agreeing import ReverseReading
    from model.choices import (
        ALIGNMENT_METHODS,
        ATTRIBUTION_DEFAULT_STEPS,
        ATTRIBUTION_MAX_STEPS,
        ATTRIBUTION_METHODS,
        DEFAULT_ALIGNMENT,
        DEFAULT_TRUST_MODE,
        FLAG_KINDS,
        TRUST_MODES,
        AlignmentMethod,
    )
    from model.config import ModelConfig
    from model.decoding.scheduler import Batch
    from model.decoding.search import Hypothesis
    from model.errors import (
        CheckpointError,
        DecoderBusyError,
        InputTooLongError,
        InvalidInputError,
        TranslatorError,
        UnknownModelError,
    )
    from model.explanations.agreement import AgreedAlignment, AlignmentRows, agreed_alignment
    from model.explanations.attribution import Attributions
    from model.explanations.explain import AttentionSteps
    from model.options import MAX_BEAM_SIZE, DecodingOptions
    from model.results import Explanation, StreamedToken, Translation
    from model.transformer import Transformer
    from model.translator import Translator
    from model.trust import Trust, TrustFlag
