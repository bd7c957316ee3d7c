"""A translator replica's explanations: a translation's maps recomputed by forced decoding through the step that
decoded it (GET /v1/explanations/{id}), and one head's attention step by step with attributions (POST /v1/explain,
of a pair or of an explanation id). TranslatorDeployment's explanation, explain and explain_ids delegate here.
"""

from __future__ import annotations

from dataclasses import replace

from model import DEFAULT_ALIGNMENT, AlignmentMethod, DecodingOptions, InputTooLongError
from service.explanations import ExplanationNotFoundError
from service.messages import ExplainView
from service.results import attributions_json, explanation_json, steps_json
from service.served import Served


class Explaining:
    """One replica's explanations (blocking calls: the deployment runs them in a worker thread)."""

    def __init__(self, served: Served) -> None:
        self.served = served

    def check_weights(self, weights_digest: str) -> None:
        """An explanation id made with other weights than this replica serves is not found."""
        digest = self.served.translator.weights_digest
        if weights_digest != digest:
            raise ExplanationNotFoundError(
                f"this explanation was made with weights {weights_digest}; model {self.served.spec.id} now serves "
                f"{digest}"
            )

    def forced_decode_json(self, source_ids: list[int], target_ids: list[int], kind: str, method: str) -> dict:
        """The explanation object with the alignment `method` asks for; with kind "explain" also the encoder
        self-attention."""
        served = self.served
        reverse = served.reverse if method == AlignmentMethod.AGREEMENT else None
        explained = served.translator.explain(
            source_ids, target_ids, encoder_attention=kind == "explain", reverse=reverse
        )
        served.metrics.forced_decodes.labels(served.spec.id, kind).inc()
        if reverse is not None:
            served.metrics.forced_decodes.labels(served.spec.id, "agreement").inc()
        result = explanation_json(
            explained, served.spec.id, served.explanation_id(source_ids, target_ids, explained.alignment_method)
        )
        if method == AlignmentMethod.AGREEMENT and reverse is None:
            result["alignment_note"] = served.no_reverse_note
        return result

    def pair_ids(self, source: str, target: str | None, beam_size: int) -> tuple[list[int], list[int]]:
        """POST /v1/explain's pair as ids; no target: the model's own translation at beam_size, its ids straight
        from the decode."""
        translator = self.served.translator
        source_ids = translator.encode_source([source])[0]
        if target is None:
            (own,) = translator.translate([source], DecodingOptions(beam_size=beam_size))
            return source_ids, list(own.target_ids)
        target_ids = translator.tokenizer.encode_target(target)
        limit = translator.config.max_position_embeddings
        if len(target_ids) > limit:
            raise InputTooLongError(f"target has {len(target_ids)} tokens; this model accepts at most {limit}")
        return source_ids, target_ids

    def explain_json(
        self, source_ids: list[int], target_ids: list[int], view: ExplainView, id_method: str | None = None
    ) -> dict:
        """POST /v1/explain's answer: the forced decode, the steps of the view's head, and the view's attributions
        (`id_method`: the alignment an explanation id names, used where the view asks for none)."""
        served = self.served
        if view.alignment_method is None and id_method is not None:
            view = replace(view, alignment_method=id_method)
        attributions = None
        if view.method != "attention":  # first: a pair too long for attributions answers 413 before any other work
            attributions = served.translator.attribute(source_ids, target_ids, view.method, view.steps)
            served.metrics.forced_decodes.labels(served.spec.id, view.method).inc()
        method = view.alignment_method or DEFAULT_ALIGNMENT["explain"]
        result = self.forced_decode_json(source_ids, target_ids, "explain", method)
        steps = served.translator.attention_steps(
            source_ids, target_ids, view.kind, view.layer, view.head, view.position
        )
        result["steps"] = steps_json(steps)
        if attributions is not None:
            result["attributions"] = attributions_json(attributions)
        return result
