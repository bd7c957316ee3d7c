"""Marian-compatible Transformer engine: load, translate, explain. No web code lives here."""

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
from model.explanations.agreement import (
    ALIGNMENT_METHODS,
    DEFAULT_ALIGNMENT,
    AgreedAlignment,
    AlignmentMethod,
    AlignmentRows,
    agreed_alignment,
)
from model.explanations.attribution import DEFAULT_STEPS as ATTRIBUTION_DEFAULT_STEPS
from model.explanations.attribution import MAX_STEPS as ATTRIBUTION_MAX_STEPS
from model.explanations.attribution import METHODS as ATTRIBUTION_METHODS
from model.explanations.attribution import Attributions
from model.explanations.explain import AttentionSteps
from model.options import MAX_BEAM_SIZE, DecodingOptions
from model.transformer import Transformer
from model.translator import Explanation, StreamedToken, Translation, Translator
from model.trust import DEFAULT_TRUST_MODE, FLAG_KINDS, TRUST_MODES, Trust, TrustFlag

__all__ = [
    "ALIGNMENT_METHODS",
    "DEFAULT_ALIGNMENT",
    "AlignmentMethod",
    "AgreedAlignment",
    "AlignmentRows",
    "agreed_alignment",
    "ATTRIBUTION_DEFAULT_STEPS",
    "ATTRIBUTION_MAX_STEPS",
    "ATTRIBUTION_METHODS",
    "Attributions",
    "Batch",
    "AttentionSteps",
    "DecodingOptions",
    "MAX_BEAM_SIZE",
    "Explanation",
    "CheckpointError",
    "DecoderBusyError",
    "Hypothesis",
    "InputTooLongError",
    "InvalidInputError",
    "ModelConfig",
    "Transformer",
    "StreamedToken",
    "Translation",
    "Translator",
    "DEFAULT_TRUST_MODE",
    "FLAG_KINDS",
    "TRUST_MODES",
    "Trust",
    "TrustFlag",
    "TranslatorError",
    "UnknownModelError",
]
