"""Load and save Marian-format model directories through safetensors only.

Our module names differ slightly from transformers' (layers are not nested under
`model.encoder`), so every tensor goes through `marian_name` and is checked for
shape: a missing, unexpected or misshapen tensor is an error that names it.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from model.config import ModelConfig
from model.errors import CheckpointError
from model.transformer import Transformer
from model.weight_spec import check as check_runtime_spec

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
PICKLE_NAMES = ("pytorch_model.bin", "model.bin", "pytorch_model.pt", "model.pt")

# transformers keys we accept but never need: the static positions are recomputed.
_IGNORED = re.compile(r"^model\.(encoder|decoder)\.embed_positions\.weight$")

_LAYER_RENAMES = (
    (re.compile(r"^encoder_layers\.(\d+)\.feed_forward\.(fc[12])\.(.*)$"), r"model.encoder.layers.\1.\2.\3"),
    (re.compile(r"^decoder_layers\.(\d+)\.feed_forward\.(fc[12])\.(.*)$"), r"model.decoder.layers.\1.\2.\3"),
    (re.compile(r"^encoder_layers\.(.*)$"), r"model.encoder.layers.\1"),
    (re.compile(r"^decoder_layers\.(.*)$"), r"model.decoder.layers.\1"),
)


def marian_name(our_name: str) -> str:
    """Map one of our parameter names to transformers' MarianMTModel name."""
    fixed = {
        "shared.weight": "model.shared.weight",
        "encoder_embed_tokens.weight": "model.encoder.embed_tokens.weight",
        "decoder_embed_tokens.weight": "model.decoder.embed_tokens.weight",
        "lm_head.weight": "lm_head.weight",
        "final_logits_bias": "final_logits_bias",
    }
    if our_name in fixed:
        return fixed[our_name]
    for pattern, replacement in _LAYER_RENAMES:
        if pattern.match(our_name):
            return pattern.sub(replacement, our_name)
    raise KeyError(our_name)


def _our_tensors(model: Transformer) -> dict[str, torch.Tensor]:
    """Parameters (each shared tensor once) plus the final_logits_bias buffer."""
    tensors = dict(model.named_parameters())
    tensors["final_logits_bias"] = model.final_logits_bias
    return tensors


def _read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    path = directory / WEIGHTS_NAME
    if not path.is_file():
        pickles = [name for name in PICKLE_NAMES if (directory / name).is_file()]
        if pickles:
            raise CheckpointError(
                f"{directory} holds only {pickles[0]}, a pickle file, which is never loaded (it can run code). "
                "Convert it once, in a trusted environment: "
                "MarianMTModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)"
            )
        raise CheckpointError(f"{WEIGHTS_NAME} is missing in {directory}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors file: {error}") from None


