"""The messages between the ingress and the translator deployments: what a call carries and what comes back
instead of a raised error. Plain dataclasses, pickled by Ray on the way.
"""

from __future__ import annotations

from dataclasses import dataclass

from model import DEFAULT_ALIGNMENT, AlignmentMethod, DecodingOptions
from service.schemas import V1_MAX_TEXT_CHARS


@dataclass(frozen=True)
class TranslateCall:
    """One translate request (POST /v1/translate, or a compatibility route's sentences) on its way to a translator."""

    texts: list[str]
    options: DecodingOptions
    attention: str = "none"  # "none" | "summary" | "full": only changes what is returned
    source_share: bool = False  # add ALTI+'s token_source_shares and source_share to each translation
    max_text_chars: int = V1_MAX_TEXT_CHARS  # the asking route's character limit, quoted when a text is too long
    alignment_method: AlignmentMethod = DEFAULT_ALIGNMENT["translate"]
    trust: str = "off"  # "fast" | "full": each hypothesis carries `trust` (schemas.TrustMode; model.trust)
    terms: list[list[str]] | None = None  # per text, the glossary's target terms its translation must contain


@dataclass(frozen=True)
class ExplainView:
    """What a POST /v1/explain asks to see of a pair, as it travels from the ingress to a translator."""

    kind: str  # the attention whose arithmetic is shown step by step (schemas.AttentionKind)
    layer: int | None
    head: int
    position: int
    method: str = "attention"  # or an attribution method (schemas.ExplainMethod), whose attributions are added
    steps: int | None = None  # integrated gradients' steps
    alignment_method: AlignmentMethod | None = None  # None: the id's method, else DEFAULT_ALIGNMENT["explain"]


@dataclass
class Rejected:
    """A request the engine refused (bad input, unknown weights), returned instead of raised.

    The ingress re-raises `error` and maps it like any other; returning it keeps Ray from
    logging a traceback per invalid request and from wrapping the error in RayTaskError.
    In a coalesced translate call an unexpected failure of one request is returned this way
    too (logged by the translator, answered 500), so the other requests of the call still get theirs.
    """

    error: Exception


__all__ = ["ExplainView", "Rejected", "TranslateCall"]
