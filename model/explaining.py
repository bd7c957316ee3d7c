"""A translator's explanations of a given pair: its maps recomputed through the step that decoded (`explain`), a
translation made elsewhere read as this model would have answered it (`force`), attributions, and one head's
attention step by step. Translator delegates here; model.explanations holds the arithmetic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from model.decoding.search import Hypothesis
from model.explanations.agreement import AlignmentItem
from model.explanations.alignment import alignment_matrix
from model.explanations.attribution import Attributions, attribute
from model.explanations.explain import (
    AttentionSteps,
    attention_steps,
    check_ids,
    encoder_self_attention,
    forced_decode,
)
from model.runtime import forced_pass
from model.translation import Explanation, Translation

if TYPE_CHECKING:
    from model.translator import Translator


class Explainer:
    """One translator's explanations (Translator.force, explain, attribute, attention_steps)."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator

    def force(self, source: str, target: str) -> Translation:
        """Translator.force."""
        translator = self.translator
        source_ids, target_ids = translator._aligner.pair_ids(source, target)
        decoded = forced_decode(translator.exact_model, source_ids, target_ids, encoder_attention=False)
        hypothesis = Hypothesis(
            token_ids=target_ids,
            score=sum(decoded.token_logprobs),
            token_logprobs=decoded.token_logprobs,
            cross_attention=None,
            normalized_score=0.0,
            alignment_attention=alignment_matrix(decoded.cross_attention, *translator.alignment_head),
        )
        return translator._builder.build(source_ids, hypothesis, keep_attention=False)

    def explain(
        self, source_ids: list[int], target_ids: list[int], encoder_attention: bool, reverse: Translator | None
    ) -> Explanation:
        """Translator.explain."""
        translator = self.translator
        source_ids, target_ids = list(source_ids), list(target_ids)
        check_ids(translator.model, source_ids, target_ids)
        decoded = forced_pass(translator.step, source_ids, target_ids)
        encoder_maps = encoder_self_attention(translator.exact_model, source_ids) if encoder_attention else None
        tokenizer = translator.tokenizer
        source_tokens = tokenizer.source_tokens(source_ids)
        target_tokens = tokenizer.target_tokens(target_ids)
        matrix = alignment_matrix(decoded.cross_attention, *translator.alignment_head)
        pairs, words = translator._aligner.links(matrix, source_tokens, target_tokens)
        (agreed,) = translator._aligner.agreements(
            [AlignmentItem(source_ids, target_ids, pairs, words[0], matrix)], reverse
        )
        return Explanation(
            source_ids=source_ids,
            target_ids=target_ids,
            source_tokens=source_tokens,
            target_tokens=target_tokens,
            source_text=tokenizer.source_text(source_ids),
            text=tokenizer.detokenize(target_ids),
            token_logprobs=decoded.token_logprobs,
            alignment=agreed.token_links,
            word_alignment=agreed.word_links,
            source_words=words[1],
            target_words=words[2],
            alignment_head=translator.alignment_head,
            alignment_shift=translator.alignment_shift,
            cross_attention=decoded.cross_attention,
            encoder_self_attention=encoder_maps,
            alignment_method=agreed.method,
            alignment_note=agreed.note,
        )

    def attribute(self, source_ids: list[int], target_ids: list[int], method: str, steps: int | None) -> Attributions:
        """Translator.attribute."""
        translator = self.translator
        unknown_ids = (translator.tokenizer.source_unk_id, translator.tokenizer.target_unk_id)
        return attribute(translator.exact_model, list(source_ids), list(target_ids), method, unknown_ids, steps)

    def attention_steps(
        self, source_ids: list[int], target_ids: list[int], kind: str, layer: int | None, head: int, position: int
    ) -> AttentionSteps:
        """Translator.attention_steps."""
        translator = self.translator
        if layer is None:
            layer = translator.alignment_layer if kind == "cross" else translator.config.encoder_layers - 1
        return attention_steps(
            translator.exact_model, list(source_ids), list(target_ids), kind, layer, head, position
        )
