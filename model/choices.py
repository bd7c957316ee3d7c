"""What a request may ask of the engine, without the engine: alignment methods, trust modes and flag kinds,
attribution methods and their steps. It imports nothing (no torch), so a process that only checks requests (the
service's ingress) can name them without loading the model's code; the modules that act on them import them
from here.
"""

from __future__ import annotations

from enum import Enum


class AlignmentMethod(str, Enum):
    """How `alignment` and `word_alignment` are made: the alignment head's one-best link per target token, or the
    links the model's and the reverse model's heads agree on. A str, so it compares, hashes and serialises as its
    value ("head" == AlignmentMethod.HEAD)."""

    AGREEMENT = "agreement"
    HEAD = "head"

    def __str__(self) -> str:
        return self.value


ALIGNMENT_METHODS = tuple(method.value for method in AlignmentMethod)  # ("agreement", "head")
# The one table of defaults: what each way in asks for when the client names no method. /v1/translate and the
# compatibility routes default to the cheap one (agreement costs a forced decode of the reverse model per
# hypothesis); /v1/explain, one pair shown in full, to the better one; an explanation id carries its own.
DEFAULT_ALIGNMENT = {
    "translate": AlignmentMethod.HEAD,
    "explain": AlignmentMethod.AGREEMENT,
    "explanation": AlignmentMethod.HEAD,
}

TRUST_MODES = ("off", "fast", "full")
DEFAULT_TRUST_MODE = "fast"
FLAG_KINDS = ("omission", "addition", "repetition", "untranslated", "truncated")

ATTRIBUTION_METHODS = ("saliency", "input_x_gradient", "integrated_gradients", "value_zeroing", "alti_plus")
# integrated gradients: Gauss-Legendre points on the path, captum's (and so inseq's) default
ATTRIBUTION_DEFAULT_STEPS = 50
ATTRIBUTION_MAX_STEPS = 100
