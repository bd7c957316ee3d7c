"""Engine results → JSON-ready dicts (lists and floats): the only place tensors become JSON.

No arithmetic on tensors happens here beyond `.tolist()`; the head average of the
"summary" map is taken over the plain lists.
"""

from __future__ import annotations

from typing import Any

from model import Translation


def head_average(heads: list[list[list[float]]]) -> list[list[float]]:
    """[head][target][source] → [target][source], the mean over heads."""
    count = len(heads)
    return [[sum(column) / count for column in zip(*rows)] for rows in zip(*heads)]


def hypothesis_json(
    translation: Translation, explanation_id: str, attention: str, alignment_layer: int
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "text": translation.text,
        "source_tokens": translation.source_tokens,
        "target_tokens": translation.target_tokens,
        "score": float(translation.score),
        "token_scores": [float(x) for x in translation.token_logprobs],
        "alignment": [list(pair) for pair in translation.alignment],
        "word_alignment": [list(pair) for pair in translation.word_alignment],
        "source_words": translation.source_words,
        "target_words": translation.target_words,
        "explanation_id": explanation_id,
    }
    if attention != "none" and translation.cross_attention is not None:
        cross_attention = translation.cross_attention.tolist()  # [layer][head][target][source]
        result["attention"] = {
            "layer": alignment_layer,
            "summary": head_average(cross_attention[alignment_layer]),
            "cross_attention": cross_attention if attention == "full" else None,
        }
    return result


def steps_json(steps: Any) -> dict[str, Any]:
    """model.explain.AttentionSteps → the "steps" object of POST /v1/explain."""
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
