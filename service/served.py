"""What a translator replica serves with, shared by its rooms (service/deployments.py the requests and the decode
loop, service/finishing.py the work after a decode, service/explaining.py the explanations): the model's spec, its
translator and the reverse model, the metrics, the explanation ids' secret; and the model's description for
GET /v1/models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from model import Translator
from service.config import ModelSpec
from service.explanations import ExplanationKey, encode_explanation_id
from service.schemas import V1_MAX_TEXT_CHARS


@dataclass
class Served:
    spec: ModelSpec
    translator: Translator
    reverse: Translator | None  # the served model translating the other way (agreement, trust "full"), or None
    metrics: Any  # service.metrics.service_metrics
    secret: bytes  # signs explanation ids (service.config.explanation_secret)
    replica: str

    @property
    def no_reverse_note(self) -> str:
        spec = self.spec
        return f"no model translating {spec.target_lang}→{spec.source_lang} is served: the head's one-best"

    def explanation_id(self, source_ids: list[int], target_ids: list[int], alignment_method: str) -> str | None:
        """The id of (source, target) with the alignment given: a fetch gives the same alignment."""
        if not source_ids:
            return None  # a blank text: nothing was decoded, nothing to explain
        key = ExplanationKey(
            self.spec.id, self.translator.weights_digest, tuple(source_ids), tuple(target_ids), alignment_method
        )
        return encode_explanation_id(key, self.secret)

    def info(self) -> dict[str, Any]:
        """This model's entry in GET /v1/models."""
        translator, config = self.translator, self.translator.config
        return {
            "id": self.spec.id,
            "source_lang": self.spec.source_lang,
            "target_lang": self.spec.target_lang,
            "weights_digest": translator.weights_digest,
            "device": str(translator.device),
            "precision": translator.precision,
            "explanation_precision": translator.explanation_precision,
            "steps_precision": translator.steps_precision,
            "runtime": translator.runtime_info,
            "encoder_layers": config.encoder_layers,
            "decoder_layers": config.decoder_layers,
            "encoder_attention_heads": config.encoder_attention_heads,
            "decoder_attention_heads": config.decoder_attention_heads,
            "d_model": config.d_model,
            "alignment_layer": translator.alignment_layer,
            "alignment_head": translator.alignment_head[1],
            "alignment_shift": translator.alignment_shift,
            "alignment_source": translator.alignment.reason,
            "alignment_methods": ["agreement", "head"] if self.reverse is not None else ["head"],
            "trust": {**translator.trust_info, "full_available": self.reverse is not None},
            "max_source_tokens": config.max_position_embeddings,
            "max_text_characters": V1_MAX_TEXT_CHARS,  # /v1's limit
        }
