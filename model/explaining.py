"""A translator's explanations of a given pair: its maps recomputed through the step that decoded (`explain`), a
translation made elsewhere read as this model would have answered it (`force`), attributions, and one head's
attention step by step. Translator delegates here; model.explanations holds the arithmetic.
"""

from __future__ import annotations

from model.agreeing import Aligner
from model.decoding.search import Hypothesis, forced_pass
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
from model.results import Explanation, Translation
from model.tokenizer import MarianTokenizer
from model.transformer import Transformer
from model.translation import Builder


class Explainer:
    """One model's explanations (Translator.force, explain, attribute, attention_steps): forced passes through the
    `step` that decodes `model`, the lecture's arithmetic on `exact_model`."""

    def __init__(
        self, model: Transformer, exact_model: Transformer, step, tokenizer: MarianTokenizer, aligner: Aligner,
        builder: Builder,
    ) -> None:
        self.model, self.exact_model, self.step, self.tokenizer = model, exact_model, step, tokenizer
        self.aligner, self.builder = aligner, builder

    def force(self, source: str, target: str) -> Translation:
        """Translator.force."""
        source_ids, target_ids = self.aligner.pair_ids(source, target)
        decoded = forced_decode(self.exact_model, source_ids, target_ids, encoder_attention=False)
        hypothesis = Hypothesis(
            token_ids=target_ids,
            score=sum(decoded.token_logprobs),
            token_logprobs=decoded.token_logprobs,
            cross_attention=None,
            normalized_score=0.0,
            alignment_attention=alignment_matrix(decoded.cross_attention, *self.aligner.alignment_head),
        )
        return self.builder.build(source_ids, hypothesis, keep_attention=False)

    def explain(
        self, source_ids: list[int], target_ids: list[int], encoder_attention: bool, reverse: Aligner | None
    ) -> Explanation:
        """Translator.explain (`reverse`: the reverse model's Aligner)."""
        source_ids, target_ids = list(source_ids), list(target_ids)
        check_ids(self.model, source_ids, target_ids)
        decoded = forced_pass(self.step, source_ids, target_ids)
        encoder_maps = encoder_self_attention(self.exact_model, source_ids) if encoder_attention else None
        tokenizer, head = self.tokenizer, self.aligner.alignment_head
        source_tokens = tokenizer.source_tokens(source_ids)
        target_tokens = tokenizer.target_tokens(target_ids)
        matrix = alignment_matrix(decoded.cross_attention, *head)
        pairs, words = self.aligner.links(matrix, source_tokens, target_tokens)
        (agreed,) = self.aligner.agreements(
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
            alignment_head=head,
            alignment_shift=self.aligner.alignment_shift,
            cross_attention=decoded.cross_attention,
            encoder_self_attention=encoder_maps,
            alignment_method=agreed.method,
            alignment_note=agreed.note,
        )

    def attribute(self, source_ids: list[int], target_ids: list[int], method: str, steps: int | None) -> Attributions:
        """Translator.attribute."""
        unknown_ids = (self.tokenizer.source_unk_id, self.tokenizer.target_unk_id)
        return attribute(self.exact_model, list(source_ids), list(target_ids), method, unknown_ids, steps)

    def attention_steps(
        self, source_ids: list[int], target_ids: list[int], kind: str, layer: int | None, head: int, position: int
    ) -> AttentionSteps:
        """Translator.attention_steps."""
        if layer is None:
            layer = self.aligner.alignment_head[0] if kind == "cross" else self.exact_model.config.encoder_layers - 1
        return attention_steps(self.exact_model, list(source_ids), list(target_ids), kind, layer, head, position)
