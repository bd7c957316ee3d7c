"""The weights the compiled runtime reads, declared in one place (as CTranslate2's model specs are): each one's name
in the model's state dict, its shape from the config, and how the runtime lays it out (matmuls fused into one, the
norms it takes). CompiledStep reads its copies through this spec and the checkpoint loader checks every model it
loads against it (model.checkpoint.load_model), so a module tree and a runtime that disagree fail at load, naming the
tensor, not in the middle of a decode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model.errors import CheckpointError

# The decoder's matmuls in the order Model::add_layer takes them (csrc/model.h); fused groups read as one.
DECODER_MATMULS = ("qkv", "self_out", "cross_q", "cross_out", "fc1", "fc2", "cross_kv")
ENCODER_MATMULS = ("qkv", "out", "fc1", "fc2")


@dataclass(frozen=True)
class Matmul:
    """One matmul of the runtime: the linear layers (state-dict prefixes) stacked into it, output rows first."""

    name: str  # e.g. "decoder.0.qkv"
    layers: tuple[str, ...]  # e.g. ("decoder_layers.0.self_attn.q_proj", …): each has .weight (out, in) and .bias
    shapes: tuple[tuple[int, int], ...]  # each layer's weight shape


@dataclass(frozen=True)
class LayerSpec:
    matmuls: tuple[Matmul, ...]
    norms: tuple[str, ...]  # layer-norm prefixes (.weight and .bias, each (d_model,)), in the runtime's order


@dataclass(frozen=True)
class RuntimeSpec:
    encoder: tuple[LayerSpec, ...]
    decoder: tuple[LayerSpec, ...]
    decoder_embedding: tuple[str, tuple[int, int]]
    encoder_embedding: tuple[str, tuple[int, int]]
    output: tuple[str, tuple[int, int]]  # the output projection's weight (tied to the decoder embedding or lm_head)
    output_bias: tuple[str, tuple[int]]
    d_model: int

    def tensors(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the runtime reads and its shape."""
        d = self.d_model
        named: dict[str, tuple[int, ...]] = {}
        for layer in (*self.encoder, *self.decoder):
            for matmul in layer.matmuls:
                for prefix, shape in zip(matmul.layers, matmul.shapes, strict=True):
                    named[f"{prefix}.weight"], named[f"{prefix}.bias"] = shape, (shape[0],)
            for norm in layer.norms:
                named[f"{norm}.weight"] = named[f"{norm}.bias"] = (d,)
        for name, shape in (self.decoder_embedding, self.encoder_embedding, self.output, self.output_bias):
            named[name] = shape
        return named


def runtime_spec(config, tied_output: bool) -> RuntimeSpec:
    """The spec of a model of `config` (model.config.ModelConfig); `tied_output`: the output projection is the
    decoder embedding (no separate lm_head)."""
    d, ffn_encoder, ffn_decoder = config.d_model, config.encoder_ffn_dim, config.decoder_ffn_dim
    square = (d, d)

    def attention(prefix: str, fused: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(f"{prefix}.{name}_proj" for name in fused)

    encoder = []
    for i in range(config.encoder_layers):
        p = f"encoder_layers.{i}"
        encoder.append(LayerSpec(
            (
                Matmul(f"encoder.{i}.qkv", attention(f"{p}.self_attn", ("q", "k", "v")), (square,) * 3),
                Matmul(f"encoder.{i}.out", attention(f"{p}.self_attn", ("out",)), (square,)),
                Matmul(f"encoder.{i}.fc1", (f"{p}.feed_forward.fc1",), ((ffn_encoder, d),)),
                Matmul(f"encoder.{i}.fc2", (f"{p}.feed_forward.fc2",), ((d, ffn_encoder),)),
            ),
            (f"{p}.self_attn_layer_norm", f"{p}.final_layer_norm"),
        ))
    decoder = []
    for i in range(config.decoder_layers):
        p = f"decoder_layers.{i}"
        own, cross = f"{p}.self_attn", f"{p}.encoder_attn"
        decoder.append(LayerSpec(
            (
                Matmul(f"{i}.qkv", attention(own, ("q", "k", "v")), (square,) * 3),
                Matmul(f"{i}.self_out", attention(own, ("out",)), (square,)),
                Matmul(f"{i}.cross_q", attention(cross, ("q",)), (square,)),
                Matmul(f"{i}.cross_out", attention(cross, ("out",)), (square,)),
                Matmul(f"{i}.fc1", (f"{p}.feed_forward.fc1",), ((ffn_decoder, d),)),
                Matmul(f"{i}.fc2", (f"{p}.feed_forward.fc2",), ((d, ffn_decoder),)),
                Matmul(f"{i}.cross_kv", attention(cross, ("k", "v")), (square,) * 2),
            ),
            (f"{p}.self_attn_layer_norm", f"{p}.encoder_attn_layer_norm", f"{p}.final_layer_norm"),
        ))
    target = config.target_vocab_size
    return RuntimeSpec(
        encoder=tuple(encoder),
        decoder=tuple(decoder),
        decoder_embedding=("decoder_embed_tokens.weight", (target, d)),
        encoder_embedding=("encoder_embed_tokens.weight", (config.vocab_size, d)),
        output=("decoder_embed_tokens.weight" if tied_output else "lm_head.weight", (target, d)),
        output_bias=("final_logits_bias", (target,)),
        d_model=d,
    )


def model_spec(model) -> RuntimeSpec:
    return runtime_spec(model.config, model.lm_head is None)


def model_tensors(model) -> dict[str, Tensor]:
    """The model's parameters and final_logits_bias by state-dict name (tied tensors under each of their names)."""
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors["final_logits_bias"] = model.final_logits_bias
    return tensors


def check(model, source: str = "model") -> RuntimeSpec:
    """The model's spec, having checked that the model holds every tensor it names at its shape."""
    spec = model_spec(model)
    tensors = model_tensors(model)
    for name, shape in spec.tensors().items():
        if name not in tensors:
            raise CheckpointError(f"{source}: the runtime reads {name}, which the model does not have")
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(
                f"{source}: the runtime reads {name} as {shape}, the model holds {tuple(tensors[name].shape)}"
            )
    return spec


def fp32(tensor: Tensor) -> Tensor:
    """The runtime's copy of a tensor: detached, float32, contiguous."""
    return tensor.detach().float().contiguous()


def read_matmul(tensors: dict[str, Tensor], matmul: Matmul) -> tuple[Tensor, Tensor]:
    """The matmul's weight and bias, its layers stacked (output rows), as fp32 copies."""
    weight = torch.cat([fp32(tensors[f"{prefix}.weight"]) for prefix in matmul.layers])
    bias = torch.cat([fp32(tensors[f"{prefix}.bias"]) for prefix in matmul.layers])
    return weight, bias


def read_norms(tensors: dict[str, Tensor], layer: LayerSpec) -> list[Tensor]:
    return [fp32(tensors[f"{norm}.{part}"]) for norm in layer.norms for part in ("weight", "bias")]
