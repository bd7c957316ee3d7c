"""Model configuration: the fields of a Marian `config.json` that shape the network.

`ModelConfig.from_marian_dict` reads transformers' MarianConfig fields and refuses,
by name, anything this engine does not implement, so an unsupported checkpoint fails
at load time instead of translating wrongly.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from model.errors import CheckpointError

SUPPORTED_ACTIVATIONS = ("swish", "silu", "relu", "gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh")

# Fields that change the architecture away from the original post-norm, sinusoidal
# Transformer. A checkpoint that sets any of them to a non-default value is refused.
_UNSUPPORTED_IF_TRUE = (
    "normalize_before",
    "add_final_layer_norm",
    "normalize_embedding",
    "layernorm_embedding",
    "add_bias_logits",
    "static_position_embeddings_disabled",
    "learned_pos_emb",
)


# A model card's training recipe line, as OPUS-MT's release notes and converted checkpoints' README.md write it
# ("* model: transformer-align"); OPUS-MT-train's `-align` types are trained with guided alignment.
_MODEL_TYPE_LINE = re.compile(r"^[\s*#>-]*model:\s*([A-Za-z0-9_.+-]+)\s*$", re.IGNORECASE | re.MULTILINE)


def marian_model_type(model_card: str | None) -> str | None:
    """The `model:` a Marian model card names (transformer-align, transformer, ...), lower-cased; None: none."""
    found = _MODEL_TYPE_LINE.search(model_card or "")
    return found.group(1).lower() if found else None


@dataclass(frozen=True)
class AlignmentSource:
    """The cross-attention head alignments are read from, and why.

    reason: "declared" (config.json's alignment_layer/alignment_head); "marian guided alignment (model card)"
    (the card names a `-align` recipe: Marian supervised the last layer's head 0); "marian default" (no
    declaration and no card: Marian's guided-alignment head, which most OPUS-MT models trained); "fallback" (the
    card names an unguided recipe: no head was trained to align, so the penultimate layer's head average, the
    fairseq convention). head None: the layer's head average.
    """

    layer: int
    head: int | None
    reason: str


@dataclass
class ModelConfig:
    """Hyper-parameters of a Marian-shaped encoder-decoder (names as in MarianConfig)."""

    vocab_size: int
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "swish"
    scale_embedding: bool = True
    max_position_embeddings: int = 512
    decoder_vocab_size: int | None = None
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int = 0
    eos_token_id: int = 0
    decoder_start_token_id: int = 0
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    # The cross-attention head trained with guided alignment (None: the alignment layer's head average).
    alignment_layer: int | None = None
    alignment_head: int | None = None
    # True: target token t's alignment is read at the step where t is the decoder's input (the
    # "shift" reading, Chen et al. 2020), the row guided alignment trained; False: at the step
    # that predicts t.
    alignment_shift: bool = False

    def __post_init__(self) -> None:
        if self.alignment_layer is not None and not 0 <= self.alignment_layer < self.decoder_layers:
            raise CheckpointError(
                f"config field alignment_layer={self.alignment_layer} is not a decoder layer "
                f"(0..{self.decoder_layers - 1})"
            )
        if self.alignment_head is not None and not 0 <= self.alignment_head < self.decoder_attention_heads:
            raise CheckpointError(
                f"config field alignment_head={self.alignment_head} is not a decoder head "
                f"(0..{self.decoder_attention_heads - 1})"
            )
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        if self.activation_function not in SUPPORTED_ACTIVATIONS:
            raise CheckpointError(
                f"config field activation_function={self.activation_function!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_ACTIVATIONS)}"
            )
        for name, heads in (("encoder", self.encoder_attention_heads), ("decoder", self.decoder_attention_heads)):
            if heads <= 0 or self.d_model % heads:
                raise CheckpointError(
                    f"config field {name}_attention_heads={heads} does not divide d_model={self.d_model}"
                )
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size != self.vocab_size:
            raise CheckpointError(
                "config field decoder_vocab_size differs from vocab_size while share_encoder_decoder_embeddings is true"
            )

    def alignment_source(self, model_card: str | None = None) -> AlignmentSource:
        """Where alignments are read from, and why (AlignmentSource): config.json's declaration; else, for a
        Marian model, the head Marian's guided alignment trains (the last decoder layer's head 0, at the
        predicting step) unless its model card says it was trained without (`model: transformer`)."""
        if self.alignment_layer is not None:
            return AlignmentSource(self.alignment_layer, self.alignment_head, "declared")
        last = self.decoder_layers - 1
        model_type = marian_model_type(model_card)
        if model_type is None:
            return AlignmentSource(last, 0, "marian default")
        if "-align" in model_type:
            return AlignmentSource(last, 0, "marian guided alignment (model card)")
        return AlignmentSource(max(0, self.decoder_layers - 2), None, "fallback")

    @property
    def target_vocab_size(self) -> int:
        return self.vocab_size if self.share_encoder_decoder_embeddings else int(self.decoder_vocab_size)

    @classmethod
    def from_marian_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build a config from a MarianConfig-style dict, refusing unsupported features by name."""
        model_type = raw.get("model_type", "marian")
        if model_type != "marian":
            raise CheckpointError(f"config field model_type={model_type!r} is not supported; expected 'marian'")
        for name in _UNSUPPORTED_IF_TRUE:
            if raw.get(name):
                raise CheckpointError(f"config field {name}={raw[name]!r} is not supported by this engine")
        if raw.get("position_embedding_type", "sinusoidal") not in ("sinusoidal", "static"):
            raise CheckpointError(
                f"config field position_embedding_type={raw['position_embedding_type']!r} is not supported; "
                "only static sinusoidal positions are"
            )
        for name in ("encoder_layerdrop", "decoder_layerdrop"):
            if raw.get(name):
                raise CheckpointError(
                    f"config field {name}={raw[name]!r} is not supported (inference has no layerdrop)"
                )
        if "vocab_size" not in raw:
            raise CheckpointError("config field vocab_size is missing")
        eos = raw.get("eos_token_id", 0)
        if isinstance(eos, list):
            if len(eos) != 1:
                raise CheckpointError(f"config field eos_token_id={eos!r}: exactly one end-of-sequence id is supported")
            eos = eos[0]
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        values["eos_token_id"] = eos
        if values.get("pad_token_id") is None:
            raise CheckpointError("config field pad_token_id is missing")
        values.setdefault("decoder_start_token_id", values["pad_token_id"])
        if values.get("decoder_start_token_id") is None:
            values["decoder_start_token_id"] = values["pad_token_id"]
        return cls(**values)

    def to_marian_dict(self) -> dict[str, Any]:
        """The config.json that transformers' MarianMTModel and CTranslate2's converter read."""
        values = asdict(self)
        values.update(
            {
                "model_type": "marian",
                "architectures": ["MarianMTModel"],
                "is_encoder_decoder": True,
                "normalize_before": False,
                "normalize_embedding": False,
                "add_final_layer_norm": False,
                "static_position_embeddings": True,
                "forced_eos_token_id": self.eos_token_id,
                "encoder_layerdrop": 0.0,
                "decoder_layerdrop": 0.0,
                "init_std": 0.02,
                "use_cache": True,
            }
        )
        return values

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"{path.name} is missing in {path.parent}") from None
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{path} is not valid JSON: {error}") from None
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path} must hold a JSON object")
        return cls.from_marian_dict(raw)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_marian_dict(), indent=2) + "\n", encoding="utf-8")
