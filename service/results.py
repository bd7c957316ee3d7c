"""Engine results → the records a translation crosses Ray as (service/records.py) and the JSON-ready dicts of
explanations: the only place tensors become lists; no arithmetic on tensors beyond `.tolist()` (the "summary"
head average is taken over the plain lists).
"""

from __future__ import annotations

from typing import Any

from model import Explanation, Translation, Trust
from service.records import AttentionRecord, TranslationRecord, TrustFlagRecord, TrustRecord


def head_average(heads: list[list[list[float]]]) -> list[list[float]]:
    """[head][target][source] → [target][source], the mean over heads."""
    count = len(heads)
    return [[sum(column) / count for column in zip(*rows)] for rows in zip(*heads)]


def alignment_map(
    cross_attention: list, alignment_head: tuple[int, int | None], shift: bool = False
) -> list[list[float]]:
    """The [target][source] map alignments are read from: the alignment head, or its layer's head average;
    with `shift`, row t is the step where target token t is the decoder's input (the last row repeats)."""
    layer, head = alignment_head
    rows = head_average(cross_attention[layer]) if head is None else cross_attention[layer][head]
    return rows[1:] + rows[-1:] if shift and len(rows) > 1 else rows


def translation_record(
    translation: Translation,
    explanation_id: str | None,
    attention: str,
    alignment_head: tuple[int, int | None],
    shift: bool = False,
) -> TranslationRecord:
    """One hypothesis (without its alternatives) as the record that crosses Ray (service/records.py)."""
    maps = None
    if attention != "none" and translation.cross_attention is not None:
        cross_attention = translation.cross_attention.tolist()  # [layer][head][target][source]
        maps = AttentionRecord(
            layer=alignment_head[0],
            head=alignment_head[1],
            shift=shift,
            summary=alignment_map(cross_attention, alignment_head, shift),
            cross_attention=cross_attention if attention == "full" else None,
        )
    return TranslationRecord(
        text=translation.text,
        source_tokens=translation.source_tokens,
        target_tokens=translation.target_tokens,
        alignment=[list(pair) for pair in translation.alignment],
        score=float(translation.score),
        token_scores=[float(x) for x in translation.token_logprobs],
        word_alignment=[list(pair) for pair in translation.word_alignment],
        source_words=translation.source_words,
        target_words=translation.target_words,
        alignment_method=translation.alignment_method,
        alignment_note=translation.alignment_note,
        explanation_id=explanation_id,
        trust=None if translation.trust is None else trust_record(translation.trust),
        attention=maps,
        glossary_tokens=[i for i, forced in enumerate(translation.forced) if forced] if translation.forced else None,
        search_note=translation.search_note,
    )


def trust_record(trust: Trust) -> TrustRecord:
    flags = [TrustFlagRecord(flag.kind, flag.side, list(flag.words), list(flag.text)) for flag in trust.flags]
    held_out = None if trust.held_out is None else dict(trust.held_out)
    return TrustRecord(trust.score, flags, dict(trust.signals), trust.mode, trust.calibrated, held_out)


def explanation_json(explained: Explanation, model_id: str, explanation_id: str) -> dict[str, Any]:
    """model.Explanation → the object of GET /v1/explanations/{id} (and the base of POST /v1/explain)."""
    result: dict[str, Any] = {
        "model": model_id,
        "explanation_id": explanation_id,
        "source": explained.source_text,
        "translation": explained.text,
        "source_tokens": explained.source_tokens,
        "target_tokens": explained.target_tokens,
        "token_scores": [float(x) for x in explained.token_logprobs],
        "alignment_layer": explained.alignment_head[0],
        "alignment_head": explained.alignment_head[1],
        "alignment_shift": explained.alignment_shift,
        "alignment": [list(pair) for pair in explained.alignment],
        "word_alignment": [list(pair) for pair in explained.word_alignment],
        "source_words": explained.source_words,
        "target_words": explained.target_words,
        "alignment_method": explained.alignment_method,
        "alignment_note": explained.alignment_note,
        "cross_attention": explained.cross_attention.tolist(),
    }
    if explained.encoder_self_attention is not None:
        result["encoder_self_attention"] = explained.encoder_self_attention.tolist()
    return result


def attributions_json(attributions: Any) -> dict[str, Any]:
    """model.Attributions → the "attributions" object of POST /v1/explain."""
    return {
        "method": attributions.method,
        "source": attributions.source.tolist(),
        "target": attributions.target.tolist(),
        "source_share": attributions.source_share.tolist(),
    }


def steps_json(steps: Any) -> dict[str, Any]:
    """model.explanations.explain.AttentionSteps → the "steps" object of POST /v1/explain."""
    return {
        "kind": steps.kind,
        "layer": steps.layer,
        "head": steps.head,
        "position": steps.position,
        "d_k": int(steps.d_k),
        **{
            name: getattr(steps, name).tolist()
            for name in ("x_query", "x", "q", "k", "v", "scores", "scaled_scores", "weights", "output")
        },
    }