def load_state(model: Transformer, tensors: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Copy transformers-named tensors into `model`, checking names and shapes."""
    config = model.config
    available = {name: t for name, t in tensors.items() if not _IGNORED.match(name)}
    used: set[str] = set()

    def take(name: str, fallbacks: tuple[str, ...] = ()) -> torch.Tensor:
        for candidate in (name, *fallbacks):
            if candidate in available:
                used.add(candidate)
                return available[candidate]
        raise CheckpointError(f"{source}: tensor {name} is missing")

    if config.share_encoder_decoder_embeddings:
        per_side = [available.get(f"model.{side}.embed_tokens.weight") for side in ("encoder", "decoder")]
        shared = available.get("model.shared.weight")
        if all(t is not None for t in per_side) and not (
            torch.equal(per_side[0], per_side[1]) and (shared is None or torch.equal(shared, per_side[0]))
        ):
            # transformers (tie_word_embeddings=false) can keep three distinct tables; it uses the per-side ones.
            model.untie_embeddings()
            if shared is not None:
                used.add("model.shared.weight")
    tied_fallbacks = {
        "model.shared.weight": ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"),
        "model.encoder.embed_tokens.weight": ("model.shared.weight",),
        "model.decoder.embed_tokens.weight": ("model.shared.weight",),
    }
    with torch.no_grad():
        for our_name, target in _our_tensors(model).items():
            name = marian_name(our_name)
            if name == "final_logits_bias" and name not in available:
                target.zero_()  # transformers treats a missing bias as zeros too
                continue
            tensor = take(name, tied_fallbacks.get(name, ()))
            if name == "final_logits_bias":
                tensor = tensor.reshape(-1)
            if tuple(tensor.shape) != tuple(target.shape):
                raise CheckpointError(
                    f"{source}: tensor {name} has shape {tuple(tensor.shape)}, "
                    f"config.json implies {tuple(target.shape)}"
                )
            target.copy_(tensor.to(target.dtype))
    # Copies of tied tensors that some writers include are tolerated when they are equal.
    tolerated = set()
    if config.share_encoder_decoder_embeddings:
        tolerated |= {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    if config.tie_word_embeddings:
        tolerated.add("lm_head.weight")
    reference = {
        "model.encoder.embed_tokens.weight": model.encoder_embed_tokens.weight,
        "model.decoder.embed_tokens.weight": model.decoder_embed_tokens.weight,
        "lm_head.weight": model.output_weight,
    }
    for name in sorted(tolerated & (set(available) - used)):
        copy = available[name].to(reference[name].dtype)
        if copy.shape != reference[name].shape or not torch.equal(copy, reference[name].detach()):
            raise CheckpointError(f"{source}: tensor {name} should be tied to the embeddings but differs from them")
        used.add(name)
    unexpected = sorted(set(available) - used)
    if unexpected:
        shown = ", ".join(unexpected[:5]) + (" …" if len(unexpected) > 5 else "")
        raise CheckpointError(f"{source}: unexpected tensors {shown}")


def load_model(directory: str | Path) -> Transformer:
    """Read config.json + model.safetensors from a Marian directory into a float32 Transformer (eval mode).

    Weights stored in another precision (fp16 files) are converted to fp32; a decoding step may store them in a
    lower one afterwards (model.runtime's eager.cast_weights, int8 copies in the compiled step).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"model directory {directory} does not exist")
    config = ModelConfig.load(directory / "config.json")
    model = Transformer(config)
    load_state(model, _read_safetensors(directory), source=str(directory / WEIGHTS_NAME))
    check_runtime_spec(model, source=str(directory / WEIGHTS_NAME))  # what the compiled runtime will read
    return model.eval()


def save_model(model: Transformer, directory: str | Path, dtype: torch.dtype | None = None) -> None:
    """Write config.json, generation_config.json and model.safetensors in transformers' layout.

    dtype=torch.float16 halves the file; loading upcasts to the dtype asked for.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for our_name, tensor in _our_tensors(model).items():
        value = tensor.detach().to("cpu")
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        name = marian_name(our_name)
        if name == "final_logits_bias":
            value = value.reshape(1, -1)
        tensors[name] = value.contiguous()
    config = model.config
    save_file(tensors, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
    config.save(directory / "config.json")
    generation = {
        "bad_words_ids": [[config.pad_token_id]],
        "decoder_start_token_id": config.decoder_start_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "forced_eos_token_id": config.eos_token_id,  # our search closes a full budget with </s>; so does this
    }
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    logger.info("saved model to %s", directory)


MODEL_CARD_NAME = "README.md"
MODEL_CARD_MAX_BYTES = 1 << 20  # a card is a page of text; a larger README is not read


def read_model_card(directory: str | Path) -> str | None:
    """The model card (README.md) of a Marian directory, if it has one: what it says of the training recipe
    decides which head alignments are read from (ModelConfig.alignment_source)."""
    card = Path(directory) / MODEL_CARD_NAME
    if not card.is_file() or card.stat().st_size > MODEL_CARD_MAX_BYTES:
        return None
    return card.read_text(encoding="utf-8", errors="replace")
